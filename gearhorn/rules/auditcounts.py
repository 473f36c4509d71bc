"""The live audit's counts, made where the ledger's rows are made. Pure.

Per subscriber queue and enqueue-time bucket, how many copies were made
(``e``) and how many of those were settled (``s``: answered, dropped); a
settlement whose writer does not know its copy's enqueue time (a held copy
taken over from a dead holder, a drop by the warden, a bridge delivery with
``copies = gearmand``) counts in ``u``, bucketed by when it happened. A
stream subscription's runs of offsets travel as they are (``r``). The audit
(gearhorn/pipeline/balance.py) compares ``e`` with ``s``: a bucket whose
counts agree costs it no row of the ledger. Why: docs/design/audit.rst.

Writers count from several threads (and greenlets) into dicts under a lock
taken once a call; the ledger writes what they counted at most once a
second (COUNTS_EVERY): at 1,000 subscribers a line per queue and flush
cost the pool more than the counting (bench/durable.py, 12-07).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import NamedTuple

BUCKET_MS = 5_000
COUNTS_EVERY = 1.0  # seconds between two counts entries of a writer
COUNTS = "counts"  # a counts entry's "e" (its own stream: Keys.audit_counts)

ENQUEUED, SETTLED, UNKNOWN, STREAMED = "e", "s", "u", "r"


def bucket_of(ms: int) -> int:
    """The bucket ``ms`` (epoch milliseconds) falls in."""
    return ms // BUCKET_MS


class Count(NamedTuple):
    """One line of a counts entry: ``kind`` of ``n`` copies of ``queue`` in
    ``bucket``; for ``r``, ``bucket`` is the run's time and ``span`` its text."""

    kind: str
    bucket: int
    queue: str
    n: int = 0
    span: str = ""

    def line(self) -> str:
        return f"{self.kind}\t{self.bucket}\t{self.queue}\t{self.span or self.n}"


class Counts:
    """A writer's counts since its last :meth:`take`, summed as they come:
    per kind, bucket and queue (a dict each, under one lock a call: a keep
    of many copies takes it once)."""

    __slots__ = ("_lock", "_made", "_settled", "_unknown", "_runs")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._made: dict[int, dict[str, int]] = {}  # bucket -> queue -> copies
        self._settled: dict[int, dict[str, int]] = {}
        self._unknown: dict[int, dict[str, int]] = {}
        self._runs: list[str] = []  # STREAMED lines

    def enqueued(self, queue: str, bucket: int, n: int = 1) -> None:
        self.made_many((queue,) * n, bucket)

    def made_many(self, queues: Iterable[str], bucket: int) -> None:
        """A copy made in each of ``queues`` (one per copy), in ``bucket``."""
        with self._lock:
            made = self._made.get(bucket)
            if made is None:
                made = self._made[bucket] = {}
            for queue in queues:
                made[queue] = made.get(queue, 0) + 1

    def settled(self, queue: str, bucket: int | None, now_ms: int) -> None:
        """One copy of ``queue`` settled; ``bucket``: its enqueue bucket, if known."""
        into, bucket = ((self._unknown, bucket_of(now_ms)) if bucket is None
                        else (self._settled, bucket))
        with self._lock:
            per_queue = into.get(bucket)
            if per_queue is None:
                per_queue = into[bucket] = {}
            per_queue[queue] = per_queue.get(queue, 0) + 1

    def streamed(self, queue: str, span: str, ts: int) -> None:
        line = Count(STREAMED, ts, queue, span=span).line()
        with self._lock:
            self._runs.append(line)

    def __len__(self) -> int:
        return len(self._made) + len(self._settled) + len(self._unknown) + len(self._runs)

    def take(self) -> list[str]:
        """The lines of what was counted since the last take."""
        with self._lock:
            taken = ((ENQUEUED, self._made), (SETTLED, self._settled), (UNKNOWN, self._unknown))
            runs = self._runs
            self._made, self._settled, self._unknown, self._runs = {}, {}, {}, []
        return [f"{kind}\t{bucket}\t{queue}\t{n}" for kind, buckets in taken
                for bucket, per_queue in buckets.items() for queue, n in per_queue.items()] + runs


def parse(text: str) -> Iterator[Count]:
    """A counts entry's lines; a malformed one is skipped (never fatal)."""
    for line in text.split("\n"):
        parts = line.split("\t")
        if len(parts) != 4 or parts[0] not in (ENQUEUED, SETTLED, UNKNOWN, STREAMED):
            continue
        try:
            bucket = int(parts[1])
            if parts[0] == STREAMED:
                yield Count(STREAMED, bucket, parts[2], span=parts[3])
            else:
                yield Count(parts[0], bucket, parts[2], int(parts[3]))
        except ValueError:
            continue


def entry(lines: Iterable[str], source: str) -> dict[str, str]:
    """A counts stream entry."""
    fields = {"e": COUNTS, "lines": "\n".join(lines)}
    if source:
        fields["src"] = source
    return fields
