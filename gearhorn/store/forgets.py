"""Answered held copies whose records are to go: dropped in batches, and
known on disk within a second (docs/design/held-copies.rst, "A Redis
restart")."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from gearhorn.store.durability import Durability
from gearhorn.store.fsync import ERRORS as BARRIER_ERRORS
from gearhorn.store.heldcopies import HeldCopies
from gearhorn.store.redisconn import REDIS_ERRORS

SYNC_EVERY = 1.0  # seconds between the waits for an fsync covering forgets


class Forgets:
    """Answers (queue, the unique gearmand was given) waiting for their
    records to go. A forget lost with Redis's last second would leave a
    record beside a live connection that never hands it again: once a
    second an fsync is waited for that covers the forgets since (it shares
    a round with the acknowledgements'), and those the connection broke
    under are made again."""

    def __init__(self, store: HeldCopies, durability: Durability,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store, self.durability, self._clock = store, durability, clock
        self._lock = threading.Lock()
        self._answered: list[tuple[str, str]] = []
        # Written, not yet known on disk: (the durability marks before, answers)
        self._unsynced: list[tuple[tuple[int, ...], list[tuple[str, str]]]] = []
        self._next_sync = 0.0

    def add(self, queue: str, handed: str) -> None:
        with self._lock:
            self._answered.append((queue, handed))

    def pending(self) -> list[tuple[str, str]]:
        """Answers read whose records are still there."""
        with self._lock:
            return list(self._answered)

    def flush(self) -> None:
        """Drop the records of the answers so far (one round trip), and once
        a second wait for an fsync covering what was dropped."""
        with self._lock:
            answered, self._answered = self._answered, []
        if answered:
            try:
                marks = self.durability.marks()
                self.store.forget(answered)
            except REDIS_ERRORS:
                self._again(answered)
                raise
            self._unsynced.append((marks, answered))
        if self._unsynced and self._clock() >= self._next_sync:
            self._next_sync = self._clock() + SYNC_EVERY
            unsynced, self._unsynced = self._unsynced, []
            try:
                self.durability.wait(unsynced[0][0])
            except BARRIER_ERRORS as exc:
                if getattr(exc, "lost", False):  # the connection broke: forget them again
                    self._again([a for _, some in unsynced for a in some])
                else:  # wait again later
                    self._unsynced[:0] = unsynced
                raise

    def _again(self, answered: list[tuple[str, str]]) -> None:
        with self._lock:
            self._answered[:0] = answered
