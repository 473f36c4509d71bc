"""How many copies each subscriber queue holds, as the warden reads it.

gearmand's admin ``status`` says it for every function gearmand knows: one
line each, seconds at a million (docs/scaling.rst). With ``copies = held``
gearhorn's own records say it for just the queues asked (one HLEN each of
``<p>copies:{Q}``, exact whether gearmand is up or restarted empty), so
status is read only when the warden needs what only gearmand knows: which
server a copy waits on (to take it), running jobs and consumers, and jobs
that others sent straight into gearmand (at least every ``status_every``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from time import monotonic

from gearhorn.store.heldcopies import HeldCopies
from gearhorn.worker.reaper import Load

# Reading gearmand's status takes at most this share of the warden's time.
STATUS_SHARE = 0.25


class QueueCounts:
    """The counts of one round, and when gearmand's status was read."""

    def __init__(self, status: Callable[[], dict[str, Load]], held: HeldCopies | None,
                 status_every: float) -> None:
        self._read_status = status
        self.held = held
        self.status_every = status_every
        self.status_at = -math.inf  # when gearmand's status was read last
        self.status_took = 0.0  # and how long that read took (s)
        self.from_records = False  # this round's counts are the records' alone

    def spaced(self, now: float) -> bool:
        """Whether gearmand's status was read too lately to be read again."""
        took = self.status_took
        return since(self.status_at, now) < took / STATUS_SHARE - took

    def read(self, queues: list[str], now: float) -> dict[str, Load]:
        """The records' count of each of ``queues`` (copies = held) until
        gearmand's status is due, else that status, each queue's count at
        least its records' (copies not yet handed to a gearmand that
        restarted)."""
        records = self.held.counts(queues) if self.held is not None else {}
        self.from_records = self.held is not None and (
            since(self.status_at, now) < self.status_every or self.spaced(now))
        if self.from_records:
            return {queue: Load(count) for queue, count in records.items() if count}
        return self.status(records, now)

    def status(self, records: dict[str, int], now: float) -> dict[str, Load]:
        """gearmand's counts, each at least ``records``'s."""
        started = monotonic()
        loads = self._read_status()
        self.status_took = monotonic() - started
        self.status_at, self.from_records = now, False
        for queue, count in records.items():
            load = loads.setdefault(queue, Load())
            load.depth = max(load.depth, count)
        return loads

    def from_gearmand(self, loads: dict[str, Load], now: float) -> None:
        """Replace this round's counts from the records with gearmand's (a
        copy must be taken, or consumers looked for)."""
        counted = {queue: load.depth for queue, load in loads.items()}
        loads.clear()
        loads.update(self.status(counted, now))


def since(then: float, now: float) -> float:
    """Seconds from ``then`` to ``now``; a wall clock set back since counts
    as long ago (else the rounds would wait for it)."""
    return now - then if now >= then else math.inf
