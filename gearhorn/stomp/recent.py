"""The last messages a topic's feed handed over, kept in memory (pure).

A stream or live reader that runs out of credit leaves its topic's feed
and catches up later. From Redis, each such reader read the same entries
again with an XRANGE of its own: under load, when many fall behind at
once, that was a third of the bridge's time (py-spy at topic x100, 1,000
msg/s), and it made the bridge fall further behind. A reader whose
position is still in this window catches up from here instead; one
further back reads Redis as before.
"""

from __future__ import annotations

from gearhorn.store.history import Stored

MAX_ENTRIES = 2_000
MAX_BYTES = 4 << 20  # payloads kept, at most


class RecentEntries:
    """The last entries of one epoch of a topic's history, with no gap.

    >>> recent = RecentEntries(max_entries=3)
    >>> for offset in (1, 2, 3, 4):
    ...     recent.add("e1", (offset, f"m{offset}", b"x", {}))
    >>> [stored[0] for stored in recent.after("e1", 2, 10)]
    [3, 4]
    >>> recent.after("e1", 0, 10) is None  # offset 1 is gone: read Redis
    True
    >>> recent.after("e2", 2, 10) is None  # another epoch
    True
    >>> recent.after("e1", 4, 10)  # up to date
    []
    """

    def __init__(self, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.epoch: str | None = None
        self._entries: list[Stored] = []
        self._first = 0  # index in _entries of the oldest kept (the list is cut lazily)
        self._bytes = 0

    def add(self, epoch: str | None, stored: Stored) -> None:
        """``stored`` was handed over: kept, unless it does not follow the
        last one kept (then the window starts again from it)."""
        if epoch != self.epoch or (self._kept() and stored[0] != self._entries[-1][0] + 1):
            self.clear()
            self.epoch = epoch
        self._entries.append(stored)
        self._bytes += len(stored[2])
        while self._kept() > self.max_entries or (self._bytes > self.max_bytes
                                                   and self._kept() > 1):
            self._bytes -= len(self._entries[self._first][2])
            self._first += 1
        if self._first > len(self._entries) // 2:
            del self._entries[:self._first]
            self._first = 0

    def after(self, epoch: str | None, offset: int, count: int) -> list[Stored] | None:
        """Up to ``count`` entries after ``offset`` of ``epoch``; None when
        the window does not hold the one right after it (read Redis)."""
        if epoch is None or epoch != self.epoch or not self._kept():
            return None
        oldest = self._entries[self._first][0]
        if offset + 1 < oldest:
            return None
        start = self._first + offset + 1 - oldest
        return self._entries[start:start + count]

    def clear(self) -> None:
        self._entries, self._first, self._bytes = [], 0, 0

    def _kept(self) -> int:
        return len(self._entries) - self._first
