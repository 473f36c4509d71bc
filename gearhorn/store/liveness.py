"""Who is alive: one sorted set per kind of process, scored by the epoch
second, by Redis's clock, at which each member is dead unless it sends a
heartbeat first (no process's clock is compared with another's).

Workers (``<p>workers``) and bridges (``<p>bridges``) both use it: a member
that dies without a word drops out when its score passes, with no one
removing it (dramatiq's dispatch.lua does the same).
"""

from __future__ import annotations

from collections.abc import Callable

import redis

from gearhorn.store.keys import Keys
from gearhorn.store.redisutil import text


class Liveness:
    """Heartbeats of one kind of process in the sorted set ``key``, and what
    each says about itself (a hash at ``info_key(member)``, expiring with
    its heartbeat): the one owner of both, for workers and bridges alike.

    Every method takes an optional ``pipe`` to batch with other commands;
    without one it runs at once.
    """

    def __init__(self, client: redis.Redis, key: str,
                 info_key: Callable[[str], str] | None = None) -> None:
        self.redis = client
        self.key = key
        self.info_key = info_key

    def beat(self, member: str, ttl: float, now: float | None = None,
             pipe: redis.client.Pipeline | None = None) -> object:
        """``member`` is alive for ``ttl`` more seconds; returns 1 when it was
        not listed (new, or removed meanwhile)."""
        now = redis_now(self.redis) if now is None else now
        return (pipe or self.redis).zadd(self.key, {member: now + ttl})

    def tell(self, member: str, info: dict[str, object], ttl: float,
             pipe: redis.client.Pipeline | None = None) -> None:
        """What ``member`` says about itself (pid, host, ...), kept as long as
        its heartbeat."""
        target = pipe or self.redis.pipeline(transaction=False)
        if info:
            target.hset(self.info_key(member), mapping={k: str(v) for k, v in info.items()})
        target.pexpire(self.info_key(member), max(1, int(ttl * 1000)))
        if pipe is None:
            target.execute()

    def retire(self, member: str, pipe: redis.client.Pipeline | None = None) -> None:
        """Gone (a clean stop, or swept after it died): its entry and its info."""
        target = pipe or self.redis.pipeline(transaction=False)
        target.zrem(self.key, member)
        if self.info_key is not None:
            target.delete(self.info_key(member))
        if pipe is None:
            target.execute()

    def alive_with_info(self, now: float | None = None) -> dict[str, dict[str, str]]:
        """Live members and what each said about itself, in one round trip more."""
        members = self.alive(now)
        pipe = self.redis.pipeline(transaction=False)
        for member in members:
            pipe.hgetall(self.info_key(member))
        return {m: {text(k): text(v) for k, v in info.items()}
                for m, info in zip(members, pipe.execute(), strict=True)}

    def alive(self, now: float | None = None) -> list[str]:
        now = redis_now(self.redis) if now is None else now
        return [text(m) for m in self.redis.zrangebyscore(self.key, now, "+inf")]

    def dead(self, now: float | None = None) -> list[str]:
        """Members whose heartbeat ran out and who are still listed."""
        now = redis_now(self.redis) if now is None else now
        return [text(m) for m in self.redis.zrangebyscore(self.key, "-inf", now)]

    def forget_dead(self, now: float | None = None,
                    pipe: redis.client.Pipeline | None = None) -> object:
        now = redis_now(self.redis) if now is None else now
        return (pipe or self.redis).zremrangebyscore(self.key, "-inf", now)


def redis_now(client: redis.Redis) -> float:
    """Redis's clock, in epoch seconds."""
    seconds, micros = client.time()
    return seconds + micros / 1_000_000


def of_bridges(client: redis.Redis, keys: Keys) -> Liveness:
    """The bridges' heartbeats and what each says about itself."""
    return Liveness(client, keys.bridges, keys.bridge_info)


def of_workers(client: redis.Redis, keys: Keys) -> Liveness:
    """The worker processes' heartbeats and what each says about itself."""
    return Liveness(client, keys.workers, keys.worker)
