"""Each subscriber queue's tally: when its copies were queued, and their size.

Why it is shaped so: docs/design/notes.rst, "gearhorn/store/tally.py".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence

import redis

from gearhorn.gearman import Copy
from gearhorn.rules.retention import Tallied, TallyEntry
from gearhorn.runtime.background import Outage
from gearhorn.store.keys import Keys
from gearhorn.store.redisconn import REDIS_ERRORS
from gearhorn.store.redisutil import script, text

log = logging.getLogger(__name__)

# Queues whose counts a worker keeps while Redis is away.
MAX_PENDING_QUEUES = 100_000
# All of <p>tallied at once: the warden reuses the sums of every queue not
# in it, so none may be left behind.
CHANGED_MOST = 1 << 30


class TallyWriter:
    """The worker's side: ``add`` the copies gearmand accepted; the worker's
    flusher thread writes them every 0.1 s (one entry per queue, one round
    trip). Copies not written yet count as the newest (retention.py)."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.redis = client
        self.keys = keys
        self._pending: dict[str, list[int]] = {}  # queue -> [copies, bytes, first ms]
        self._lock = threading.Lock()  # the releaser thread adds too
        self._outage = Outage(log, "redis (tally)")

    def add(self, copies: Iterable[Copy], now_ms: int | None = None) -> None:
        at = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        with self._lock:
            for copy in copies:
                counts = self._pending.get(copy.function)
                if counts is None:
                    counts = self._pending[copy.function] = [0, 0, at]
                counts[0] += 1
                counts[1] += len(copy.data)

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
        if not pending:
            return
        pipe = self.redis.pipeline(transaction=False)
        for queue, (count, size, at) in pending.items():
            pipe.rpush(self.keys.tally(queue), TallyEntry(at, count, size).encode())
            pipe.hincrby(self.keys.tally_sum(queue), "c", count)
            pipe.hincrby(self.keys.tally_sum(queue), "b", size)
        try:
            pipe.execute()
        except REDIS_ERRORS as exc:
            # Kept for the next flush: the warden then sees copies it has no
            # entry for yet, and counts them as the oldest (retention.py).
            with self._lock:
                for queue, counts in list(pending.items())[:MAX_PENDING_QUEUES]:
                    mine = self._pending.setdefault(queue, [0, 0, counts[2]])
                    mine[0] += counts[0]
                    mine[1] += counts[1]
                    mine[2] = min(mine[2], counts[2])
            self._outage.failed(exc)
            return
        try:
            # After the sums, never beside them (a cluster pipeline keeps
            # order per node only): see TallyReader.unwatch and changed. The
            # version tells the warden something was tallied since its last
            # round, <p>tallied which queues.
            after = self.redis.pipeline(transaction=False)
            after.sadd(self.keys.watched, *pending)
            after.sadd(self.keys.tallied, *pending)
            after.incr(self.keys.tally_version)
            after.execute()
        except REDIS_ERRORS as exc:
            # Written, not watched: the warden finds them by gearmand's
            # count (their copies are queued) and watches them then.
            self._outage.failed(exc)
            return
        self._outage.succeeded()


class TallyReader:
    """The warden's side."""

    def __init__(self, client: redis.Redis, keys: Keys, window: int = 512) -> None:
        self.redis = client
        self.keys = keys
        self.window = window
        self._forget = script(client, "tally_forget.lua")

    def watched(self, cursor: int = 0, count: int = 10_000) -> tuple[int, set[str]]:
        """Some of the watched queues, about ``count``, from ``cursor`` (an
        ``SSCAN``: every queue watched through a whole pass is seen in it);
        the cursor to go on from (0: the pass is over)."""
        cursor, found = self.redis.sscan(self.keys.watched, cursor, count=count)
        return int(cursor), {text(q) for q in found}

    def unwatch(self, queues: Sequence[str]) -> None:
        """Take ``queues`` (found with an empty tally) out of the watched
        set, then put back any a worker tallied meanwhile: a writer adds to
        the set after its sums, so either its sums are seen here or its
        add comes after this removal."""
        if not queues:
            return
        self.redis.srem(self.keys.watched, *queues)
        again = [q for q, (count, _) in self.sums(queues).items() if count]
        if again:
            self.redis.sadd(self.keys.watched, *again)

    def changed(self) -> set[str]:
        """The queues tallied since the last call, taken (a writer adds to
        the set after its sums: one tallied after this read is in the next
        one's)."""
        return {text(q) for q in self.redis.spop(self.keys.tallied, CHANGED_MOST) or ()}

    def version(self) -> int:
        """Goes up with every flush of any writer."""
        return int(self.redis.get(self.keys.tally_version) or 0)

    def watch(self, queues: Sequence[str]) -> None:
        if queues:
            self.redis.sadd(self.keys.watched, *queues)

    def sums(self, queues: Sequence[str]) -> dict[str, tuple[int, int]]:
        """Copies and bytes tallied per queue (read before gearmand's counts:
        see Warden.round)."""
        pipe = self.redis.pipeline(transaction=False)
        for queue in queues:
            pipe.hmget(self.keys.tally_sum(queue), "c", "b")
        return {q: (int(c or 0), int(b or 0))
                for q, (c, b) in zip(queues, pipe.execute(), strict=True)}

    def read(self, sums: dict[str, tuple[int, int]]) -> dict[str, Tallied]:
        queues = list(sums)
        pipe = self.redis.pipeline(transaction=False)
        for queue in queues:
            pipe.lrange(self.keys.tally(queue), 0, self.window - 1)
        return {q: Tallied(*sums[q], [TallyEntry.decode(e) for e in window])
                for q, window in zip(queues, pipe.execute(), strict=True)}

    def forget(self, queue: str, entries: Sequence[TallyEntry]) -> bool:
        """Drop the oldest ``entries`` (consumed), from the list and its
        sums, if they are still its head (lua/tally_forget.lua); whether
        they were."""
        if not entries:
            return True
        args = [sum(e.count for e in entries), sum(e.size for e in entries),
                *(e.encode() for e in entries)]
        return bool(self._forget(keys=[self.keys.tally(queue), self.keys.tally_sum(queue)],
                                 args=args))
