"""Held copies handed in a while, not at once (gearhorn/store/holding.py):
gearmand refused them or lost them unanswered, a bridge gave them back, or
they were written and not handed. Each is listed by (queue, key, generation
mark) and handed only while still its holder's at that generation."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from gearhorn.store.durability import Durability
from gearhorn.store.fsync import ERRORS as BARRIER_ERRORS
from gearhorn.store.heldcopies import HeldCopies, HeldCopy
from gearhorn.store.lease import HolderLease
from gearhorn.store.redisconn import REDIS_ERRORS

log = logging.getLogger(__name__)

Pending = tuple[str, str, int]  # a copy's queue, key and generation mark (modulo WRAP)
AGAIN_EVERY = 1.0  # seconds before copies refused (or not handed) are handed (again)
BATCH = 1000  # copies written and handed at a time


class Holding(Protocol):
    """What this uses of its holder."""

    store: HeldCopies
    lease: HolderLease
    durability: Durability

    @property
    def holder_id(self) -> str: ...

    def hand(self, held: Sequence[HeldCopy], precedence: str | None = None) -> None: ...


class Later:
    """One holder's copies to hand in a while."""

    def __init__(self, holding: Holding, clock: Callable[[], float] = time.monotonic) -> None:
        self.holding = holding
        self._clock = clock
        self._lock = threading.Lock()
        self._again: list[Pending] = []  # refused or vanished: the next generation
        self._given_back: list[Pending] = []  # in order: the next generation, at once
        # Written but not handed (a write that failed half-way, a lease not
        # fresh), by (queue, key): at that generation, unless handed since
        self._unhanded: dict[tuple[str, str], int] = {}
        self._said = -60.0  # when the last warning of copies handed again went
        self._next = 0.0  # when the copies waiting are handed next

    def again(self, pending: Iterable[Pending]) -> None:
        with self._lock:
            self._again += pending

    def given_back(self, pending: Pending) -> None:
        with self._lock:
            self._given_back.append(pending)

    def unhanded(self, held: Sequence[HeldCopy]) -> None:
        with self._lock:
            self._unhanded.update({(q, k): m for q, k, m in (c.pending() for c in held)})

    def handed(self, held: Sequence[HeldCopy]) -> None:
        """``held`` went to gearmand (a retried fanout handed them, say): not
        unhanded any more. Handed again later, one its receiver answered
        already would be a new job."""
        if self._unhanded:
            with self._lock:
                for copy in held:
                    self._unhanded.pop((copy.queue, copy.key), None)

    def clear(self) -> None:
        """Fenced: they are another holder's now."""
        with self._lock:
            self._again.clear()
            self._given_back.clear()
            self._unhanded.clear()

    def hand_given_back(self) -> None:
        """The copies bridges gave back, as their next generation, ahead of
        newer ones (high precedence) and in the order given back."""
        self._next_generation(self._given_back, precedence="high")

    def hand_due(self) -> None:
        """Once a while, the copies written but not handed, at their
        generation; those gearmand refused (its queue full: ``maxqueue``) or
        lost unanswered, as their next: the records wait meanwhile."""
        now = self._clock()
        if now < self._next or not self.holding.lease.fresh():
            return
        self._next = now + AGAIN_EVERY
        self._hand_unhanded()
        moved = self._next_generation(self._again)
        if moved:  # said once a minute while a queue stays full, not every second
            loud = now - self._said >= 60
            self._said = now if loud else self._said
            log.log(logging.WARNING if loud else logging.DEBUG,
                    "%d held copies handed again (refused by gearmand: a full queue?, "
                    "or vanished unanswered)", len(moved))

    def hand_next(self, copies: Sequence[HeldCopy], name: str,
                  precedence: str | None = None) -> list[HeldCopy]:
        """``copies`` (``name``'s) as their next generation, written and on
        disk before they go to gearmand."""
        holding, moved = self.holding, []
        for at in range(0, len(copies), BATCH):
            marks = holding.durability.marks()
            written = holding.store.hand_again(copies[at:at + BATCH], name)
            holding.durability.wait(marks)
            holding.hand(written, precedence)
            moved += written
        return moved

    def _hand_unhanded(self) -> None:
        """Those still unhanded, at the generation written: a fanout retried
        after its write failed hands what it writes itself, and leaves the
        records written before to their holder; a second generation of
        those would be a second job (CI, 2026-12-07: 64 per subscriber)."""
        with self._lock:
            wanted = [(q, k, m) for (q, k), m in self._unhanded.items()]
            self._unhanded.clear()
        if not wanted:
            return
        try:
            unhanded = self.holding.store.still_held(wanted, self.holding.holder_id)
        except REDIS_ERRORS:
            with self._lock:
                for q, k, m in wanted:
                    self._unhanded.setdefault((q, k), m)
            raise
        if unhanded:
            log.info("%d held copies written but not handed (their write failed half-way, or "
                     "the lease was not fresh): handed now", len(unhanded))
            self.holding.hand(unhanded)

    def _next_generation(self, pending: list[Pending],
                         precedence: str | None = None) -> list[HeldCopy]:
        """Those listed in ``pending``, emptied, as their next generation;
        on an error they stay listed."""
        wanted = self._take(pending)
        if not wanted:
            return []
        name = self.holding.holder_id
        try:
            return self.hand_next(self.holding.store.still_held(wanted, name), name, precedence)
        except (*REDIS_ERRORS, *BARRIER_ERRORS):
            self._put_back(pending, wanted)
            raise

    def _take(self, pending: list[Pending]) -> list[Pending]:
        with self._lock:
            wanted = pending[:]
            pending.clear()
        return wanted

    def _put_back(self, pending: list[Pending], wanted: list[Pending]) -> None:
        with self._lock:
            pending[:0] = wanted
