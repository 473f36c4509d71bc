"""Who holds copies: each holder's lease, by Redis's clock, and its index of
queues (docs/design/held-copies.rst; lua/holders.lua). A name is one
incarnation of a process and is never used again: once fenced, it stays
dead."""

from __future__ import annotations

import itertools

import redis

from gearhorn.store.heldcopies import Fenced
from gearhorn.store.keys import Keys
from gearhorn.store.redisutil import script, text

FENCED = -1  # a fenced holder's score, and renew's answer to one


class Holders:
    """The leases in ``{<p>holders}`` and the indexes beside them (one hash
    slot: every step here is atomic, on a Redis Cluster too)."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.redis, self.keys = client, keys
        self._script = script(client, "holders.lua")

    def register(self, process: str, lease: float) -> str:
        """A new holder name for ``process`` (its token: Redis's clock, in
        microseconds), listed with a lease of ``lease`` seconds."""
        seconds, micros = self.redis.time()
        name = f"{process}@{seconds}{micros:06d}"
        for again in itertools.count(1):
            if self._call("register", name, _ms(lease)):
                return name
            name = f"{process}@{seconds}{micros:06d}.{again}"  # the same microsecond
        raise AssertionError("unreachable")

    def renew(self, holder: str, lease: float) -> float:
        """``holder``'s lease runs ``lease`` seconds from now; the seconds
        since it was renewed before (by Redis's clock). Raises Fenced."""
        since = int(self._call("renew", holder, _ms(lease)))
        if since == FENCED:
            raise Fenced(f"holder {holder} was taken for dead: its lease had ended")
        return since / 1000

    def judge(self, judge: str) -> list[str] | None:
        """Fence every holder whose lease ended; every fenced holder still
        listed (its copies to take over). None when ``judge``'s own lease
        has ended: it judges nobody before it renewed."""
        found = self._call("judge", judge)
        return None if found == FENCED else sorted(text(h) for h in found)

    def retire(self, holder: str) -> None:
        """A clean stop: ``holder`` fences itself, so that its copies are
        taken over at once."""
        self._call("retire", holder)

    def others_alive(self, holder: str) -> int:
        """How many holders besides ``holder`` hold a running lease now (by
        Redis's clock): those that can take its copies over."""
        return int(self._call("others", holder))

    def drop(self, holder: str) -> bool:
        """Forget a fenced holder whose index is empty."""
        return bool(self._script(keys=[self.keys.holders, self.keys.holder_queues(holder)],
                                 args=["drop", holder]))

    def leases(self) -> dict[str, int]:
        """Every listed holder's score: its lease's end (Redis ms), 0 or -1."""
        return {text(h): int(s) for h, s in
                self.redis.zrange(self.keys.holders, 0, -1, withscores=True)}

    def listed(self, holder: str) -> bool:
        """Is ``holder`` still listed (alive, or fenced and not all taken over)?"""
        return self.redis.zscore(self.keys.holders, holder) is not None

    def move_queue(self, queue: str, source: str, taker: str) -> bool:
        """``queue`` from ``source``'s index to ``taker``'s: True for the one
        caller that moved it."""
        return bool(self.redis.smove(self.keys.holder_queues(source),
                                     self.keys.holder_queues(taker), queue))

    def add_queue(self, holder: str, queue: str) -> None:
        self.redis.sadd(self.keys.holder_queues(holder), queue)

    def some_queues(self, holder: str, count: int) -> list[str]:
        return [text(q) for q in self.redis.srandmember(self.keys.holder_queues(holder), count)]

    def adopt_old_index(self) -> int:
        """The holders an older version listed (``<p>holders``, a set, and
        ``<p>holding:<H>``) moved into this layout, listed as dead, so that
        their copies are taken over; how many."""
        old = [text(h) for h in self.redis.smembers(self.keys.old_holders)]
        for holder in old:
            queues = self.redis.smembers(self.keys.old_holding(holder))
            if queues:
                self.redis.sadd(self.keys.holder_queues(holder), *queues)
                self.redis.zadd(self.keys.holders, {holder: 0}, nx=True)
            self.redis.delete(self.keys.old_holding(holder))
            self.redis.srem(self.keys.old_holders, holder)
        return len(old)

    def _call(self, mode: str, holder: str, *args: object) -> object:
        return self._script(keys=[self.keys.holders], args=[mode, holder, *args])


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))
