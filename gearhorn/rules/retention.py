"""What a bounded queue must give up now (pure: numbers in, a verdict out).

Why it is shaped so: docs/design/notes.rst, "gearhorn/rules/retention.py".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gearhorn.rules.limits import DROP_HEAD, MAXBYTES, MAXLEN, Limits


@dataclass(frozen=True, slots=True)
class TallyEntry:
    """``count`` copies of ``size`` bytes in all, queued at ``at_ms``."""

    at_ms: int
    count: int
    size: int

    def encode(self) -> str:
        return f"{self.at_ms} {self.count} {self.size}"

    @classmethod
    def decode(cls, raw: str | bytes) -> TallyEntry:
        at, count, size = (int(part) for part in raw.split())
        return cls(at, count, size)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the warden does to one queue this round."""

    consumed_entries: int  # tally entries at the head to forget
    expire: int  # copies to take from the head as expired
    drop: int  # then copies to take from the head as over a limit
    drop_reason: str  # MAXLEN or MAXBYTES
    full: bool  # reject-publish: no new copy until there is room
    depth: int
    size: int  # payload bytes queued (estimated for a partly consumed entry)
    oldest_ms: int | None  # when the oldest queued copy was queued
    # reject-publish: the copies and payload bytes it may still take (None:
    # that kind is not limited; both None for drop-head queues)
    room: int | None = None
    room_bytes: int | None = None

    @property
    def takes(self) -> int:
        return self.expire + self.drop


@dataclass(frozen=True, slots=True)
class _Queued:
    """A tally entry's copies still queued: ``count`` of them, ``size`` bytes."""

    at_ms: int
    count: int
    size: int


@dataclass(frozen=True, slots=True)
class Tallied:
    """A queue's tally as the warden read it: every entry's ``count`` and
    ``size`` summed, and the oldest entries (``window``; the rest is read
    in later rounds if needed)."""

    count: int
    size: int
    window: Sequence[TallyEntry]


def _portions(tallied: Tallied, depth: int) -> tuple[int, int, list[_Queued]]:
    """Entries wholly consumed, bytes consumed, and the queued copies the window
    shows (oldest first; unknown ones first, as old as the oldest entry)."""
    skip = max(0, tallied.count - depth)
    consumed_entries = consumed_size = 0
    queued: list[_Queued] = []
    for entry in tallied.window:
        take = min(skip, entry.count)
        skip -= take
        if take == entry.count:
            consumed_entries += 1
            consumed_size += entry.size
            continue
        left = entry.count - take
        queued.append(_Queued(entry.at_ms, left, _part(entry.size, entry.count, left)))
        consumed_size += entry.size - queued[-1].size
    unknown = max(0, depth - tallied.count)
    if unknown:  # the newest: accepted, not tallied yet; they never expire early
        mean = tallied.size // tallied.count if tallied.count else 0
        queued.append(_Queued(-1, unknown, mean * unknown))
    return consumed_entries, consumed_size, queued


def _part(size: int, count: int, part: int) -> int:
    return size if part == count else size * part // max(count, 1)


def judge(tallied: Tallied, depth: int, running: int, limits: Limits, now_ms: int) -> Verdict:
    """The verdict for a queue holding ``depth`` jobs, ``running`` of them
    handed to a consumer (those are the oldest, and cannot be taken back)."""
    consumed, consumed_size, queued = _portions(tallied, depth)
    size = max(0, tallied.size - consumed_size + sum(q.size for q in queued[-1:]
                                                      if depth > tallied.count))
    expire = 0
    if limits.message_ttl:
        deadline = now_ms - int(limits.message_ttl * 1000)
        for q in queued:
            if not 0 <= q.at_ms <= deadline:
                break
            expire += q.count
    length = depth - expire
    left_size = size - _head_size(queued, expire)
    drop, reason, full = 0, MAXLEN, False
    if limits.overflow == DROP_HEAD:
        if limits.max_length and length > limits.max_length:
            drop = length - limits.max_length
        if limits.max_bytes and left_size > limits.max_bytes:
            by_bytes = _drop_for_bytes(queued, expire, left_size, limits.max_bytes)
            if by_bytes > drop:
                drop, reason = by_bytes, MAXBYTES
    else:
        full = bool((limits.max_length and length >= limits.max_length)
                    or (limits.max_bytes and left_size >= limits.max_bytes))
    waiting = max(0, depth - running)
    expire = max(0, min(expire - running, waiting))
    drop = max(0, min(drop, waiting - expire))
    oldest = queued[0].at_ms if queued and queued[0].at_ms >= 0 else None
    room = room_bytes = None
    if limits.overflow != DROP_HEAD:
        room = limits.max_length - length if limits.max_length else 1 << 60  # bytes only
        room_bytes = limits.max_bytes - left_size if limits.max_bytes else None
    return Verdict(consumed, expire, drop, reason, full, depth, size, oldest, room, room_bytes)



def _head_size(queued: list[_Queued], copies: int) -> int:
    """Bytes of the oldest ``copies`` queued."""
    total = 0
    for q in queued:
        if copies <= 0:
            break
        take = min(copies, q.count)
        total += _part(q.size, q.count, take)
        copies -= take
    return total


def _drop_for_bytes(queued: list[_Queued], skip: int, size: int, limit: int) -> int:
    """Copies to drop from the head (after ``skip`` expired ones) so that at
    most ``limit`` bytes stay; as far as the window shows."""
    drop = 0
    for q in queued:
        if size <= limit:
            break
        count = q.count
        used = min(skip, count)
        skip -= used
        count -= used
        each = q.size / max(q.count, 1)
        take = count if each <= 0 else min(count, math.ceil((size - limit) / each))
        size -= take * each
        drop += take
    return drop
