"""The registry's set of Gearman function names with a ``-`` that gearhorn
submitted background jobs to: gearmand 1.1.20's Redis queue replays such a
job under another name after a restart (gearhorn/worker/replay.py mends it)."""

from __future__ import annotations

from collections.abc import Iterable

import redis

from gearhorn.store.keys import Keys


class DashedFunctions:
    """The registry's set of function names with a ``-`` that gearhorn
    submitted background jobs to; each process adds a name once."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client = client
        self.key = keys.dashed_functions
        self._known: set[str] = set()

    def record(self, functions: Iterable[str]) -> None:
        """Add the new names among ``functions`` before any job is submitted
        to them (called by :class:`gearman.Client` for background jobs)."""
        new = {f for f in functions if "-" in f and f not in self._known}
        if new:
            self.client.sadd(self.key, *new)
            self._known |= new

    def load(self) -> set[bytes]:
        return set(self.client.smembers(self.key))
