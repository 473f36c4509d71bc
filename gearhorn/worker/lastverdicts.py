"""What the warden holding the lease remembers of each queue between
rounds: its counts when judged and its verdict's parts, so that a queue
whose counts have not moved is not judged again, and its tally sums, so
that they are read only when it was tallied since (docs/design/workers.rst,
"Worker pool"). Stale once another process may have judged: forgotten
whenever the lease is taken anew."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gearhorn.worker.reaper import Load
from gearhorn.worker.round_report import Backlog

NO_LOAD = Load()


@dataclass(frozen=True, slots=True)
class LastVerdict:
    """A queue as the warden last judged it."""

    counts: tuple[int, int, int, int]  # gearmand's depth, running, workers; copies tallied
    sums: tuple[int, int]  # its tally's copies and bytes, as last read or left
    due: float  # ms: judged again from then on whatever moved (-inf: next round)
    full: bool = False
    backlog: Backlog | None = None
    at: float = 0.0  # when


class LastVerdicts:
    def __init__(self) -> None:
        self.forget()

    def forget(self) -> None:
        self.last: dict[str, LastVerdict] = {}  # each queue judged lately
        self.next_due = math.inf  # the earliest of their .due
        self.unread: set[str] = set()  # found holding copies: sums read next round
        self.unjudged: set[str] = set()  # tallied, within their limits: judged with status
        self.cursor = 0  # where the next round goes on in <p>watched
        self.swept = False  # a whole pass over <p>watched made

    def knows(self, queue: str) -> bool:
        return queue in self.last

    def sort(self, read: dict[str, tuple[int, int]], loads: dict[str, Load],
             always: set[str], now: float
             ) -> tuple[dict[str, tuple[int, int]], dict[str, LastVerdict]]:
        """Every queue that may need judging with its tally sums (``read``
        this round, or as remembered), and the steady ones among them:
        judged before, none of its copies coming due, and the same copies
        queued, running and tallied since, with the same consumers: the
        same verdict again, so not judged again. A wide topic whose
        subscribers do not read costs a round its counts, not a judgement
        each. A queue gearmand says holds copies that this process never
        judged gets its sums read before the next round's status."""
        sums = dict(read)
        steady = {}
        now_ms = now * 1000
        for queue, seen in self.last.items():
            count = sums.setdefault(queue, seen.sums)[0]
            load = loads.get(queue, NO_LOAD)
            if (queue not in always and now_ms < seen.due
                    and seen.counts == (load.depth, load.running, load.workers, count)):
                steady[queue] = seen
        self.unread = {q for q, load in loads.items() if load.depth and q not in sums}
        self.last = dict(steady)  # the judged join them (judged, others)
        return sums, steady

    def judged(self, last: dict[str, LastVerdict]) -> None:
        self.last.update(last)

    def others(self, sums: dict[str, tuple[int, int]], steady: dict[str, LastVerdict],
               subscriptions: dict, loads: dict[str, Load], now: float) -> None:
        """Queues looked at that are no subscriber's (another Gearman
        function, a stream reader): not looked up again until they move.
        Then the earliest time a queue must be judged again."""
        for queue, counts in sums.items():
            if queue in subscriptions or queue in steady:
                continue
            load = loads.get(queue, NO_LOAD)
            if load.depth or load.running or counts[0]:
                self.last[queue] = LastVerdict((load.depth, load.running, load.workers, counts[0]),
                                        counts, math.inf, at=now)
        self.next_due = min((seen.due for seen in self.last.values()), default=math.inf)
