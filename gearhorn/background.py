"""The mechanics of work that repeats: growing pauses, and threads that stop.

Why not tenacity: these loops do not retry one call. They keep a job (the
worker), keep listening (the cache), or keep polling (delays, the bridge's
queues), log once, and must wake at once when told to stop; a pause that
doubles and a stop event cover them in a few lines.
"""

from __future__ import annotations

import threading


class Backoff:
    """A pause that doubles after each failure, up to ``cap``, and starts
    over after a success.

    >>> backoff = Backoff(0.1, cap=0.3)
    >>> [backoff.failed() for _ in range(4)]
    [0.1, 0.2, 0.3, 0.3]
    """

    def __init__(self, first: float = 0.1, cap: float = 5.0) -> None:
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
