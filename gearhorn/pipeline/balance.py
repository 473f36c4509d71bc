"""The live audit's first look: per subscriber queue and enqueue bucket,
copies made against copies settled. Pure.

The writers count (gearhorn/rules/auditcounts.py); :class:`Books` adds up
their counts and, once a bucket is due (its deadline and the lateness past
its end), says which buckets must be looked at closer: those whose copies
are not all settled while their subscriber settled something after them.
Nearly every bucket balances and costs nothing more. A closer look
(gearhorn/pipeline/closer.py) reads the ledger's rows of that span to name
the copies. The rules are the report's (docs/pipeline.rst, "The live
audit"):

- a bucket whose subscriber settled nothing since it ended is *away*: it
  stays open (merged with the queue's other away buckets, so the state is
  per queue, not per copy) until the subscriber settles something newer;
- a settlement of unknown bucket (``u``: a taken-over copy's answer, a
  drop) is credit, given to the queue's oldest short buckets first (copies
  are dropped and handed oldest first);
- credit left over once every bucket of the queue is made up may be a
  copy settled twice: its span is looked at for duplicates.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gearhorn.rules.auditcounts import BUCKET_MS, ENQUEUED, SETTLED, UNKNOWN, Count

LOOK_MISSING, LOOK_DUPLICATES = "missing", "duplicates"


@dataclass(frozen=True)
class Look:
    """A span of ``queue``'s copies to look at closer, from ``first_ms`` to
    ``last_ms`` (enqueue times) for copies not settled, or for copies
    settled twice (``kind``)."""

    kind: str
    queue: str
    first_ms: int
    last_ms: int
    short: int  # copies the counts miss (or settled once too often)


@dataclass
class Book:
    """One queue's open buckets and what its subscriber did lately."""

    buckets: dict[int, list[int]] = field(default_factory=dict)  # bucket -> [made, settled]
    floor: int = 0  # buckets below it are judged: their late counts change nothing
    credit: int = 0  # settlements of unknown bucket not given to a bucket yet
    credit_since: int = 0  # ms of the oldest of them
    last_ms: int = 0  # when the subscriber last settled anything
    # [first bucket, last bucket, made, settled, by rows]: by rows (1), it
    # holds copies a closer look found unsettled, and only another look,
    # not counts, may settle them (a late settlement of a copy reported
    # already in the same bucket would).
    away: list[int] | None = None
    away_since: int = 0  # ms: a settlement after it ends the away span (a closer look)

    def to_list(self) -> list:
        return [[[b, *v] for b, v in self.buckets.items()], self.floor, self.credit,
                self.credit_since, self.last_ms, self.away, self.away_since]

    @classmethod
    def from_list(cls, saved: list) -> Book:
        buckets, *rest = saved
        return cls({b: [m, s] for b, m, s in buckets}, *rest)

    def short(self) -> int:
        """Copies made and not (yet) settled, over every open bucket."""
        open_ = sum(max(0, m - s) for m, s in self.buckets.values())
        return open_ + (max(0, self.away[2] - self.away[3]) if self.away else 0)

    @property
    def away_by_rows(self) -> bool:
        return bool(self.away and len(self.away) > 4 and self.away[4])


@dataclass
class Books:
    """Every queue's :class:`Book`; ``floor``: buckets before the audit's
    first start are not judged (it saw only part of their counts)."""

    deadline_ms: int
    lateness_ms: int
    floor: int = 0
    queues: dict[str, Book] = field(default_factory=dict)
    away: int = 0  # copies found away (counted once a bucket, never a finding)
    settled: int = 0  # copies counted settled

    def add(self, counts: Iterable[Count], at_ms: int) -> None:
        """A counts entry written at ``at_ms`` (its stream id's time)."""
        for count in counts:
            if count.kind not in (ENQUEUED, SETTLED, UNKNOWN):
                continue
            book = self.queues.get(count.queue)
            if book is None:
                book = self.queues[count.queue] = Book(floor=self.floor)
            if count.kind == UNKNOWN:
                if not book.credit:
                    book.credit_since = at_ms
                book.credit += count.n
                book.last_ms = max(book.last_ms, at_ms)
                self.settled += count.n
                continue
            if count.kind == SETTLED:
                book.last_ms = max(book.last_ms, at_ms)
                self.settled += count.n
            if count.bucket < book.floor:
                away = book.away
                if count.kind == SETTLED and away and not book.away_by_rows \
                        and away[0] <= count.bucket <= away[1]:
                    away[3] += count.n  # an away subscriber back at its copies
                continue  # else judged already (a late settlement of an overdue copy)
            made_settled = book.buckets.setdefault(count.bucket, [0, 0])
            made_settled[0 if count.kind == ENQUEUED else 1] += count.n

    def judge(self, clock_ms: int) -> list[Look]:
        """The closer looks the buckets due at ``clock_ms`` need; every due
        bucket is settled, looked at, or away after this."""
        due_before = (clock_ms - self.deadline_ms - self.lateness_ms) // BUCKET_MS
        looks: list[Look] = []
        for queue, book in list(self.queues.items()):
            looks += self._judge_queue(queue, book, due_before, clock_ms)
            if not book.buckets and not book.away and not book.credit \
                    and book.last_ms < clock_ms - 2 * (self.deadline_ms + BUCKET_MS):
                del self.queues[queue]  # nothing open and quiet: state per active queue
        return looks

    def _judge_queue(self, queue: str, book: Book, due_before: int,
                     clock_ms: int) -> list[Look]:
        looks = []
        if book.away:
            looks += self._judge_away(queue, book)
        for bucket in sorted(b for b in book.buckets if b < due_before):
            made, settled = book.buckets.pop(bucket)
            book.floor = max(book.floor, bucket + 1)
            short = made - settled - _use_credit(book, made - settled)
            if short <= 0:
                continue
            if book.last_ms >= bucket * BUCKET_MS:  # settled something since: the rows tell
                looks.append(Look(LOOK_MISSING, queue, bucket * BUCKET_MS,
                                  (bucket + 1) * BUCKET_MS, short))
            else:
                self._keep_away(book, bucket, bucket, short, (bucket + 1) * BUCKET_MS, False)
        if book.credit and not book.buckets and not book.away:
            # Every copy made is settled, and settlements are left: some
            # copy may have been settled twice (handed again, answered twice).
            looks.append(Look(LOOK_DUPLICATES, queue,
                              book.credit_since - self.deadline_ms - BUCKET_MS,
                              clock_ms, book.credit))
            book.credit = 0
        return looks

    def reopen(self, look: Look, away: int, clock_ms: int) -> None:
        """``away`` copies of ``look`` its rows found unsettled while their
        subscriber settled nothing after them: kept open, looked at again
        once it settles something after ``clock_ms``."""
        if away > 0:
            book = self.queues.setdefault(look.queue, Book(floor=self.floor))
            self._keep_away(book, look.first_ms // BUCKET_MS,
                            (look.last_ms - 1) // BUCKET_MS, away, clock_ms, True)

    def _keep_away(self, book: Book, first: int, last: int, short: int, since: int,
                   by_rows: bool) -> None:
        self.away += short
        if book.away:
            first, last = min(first, book.away[0]), max(last, book.away[1])
            short += book.away[2] - book.away[3]
            by_rows = by_rows or book.away_by_rows
        book.away = [first, last, short, 0, int(by_rows)]
        book.away_since = max(book.away_since, since)

    def _judge_away(self, queue: str, book: Book) -> list[Look]:
        first, last, made, settled = book.away[:4]
        if not book.away_by_rows:
            short = made - settled - _use_credit(book, made - settled)
            if short <= 0:
                book.away = None
                return []
            book.away = [first, last, short, 0, 0]
        short = book.away[2]
        if book.last_ms < book.away_since:
            return []  # still away: it settled nothing since
        book.away = None
        return [Look(LOOK_MISSING, queue, first * BUCKET_MS, (last + 1) * BUCKET_MS, short)]

    def open_rows(self) -> int:
        """What the books hold (the state the audit keeps)."""
        return sum(len(b.buckets) + (b.away is not None) for b in self.queues.values())

    def to_json(self) -> dict:
        return {"floor": self.floor, "away": self.away, "settled": self.settled,
                "queues": {q: b.to_list() for q, b in self.queues.items()}}

    @classmethod
    def from_json(cls, saved: dict | None, deadline_ms: int, lateness_ms: int) -> Books:
        saved = saved or {}
        return cls(deadline_ms, lateness_ms, saved.get("floor", 0),
                   {q: Book.from_list(b) for q, b in saved.get("queues", {}).items()},
                   saved.get("away", 0), saved.get("settled", 0))


def _use_credit(book: Book, short: int) -> int:
    """Give ``book``'s credit to ``short`` copies; how much was given."""
    given = min(book.credit, max(0, short))
    book.credit -= given
    return given
