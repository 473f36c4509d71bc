"""How a fanout's copies go, and what its producer hears back: priority,
delay, the tries of a foreground copy, and gathering the receivers'
answers. Pure: parsing and validation of a ``fanout`` job's options
(gearhorn/rules/messages.py parses the rest)."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from datetime import datetime

from gearhorn.errors import BadRequest
from gearhorn.rules.naming import shorten

PRIORITIES = ("high", "normal", "low")
# How far ahead a message may be scheduled (a typo of a year is not a delay).
MAX_DELAY_SECONDS = 366 * 86_400


def parse_priority(value: object) -> str:
    if value not in PRIORITIES:
        raise BadRequest(f"invalid priority {shorten(str(value))}: use high, normal or low")
    return str(value)


def parse_schedule(deliver_at: object, delay: object, now: float | None = None) -> float | None:
    """``deliver_at`` (epoch seconds or RFC 3339) or ``delay`` (seconds from
    now) -> the epoch second of delivery, or None for "now"."""
    if deliver_at is not None and delay is not None:
        raise BadRequest("give deliver_at or delay, not both")
    if deliver_at is None and delay is None:
        return None
    now = time.time() if now is None else now
    if delay is not None:
        due = now + _number("delay", delay)
    elif isinstance(deliver_at, str):
        due = _rfc3339(deliver_at)
    else:
        due = _number("deliver_at", deliver_at)
    if due > now + MAX_DELAY_SECONDS:
        raise BadRequest(f"delivery is more than {MAX_DELAY_SECONDS // 86_400} days ahead")
    return due if due > now else None


def _number(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) \
            or not math.isfinite(value) or value < 0:
        raise BadRequest(f"{key} must be a number of seconds (0 or more), not "
                         f"{shorten(json.dumps(value))}")
    return float(value)


def _rfc3339(text: str) -> float:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise BadRequest(f"invalid deliver_at {shorten(text)}: use epoch seconds or RFC 3339 "
                         "with a time zone (2026-11-22T21:00:00Z)")
    return moment.timestamp()


# A foreground copy tried at most this often, whatever a fanout asks.
MOST_ATTEMPTS = 10


@dataclass(frozen=True, slots=True)
class Answering:
    """What a foreground fanout's producer hears: ``attempts``, the tries of
    a copy whose receiver failed (None: the ``fanout_attempts`` setting);
    ``gather``, each receiver's answer in the result."""

    attempts: int | None = None
    gather: bool = False


def parse_answering(obj: dict, background: bool, messages: int) -> Answering:
    """``"attempts": N`` (1 to MOST_ATTEMPTS) and ``"gather": true``, which
    only a foreground fanout of one message can have."""
    attempts, gather = obj.get("attempts"), obj.get("gather", False)
    if not isinstance(gather, bool):
        raise BadRequest(f"gather must be true or false, not {shorten(json.dumps(gather))}")
    if attempts is not None and (isinstance(attempts, bool) or not isinstance(attempts, int)
                                 or not 1 <= attempts <= MOST_ATTEMPTS):
        raise BadRequest(f"attempts must be a whole number from 1 to {MOST_ATTEMPTS}, not "
                         f"{shorten(json.dumps(attempts))}")
    for name, given in (("gather", gather), ("attempts", attempts is not None)):
        if given and background:
            raise BadRequest(f"{name} is for a foreground fanout: a background one has no "
                             "answers to wait for")
    if gather and messages > 1:
        raise BadRequest("gather takes one message: not with payloads")
    return Answering(attempts, gather)

