"""What the live audit reads from Redis: the writers' counts streams
(gearhorn/rules/auditcounts.py), and, for a closer look, the ledger's rows
of a few queues from a time on."""

from __future__ import annotations

from collections.abc import Iterator

import redis

from gearhorn.rules import auditcounts
from gearhorn.rules.auditcounts import Count
from gearhorn.store.keys import Keys
from gearhorn.store.ledgerentries import QueuePicker
from gearhorn.store.redisutil import text

PAGE = 1000  # entries read at once from a stream


def stream_ms(stream_id: str) -> int:
    return int(stream_id.partition("-")[0])


class CountsFeed:
    """Follows the counts streams of every ledger shard from ``positions``
    (stream key -> the last id read)."""

    def __init__(self, client: redis.Redis, keys: Keys, shards: int,
                 positions: dict[str, str]) -> None:
        self.redis = client
        self.streams = [keys.audit_counts(shard) for shard in range(shards)]
        self.positions = dict(positions)

    def start_at_heads(self) -> None:
        """A first start: what is written from now on."""
        for stream in self.streams:
            last = self.redis.xrevrange(stream, count=1)
            self.positions[stream] = text(last[0][0]) if last else "0-0"

    def read(self) -> tuple[list[tuple[int, list[Count]]], int | None]:
        """The entries after the positions, (time written, counts) each, and
        None when every stream was read to its end, else the time up to
        which all were read (the oldest of the last entries read from a
        stream with more)."""
        read, upto, moved = [], None, {}
        for stream in self.streams:
            after = self.positions.get(stream, "0-0")
            page = self.redis.xrange(stream, min="(" + after, max="+", count=PAGE)
            for stream_id, fields in page:
                lines = next((text(v) for k, v in fields.items() if text(k) == "lines"), "")
                read.append((stream_ms(text(stream_id)), list(auditcounts.parse(lines))))
            if page:
                moved[stream] = text(page[-1][0])
            if len(page) >= PAGE:
                last = stream_ms(text(page[-1][0]))
                upto = last if upto is None else min(upto, last)
        self.positions.update(moved)  # all streams read, or none moves on
        return read, upto


def ledger_rows(client: redis.Redis, keys: Keys, shards: int, from_ms: int,
                queues: set[str]) -> Iterator[dict]:
    """The rows of ``queues`` in the ledger's entries written from
    ``from_ms`` on (only those lines are parsed: ledgerentries.QueuePicker)."""
    picker = QueuePicker(queues)
    for shard in range(shards):
        start = f"{max(0, from_ms)}-0"
        while True:
            page = client.xrange(keys.ledger(shard), min=start, max="+", count=PAGE)
            yield from picker.rows((text(stream_id), {text(k): text(v) for k, v in raw.items()})
                                   for stream_id, raw in page)
            if len(page) < PAGE:
                break
            start = "(" + text(page[-1][0])
