"""The mechanics of work that repeats: growing pauses, and threads that stop.

Why not tenacity: these loops do not retry one call. They keep a job (the
worker), keep listening (the cache), or keep polling (delays, the bridge's
queues), log once, and must wake at once when told to stop; a pause that
doubles and a stop event cover them in a few lines.
"""

from __future__ import annotations

import logging
import threading
import time

# A loop that lost a server tries again at least this often (seconds), so
# service resumes within a second of the outage's end (a partition healed,
# a server restarted); a try costs one connection attempt.
RECONNECT_CAP = 0.25


class Backoff:
    """A pause that doubles after each failure, up to ``cap``, and starts
    over after a success.

    >>> backoff = Backoff(0.1, cap=0.3)
    >>> [backoff.failed() for _ in range(4)]
    [0.1, 0.2, 0.3, 0.3]
    """

    def __init__(self, first: float = 0.1, cap: float = RECONNECT_CAP) -> None:
        self.first, self.cap = first, cap
        self.pause = first

    def failed(self) -> float:
        """The pause to take now; the next one will be twice as long."""
        pause, self.pause = self.pause, min(self.pause * 2, self.cap)
        return pause

    def succeeded(self) -> None:
        self.pause = self.first


class StoppableThread(threading.Thread):
    """A daemon thread whose loop waits on ``stopping`` (so ``stop()`` wakes
    it at once) instead of sleeping."""

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.stopping = threading.Event()

    def stop(self, timeout: float | None = None) -> None:
        """Ask the loop to end; with ``timeout``, wait that long for it."""
        self.stopping.set()
        if timeout is not None and self.is_alive():
            self.join(timeout)


class Outage:
    """Logs an outage of ``what`` once: a warning when the first call fails,
    one info line when a call succeeds again (with how long it lasted), and
    nothing in between, however often the loop retries.

    >>> import logging
    >>> outage = Outage(logging.getLogger("doctest"), "redis")
    >>> outage.failed(OSError("refused")); outage.failed(OSError("refused"))
    >>> outage.down
    True
    >>> outage.succeeded(); outage.down
    False
    """

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self.logger, self.what = logger, what
        self._since: float | None = None

    @property
    def down(self) -> bool:
        return self._since is not None

    def failed(self, exc: BaseException, detail: str = "") -> None:
        if self._since is None:
            self._since = time.monotonic()
            self.logger.warning("%s unavailable: %s%s (retrying; logged once until it is back)",
                                self.what, exc, detail)
        else:
            self.logger.debug("%s still unavailable: %s%s", self.what, exc, detail)

    def succeeded(self, detail: str = "") -> None:
        if self._since is not None:
            self.logger.info("%s back after %.1fs%s", self.what,
                             time.monotonic() - self._since, detail)
            self._since = None


class Fault:
    """Logs the faults of a loop that must go on (an exception that is a
    bug, not an outage): the traceback once, then nothing while the same
    fault repeats at every pass, and one line when a pass works again. A
    loop that fails every few seconds would otherwise bury the log.

    >>> import logging
    >>> fault = Fault(logging.getLogger("doctest"), "heartbeat")
    >>> for _ in range(3):
    ...     try:
    ...         raise KeyError("x")
    ...     except KeyError as exc:
    ...         fault.failed(exc)
    >>> fault.repeats
    3
    >>> fault.succeeded(); fault.repeats
    0
    """

    def __init__(self, logger: logging.Logger, what: str) -> None:
        self.logger, self.what = logger, what
        self.repeats = 0
        self._last = ""

    def failed(self, exc: BaseException) -> None:
        """Call in the ``except`` block: the traceback is the one handled."""
        seen = f"{type(exc).__name__}: {exc}"
        if seen != self._last:  # a new fault: its traceback, whatever came before
            self._last = seen
            self.logger.exception("%s failed (logged once while it repeats)", self.what)
        else:
            self.logger.debug("%s failed again: %s", self.what, seen)
        self.repeats += 1

    def succeeded(self) -> None:
        if self.repeats:
            self.logger.info("%s works again after %d failed passes", self.what, self.repeats)
            self.repeats, self._last = 0, ""
