"""Who is alive: one sorted set per kind of process, scored by the epoch
second at which each member is dead unless it sends a heartbeat first.

Workers (``<p>workers``) and bridges (``<p>bridges``) both use it: a member
that dies without a word drops out when its score passes, with no one
removing it (dramatiq's dispatch.lua does the same).
"""

from __future__ import annotations

import time

import redis

from gearhorn.store.redisutil import text


class Liveness:
    """Heartbeats of one kind of process in the sorted set ``key``.

    Every method takes an optional ``pipe`` to batch with other commands;
    without one it runs at once.
    """

    def __init__(self, client: redis.Redis, key: str) -> None:
        self.redis = client
        self.key = key

    def beat(self, member: str, ttl: float, now: float | None = None,
             pipe: redis.client.Pipeline | None = None) -> object:
        """``member`` is alive for ``ttl`` more seconds; returns 1 when it was
        not listed (new, or removed meanwhile)."""
        now = time.time() if now is None else now
        return (pipe or self.redis).zadd(self.key, {member: now + ttl})

    def retire(self, member: str, pipe: redis.client.Pipeline | None = None) -> object:
        return (pipe or self.redis).zrem(self.key, member)

    def alive(self, now: float | None = None) -> list[str]:
        now = time.time() if now is None else now
        return [text(m) for m in self.redis.zrangebyscore(self.key, now, "+inf")]

    def dead(self, now: float | None = None) -> list[str]:
        """Members whose heartbeat ran out and who are still listed."""
        now = time.time() if now is None else now
        return [text(m) for m in self.redis.zrangebyscore(self.key, "-inf", now)]

    def forget_dead(self, now: float | None = None,
                    pipe: redis.client.Pipeline | None = None) -> object:
        now = time.time() if now is None else now
        return (pipe or self.redis).zremrangebyscore(self.key, "-inf", now)

