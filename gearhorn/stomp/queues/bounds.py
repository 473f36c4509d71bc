"""Bounded ``/queue/`` destinations, the bridge's side (gearhorn/worker/warden.py
keeps them within their limits, as it does subscriber queues).

A SUBSCRIBE to ``/queue/Q`` with RabbitMQ's ``x-max-length`` and the rest
bounds ``Q`` (``<p>subscriptions`` lists it, with no topic). The bridge then
tallies what it sends to ``Q`` (so ages and sizes are known), and refuses a
SEND while a ``reject-publish`` queue is full. Whether a queue is bounded is
asked of Redis at most once a second per queue.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from gearhorn import gearman
from gearhorn.errors import GearhornError
from gearhorn.rules.limits import Limits
from gearhorn.store.pressure import Pressure
from gearhorn.store.redisconn import REDIS_ERRORS
from gearhorn.store.registry import Registry
from gearhorn.store.tally import TallyWriter

RECHECK_SECONDS = 1.0


class QueueFull(GearhornError):
    """A SEND to a ``reject-publish`` queue at its limit; the message says which."""


class QueueBounds:
    def __init__(self, registry: Registry, clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = registry
        self.tally = TallyWriter(registry.redis, registry.keys)
        self.pressure = Pressure(registry.redis, registry.keys)
        self.clock = clock
        self._bounded: dict[str, tuple[bool, float]] = {}  # queue -> (bounded, asked at)

    def limit(self, function: str, limits: Limits) -> None:
        """``function`` is bounded by ``limits`` from now on (a SUBSCRIBE's x-* headers)."""
        self.registry.bound_queue(function, limits)
        self._bounded[function] = (True, self.clock())

    def admit(self, function: str) -> None:
        """Raise QueueFull while ``function`` is a full reject-publish queue."""
        if self._is_bounded(function) and function in self.pressure.current()[0]:
            raise QueueFull(f"queue {function} is full (reject-publish): the message was "
                            "not queued")

    def sent(self, copies: Sequence[gearman.Copy]) -> None:
        """Tally what gearmand accepted for bounded queues (written by :meth:`flush`)."""
        self.tally.add(c for c in copies if self._is_bounded(c.function))

    def flush(self) -> None:
        self.tally.flush()

    def _is_bounded(self, function: str) -> bool:
        known = self._bounded.get(function)
        now = self.clock()
        if known is None or now - known[1] >= RECHECK_SECONDS:
            try:
                bounded = bool(self.registry.redis.hexists(self.registry.keys.subscriptions,
                                                           function))
            except REDIS_ERRORS:
                return known[0] if known else False
            if len(self._bounded) > 10_000:
                self._bounded.clear()
            known = self._bounded[function] = (bounded, now)
        return known[0]
