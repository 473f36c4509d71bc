"""The live audit's counts, made where the ledger's rows are made. Pure.

Per subscriber queue and enqueue-time bucket, how many copies were made
(``e``) and how many of those were settled (``s``: answered, dropped); a
settlement whose writer does not know its copy's enqueue time (a held copy
taken over from a dead holder, a drop by the warden, a bridge delivery with
``copies = gearmand``) counts in ``u``, bucketed by when it happened. A
stream subscription's runs of offsets travel as they are (``r``). The audit
(gearhorn/pipeline/balance.py) compares ``e`` with ``s``: a bucket whose
counts agree costs it no row of the ledger. Why: docs/design/audit.rst.

Writers append from several threads (and greenlets): a deque's append is
atomic, so counting takes no lock; :meth:`Counts.take` sums at flush time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import NamedTuple

BUCKET_MS = 5_000
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
    """A writer's counts since its last flush."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: deque[tuple] = deque()  # (kind, bucket, queue, n or span)

    def enqueued(self, queue: str, bucket: int, n: int = 1) -> None:
        self._seen.append((ENQUEUED, bucket, queue, n))

    def settled(self, queue: str, bucket: int | None, now_ms: int) -> None:
        """One copy of ``queue`` settled; ``bucket``: its enqueue bucket, if known."""
        if bucket is None:
            self._seen.append((UNKNOWN, bucket_of(now_ms), queue, 1))
        else:
            self._seen.append((SETTLED, bucket, queue, 1))

    def streamed(self, queue: str, span: str, ts: int) -> None:
        self._seen.append((STREAMED, ts, queue, span))

    def __len__(self) -> int:
        return len(self._seen)

    def take(self) -> list[str]:
        """The lines of what was counted since the last take (summed)."""
        seen = self._seen
        summed: dict[tuple[str, int, str], int] = {}
        runs: list[str] = []
        for _ in range(len(seen)):  # what others append meanwhile stays
            kind, bucket, queue, n = seen.popleft()
            if kind == STREAMED:
                runs.append(Count(kind, bucket, queue, span=n).line())
            else:
                key = (kind, bucket, queue)
                summed[key] = summed.get(key, 0) + n
        return [Count(k, b, q, n).line() for (k, b, q), n in summed.items()] + runs


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
