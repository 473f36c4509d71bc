"""Topic -> subscriber sets in Redis, matchmaking announcements, worker liveness.

Knows nothing of Gearman. Every write goes through a Lua script so the set,
its index, the version counter and the announcement change together.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from gearhorn.keys import PREFIX_VERSION_FIELD, Keys
from gearhorn.liveness import Liveness
from gearhorn.messages import PREFIX_WILDCARD, Subscription, queue_name
from gearhorn.naming import process_id
from gearhorn.redisutil import script, text


@dataclass(frozen=True, slots=True)
class Recipient:
    """One subscriber of a published topic: where its copy goes."""

    queue: str
    client_id: str
    # The prefix pattern it subscribed with, None for a direct subscription.
    pattern: str | None = None


@dataclass(frozen=True, slots=True)
class Members:
    """A topic's recipients as of ``token`` (see ``lua/members.lua``)."""

    token: str
    recipients: tuple[Recipient, ...]


class Registry:
    """Subscriptions and worker liveness for one Redis database.

    >>> reg = Registry(redis.Redis())                      # doctest: +SKIP
    >>> reg.subscribe(Subscription("news", "alice"))       # doctest: +SKIP
    1
    """

    def __init__(self, client: redis.Redis, keys: Keys | None = None) -> None:
        self.redis = client
        self.keys = keys or Keys()
        self._subscribe = script(client, "subscribe.lua")
        self._members = script(client, "members.lua")
        self.workers = Liveness(client, self.keys.workers)
        # Every prefix pattern, as of the prefix version (lua/members.lua).
        self._patterns: tuple[str, ...] = ()
        self._patterns_version = ""

    # -- subscriptions -------------------------------------------------------

    def subscribe(self, sub: Subscription) -> int:
        """Add ``sub``; returns the number of subscribers of its topic or prefix."""
        return self._change(sub, subscribe=True)

    def unsubscribe(self, sub: Subscription) -> int:
        """Remove ``sub``; returns the number of subscribers left."""
        return self._change(sub, subscribe=False)

    def _change(self, sub: Subscription, *, subscribe: bool) -> int:
        if sub.is_prefix:
            keys = [self.keys.prefix_set(sub.topic), self.keys.prefixes]
            field = PREFIX_VERSION_FIELD
        else:
            keys = [self.keys.topic(sub.topic), self.keys.topics]
            field = sub.topic
        args = ["1" if subscribe else "0", sub.topic, sub.client_id, field, self.keys.channel]
        return int(self._subscribe(keys=keys + [self.keys.versions], args=args))

    def members(self, topic: str, cached_token: str = "") -> Members | None:
        """Recipients of a fanout to ``topic``; None if ``cached_token`` is current.

        One round trip, unless a prefix subscription changed since this
        registry last read the list of patterns: then it reads it again.
        """
        while True:
            patterns = [p for p in self._patterns if topic.startswith(p[:-1])]
            keys = [self.keys.versions, self.keys.topic(topic),
                    *map(self.keys.prefix_set, patterns)]
            reply = self._members(keys=keys, args=[topic, cached_token,
                                                   self._patterns_version, *patterns])
            if text(reply[0]) != _STALE_PATTERNS:
                break
            self._read_patterns()
        token = text(reply[0])
        if len(reply) == 1 and token == cached_token:
            return None
        return Members(token, tuple(_recipient(topic, text(m)) for m in reply[1:]))

    def _read_patterns(self) -> None:
        """The prefix patterns with their version, read together."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.hget(self.keys.versions, PREFIX_VERSION_FIELD)
        pipe.smembers(self.keys.prefixes)
        version, patterns = pipe.execute()
        self._patterns_version = text(version or b"0")
        self._patterns = tuple(sorted(text(p) for p in patterns))

    def subscribers(self, topic: str) -> set[str]:
        """Direct subscribers of a topic or prefix pattern (for status and tests)."""
        key = (self.keys.prefix_set(topic) if topic.endswith(PREFIX_WILDCARD)
               else self.keys.topic(topic))
        return {text(m) for m in self.redis.smembers(key)}

    def topics(self) -> dict[str, int]:
        """Every topic and prefix pattern with its subscriber count."""
        names = [text(t) for t in self.redis.smembers(self.keys.topics)]
        names += [text(p) for p in self.redis.smembers(self.keys.prefixes)]
        pipe = self.redis.pipeline(transaction=False)
        for name in names:
            pipe.scard(self.keys.prefix_set(name) if name.endswith(PREFIX_WILDCARD)
                       else self.keys.topic(name))
        return dict(zip(names, pipe.execute(), strict=True))

    # -- worker liveness -------------------------------------------------------

    def heartbeat(self, worker_id: str, ttl: float, info: dict[str, object] | None = None,
                  now: float | None = None) -> None:
        """Mark ``worker_id`` alive for ``ttl`` seconds and forget the dead."""
        pipe = self.redis.pipeline(transaction=False)
        self.workers.beat(worker_id, ttl, now, pipe)
        self.workers.forget_dead(now, pipe)
        if info:
            pipe.hset(self.keys.worker(worker_id), mapping={k: str(v) for k, v in info.items()})
        pipe.pexpire(self.keys.worker(worker_id), max(1, int(ttl * 1000)))
        pipe.execute()

    def retire(self, worker_id: str) -> None:
        """Remove a worker that stops cleanly."""
        pipe = self.redis.pipeline(transaction=False)
        self.workers.retire(worker_id, pipe)
        pipe.delete(self.keys.worker(worker_id))
        pipe.execute()

    def live_workers(self, now: float | None = None) -> dict[str, dict[str, str]]:
        """Workers whose last heartbeat has not expired, with their info."""
        ids = self.workers.alive(now)
        pipe = self.redis.pipeline(transaction=False)
        for worker_id in ids:
            pipe.hgetall(self.keys.worker(worker_id))
        infos = pipe.execute()
        return {w: {text(k): text(v) for k, v in info.items()}
                for w, info in zip(ids, infos, strict=True)}


_STALE_PATTERNS = "!prefixes"  # lua/members.lua's answer to an old list of patterns


def new_worker_id() -> str:
    return process_id()


def _recipient(topic: str, member: str) -> Recipient:
    pattern, sep, client_id = member.partition("\n")
    if not sep:
        return Recipient(queue_name(topic, member), member)
    return Recipient(queue_name(pattern, client_id), client_id, pattern)

