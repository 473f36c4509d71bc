"""A job as the worker's services see it, what running one gives, and the
error that means "not now, try again" (Redis or gearmand away)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from gearhorn import gearman
from gearhorn.errors import BadRequest, GearhornError
from gearhorn.store.redisconn import REDIS_ERRORS

SUBSCRIBE = "subscribe_fanout"
SUBSCRIBE_ALIAS = "register_fanout_subscriber"
UNSUBSCRIBE = "unsubscribe_fanout"
FANOUT = "fanout"
PRESENCE = "topic_presence"
HISTORY = "topic_history"
FUNCTIONS = (SUBSCRIBE, SUBSCRIBE_ALIAS, UNSUBSCRIBE, FANOUT, PRESENCE, HISTORY)


class ServiceUnavailable(GearhornError):
    """Redis or gearmand cannot take the request now; the message says which."""


@dataclass(frozen=True, slots=True)
class Job:
    """A job as the service sees it: ``unique`` is its Gearman unique key,
    ``received`` when it came (``time.monotonic()``, for the latency metric)."""

    function: str
    data: bytes
    unique: str = ""
    received: float | None = None


Answer = bytes | BadRequest  # a job's result, or why it was refused


@contextlib.contextmanager
def unavailable_when_servers_fail() -> Iterator[None]:
    """Redis's and gearmand's errors as :class:`ServiceUnavailable`."""
    try:
        yield
    except REDIS_ERRORS as exc:
        raise ServiceUnavailable(f"registry unavailable (redis: {exc})") from None
    except gearman.GearmanError as exc:
        raise ServiceUnavailable(f"gearmand unavailable: {exc}") from None
