"""Calls that wait (for gearmand, for Redis) made one at a time, in the
order they were asked for, off the caller's greenlet (runs under gevent).

A greenlet each would let a slow first call be overtaken: the dead-letter
queue of a bridge's queue would then hold messages out of the order they
were given up in (gearhorn/stomp/queues/dispatchers.py).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

import gevent

log = logging.getLogger(__name__)


class InOrder:
    """Runs the calls given to :meth:`later` in one greenlet, in order; a
    call that raises is logged, and the ones behind it still run."""

    def __init__(self, what: str) -> None:
        self.what = what  # for the log
        self._calls: deque[tuple[Callable[[], None], str]] = deque()
        self._running = False

    def later(self, call: Callable[[], None], about: str = "") -> None:
        """Run ``call`` after those before it (``about``: what the log names
        should it raise)."""
        self._calls.append((call, about))
        if not self._running:
            self._running = True
            gevent.spawn(self._run)

    def _run(self) -> None:
        try:
            while self._calls:
                call, about = self._calls.popleft()
                try:
                    call()
                except Exception:  # noqa: BLE001 - a bug; the calls behind it still go
                    log.exception("%s %s", self.what, about)
        finally:
            self._running = False
