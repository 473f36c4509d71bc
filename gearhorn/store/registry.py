"""Topic -> subscriber sets in Redis, matchmaking announcements, worker liveness.

Knows nothing of Gearman. Every write goes through a Lua script so the set,
its version counter and the announcement change together (and a pattern's
index too: the topics' index lives in another hash slot, see _index_topic).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import redis

from gearhorn.rules.limits import REJECT_PUBLISH, Limits, limits_from_dict
from gearhorn.rules.messages import PREFIX_WILDCARD, Subscription
from gearhorn.rules.naming import is_stream_client, process_id, queue_name
from gearhorn.store.directcalls import DirectCalls
from gearhorn.store.keys import Keys
from gearhorn.store.liveness import of_workers, redis_now
from gearhorn.store.redisutil import ScriptCall, script, text
from gearhorn.store.rejectroom import open_room, room_fields


@dataclass(frozen=True, slots=True)
class Recipient:
    """One subscriber of a published topic: where its copy goes."""

    queue: str
    client_id: str
    # The prefix pattern it subscribed with, None for a direct subscription.
    pattern: str | None = None


@dataclass(frozen=True, slots=True)
class Members:
    """A topic's recipients as of ``token``: ``<topic version>.<prefix version>``
    (``lua/topic_members.lua``, ``lua/prefix_members.lua``)."""

    token: str
    recipients: tuple[Recipient, ...]


class Registry:
    """Subscriptions and worker liveness for one Redis database.

    With a Redis on localhost::

        reg = Registry(redis.Redis())
        reg.subscribe(Subscription("news", "alice"))       # 1: subscribers of news
    """

    def __init__(self, client: redis.Redis, keys: Keys | None = None,
                 direct: DirectCalls | None = None) -> None:
        self.redis = client
        self.keys = keys or Keys()
        # Look-ups past the pool (the bridge's, once per SEND: directcalls.py).
        self.direct = direct or DirectCalls.pooled(client)
        self._subscribe = script(client, "subscribe.lua")
        self._readers = script(client, "history_readers.lua")
        self._topic_members = script(client, "topic_members.lua")
        self._prefix_members = script(client, "prefix_members.lua")
        self.workers = of_workers(client, self.keys)
        # Told of every subscription made or removed (presence events), with
        # where it was made; a no-op subscribe or unsubscribe is not told.
        self.changed: Callable[[Subscription, bool], None] | None = None
        # Every prefix pattern, as of the prefix version (lua/prefix_members.lua).
        self._patterns: tuple[str, ...] = ()
        self._patterns_version = ""

    # -- subscriptions -------------------------------------------------------

    def subscribe(self, sub: Subscription, linger: int | None = None) -> int:
        """Add ``sub``; returns the number of subscribers of its topic or prefix.
        A stream reader (a STOMP subscription served from the topic's
        history) keeps a real-time topic's history, and ``linger`` seconds
        after the last one left (lua/history_readers.lua)."""
        return self._change(sub, subscribe=True, linger=linger)

    def unsubscribe(self, sub: Subscription) -> int:
        """Remove ``sub``; returns the number of subscribers left."""
        return self._change(sub, subscribe=False)

    def _change(self, sub: Subscription, *, subscribe: bool, linger: int | None = None) -> int:
        # The queue's record first: a copy never lands in a queue the warden
        # does not know the limits of (a removed one may linger: harmless).
        if subscribe:
            self._record(sub)
        elif self.changed is not None:
            sub = self._as_recorded(sub)
        args = ["1" if subscribe else "0", sub.topic, sub.client_id, self.keys.channel]
        if sub.is_prefix:
            keys = [self.keys.prefix_set(sub.topic), self.keys.prefix_version,
                    self.keys.prefixes]
            count, changed = (int(n) for n in self._subscribe(keys=keys, args=args))
        else:
            keys = [self.keys.topic(sub.topic), self.keys.topic_version(sub.topic)]
            count, changed = (int(n) for n in self._subscribe(keys=keys, args=args))
            if changed:
                self._index_topic(sub.topic, count)
                if is_stream_client(sub.client_id):
                    self._count_reader(sub.topic, subscribe, linger)
        if not subscribe:
            self._forget(queue_name(sub.topic, sub.client_id))
        if changed and self.changed is not None:
            self.changed(sub, subscribe)
        return count

    def _count_reader(self, topic: str, came: bool, linger: int | None) -> None:
        self._readers(keys=[self.keys.history_meta(topic), self.keys.history(topic),
                            self.keys.history_ids(topic)],
                      args=["1" if came else "0", "" if linger is None else str(linger),
                            uuid.uuid4().hex[:12]])

    def _as_recorded(self, sub: Subscription) -> Subscription:
        """``sub`` with where its record says it was made (before it goes)."""
        entry = self.subscription(queue_name(sub.topic, sub.client_id))[0]
        return Subscription(sub.topic, sub.client_id, sub.limits,
                            bridge=entry.get("bridge", ""), durable=bool(entry.get("durable")))

    def _record(self, sub: Subscription) -> None:
        """``<p>subscriptions``: the queue's topic, client, when, and limits
        (given now, or else the ones it had)."""
        queue = queue_name(sub.topic, sub.client_id)
        limits = sub.limits
        if limits is None:
            limits = self.subscription(queue)[1]
        entry = {"topic": sub.topic, "client_id": sub.client_id, "since": time.time(),
                 "limits": limits.said(), "bridge": sub.bridge, "durable": sub.durable}
        self._write_record(queue, entry, limits)
        # After the record, never beside it (a cluster pipeline keeps order
        # per node only): a warden round that saw these then sees the record.
        # The warden's next round judges it (its rounds look only at what
        # changed): its new limits, a room of its own from queue_overflow.
        pipe = self.redis.pipeline(transaction=False)
        if not is_stream_client(sub.client_id):  # a stream reader has no queue to judge
            pipe.sadd(self.keys.renewed, queue)
        if limits.overflow == REJECT_PUBLISH:
            # Room from the first copy on, not from the warden's next round
            # (store/rejectroom.py): a new queue is empty; a known one keeps its
            # room. A round that saw the room then sees the record, and does
            # not take the room away.
            open_room(pipe, self.keys, queue, limits.max_length, limits.max_bytes)
        pipe.execute()

    def bound_queue(self, queue: str, limits: Limits) -> None:
        """A plain queue (a STOMP ``/queue/``) bounded like a subscriber's:
        listed in ``<p>subscriptions`` with no topic."""
        entry = {"topic": "", "client_id": "", "since": time.time(), "limits": limits.said()}
        self._write_record(queue, entry, limits)
        self.redis.sadd(self.keys.renewed, queue)  # after the record (see _record)

    def _write_record(self, queue: str, entry: dict, limits: Limits) -> None:
        """The record, and ``<p>expiring``: the queues whose own limits say
        ``expires``, the ones the warden looks at every round, idle or not."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hset(self.keys.subscriptions, queue, json.dumps(entry))
        if limits.expires:
            pipe.sadd(self.keys.expiring, queue)
        else:
            pipe.srem(self.keys.expiring, queue)
        pipe.execute()

    def unbound_queue(self, queue: str) -> None:
        self._forget(queue)

    def _forget(self, queue: str) -> None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.hdel(self.keys.subscriptions, queue)
        for key in (self.keys.tally(queue), self.keys.tally_sum(queue),
                    self.keys.consumed(queue)):
            pipe.delete(key)  # one by one: a cluster pipeline deletes no more
        pipe.srem(self.keys.full, queue)
        pipe.srem(self.keys.watched, queue)
        pipe.srem(self.keys.renewed, queue)
        pipe.srem(self.keys.expiring, queue)
        # Its room too (store/rejectroom.py): the warden's rounds judge only queues
        # that changed, so they would not come to take it away.
        pipe.hdel(self.keys.room, *room_fields(queue))
        pipe.execute()

    def subscription(self, queue: str) -> tuple[dict, Limits]:
        """A subscriber queue's record and the limits it was given."""
        raw = self.redis.hget(self.keys.subscriptions, queue)
        return _subscription_entry(raw)

    def subscriptions(self) -> dict[str, tuple[dict, Limits]]:
        """Every subscriber queue's record and limits."""
        return {text(q): _subscription_entry(raw)
                for q, raw in self.redis.hgetall(self.keys.subscriptions).items()}

    def records(self, queues: Iterable[str]) -> dict[str, tuple[dict, Limits]]:
        """The record and limits of each of ``queues`` that has one."""
        queues = list(queues)
        found: dict[str, tuple[dict, Limits]] = {}
        for start in range(0, len(queues), 10_000):
            some = queues[start:start + 10_000]
            for queue, raw in zip(some, self.redis.hmget(self.keys.subscriptions, some),
                                  strict=True):
                if raw:
                    found[queue] = _subscription_entry(raw)
        return found

    def renewed(self, most: int) -> set[str]:
        """Up to ``most`` queues subscribed or given new limits since a
        round took them, taken now (``SPOP``: one made after is left)."""
        return {text(q) for q in self.redis.spop(self.keys.renewed, most) or ()}

    def expiring(self) -> set[str]:
        """The queues whose own limits say ``expires``."""
        return {text(q) for q in self.redis.smembers(self.keys.expiring)}

    def _index_topic(self, topic: str, count: int) -> None:
        """Keep ``<p>topics`` (another hash slot than the topic's set) in
        step: add, or remove and then look again. A subscriber that came
        meanwhile either finds the topic gone and adds it after our removal,
        or is seen by our second look, so a topic with subscribers is never
        left out of the index (an empty one may linger until its next change)."""
        if count:
            self.redis.sadd(self.keys.topics, topic)
            return
        self.redis.srem(self.keys.topics, topic)
        if self.redis.scard(self.keys.topic(topic)):
            self.redis.sadd(self.keys.topics, topic)

    def members(self, topic: str, cached: Members | None = None) -> Members | None:
        """Recipients of a fanout to ``topic``; None if ``cached`` is current.

        One round trip (two scripts, one on the topic's hash slot, one on the
        prefixes'), unless a prefix subscription changed since this registry
        last read the list of patterns: then it reads it again.
        """
        return self.members_of({topic: cached})[topic]

    def members_of(self, cached: dict[str, Members | None], also: Sequence[ScriptCall] = ()
                   ) -> dict[str, Members | None]:
        """:meth:`members` of several topics (each with what is cached of
        it, or None) in one round trip; ``also``: other script calls made in
        the same round trip (once, even when the look-up is made again)."""
        return self.members_with(cached, also)[0]

    def members_with(self, cached: dict[str, Members | None], also: Sequence[ScriptCall] = ()
                     ) -> tuple[dict[str, Members | None], list]:
        """:meth:`members_of`, and the replies of the calls ``also``."""
        also_replies: list = []
        while True:
            calls: list[ScriptCall] = list(also)
            for topic, members in cached.items():
                topic_version, prefix_version = _versions(members)
                patterns = [p for p in self._patterns if topic.startswith(p[:-1])]
                calls += [
                    (self._topic_members, [self.keys.topic_version(topic), self.keys.topic(topic)],
                     [topic_version]),
                    (self._prefix_members,
                     [self.keys.prefix_version, *map(self.keys.prefix_set, patterns)],
                     [self._patterns_version, prefix_version, *patterns])]
            replies = self.direct.run_scripts(calls)
            also_replies += replies[:len(also)]
            replies = replies[len(also):]
            also = ()
            if all(text(by_prefix[0]) != _STALE_PATTERNS for by_prefix in replies[1::2]):
                break
            self._read_patterns()
        return {topic: _fresh(topic, members, direct, by_prefix)
                for (topic, members), direct, by_prefix
                in zip(cached.items(), replies[0::2], replies[1::2], strict=True)}, also_replies

    def _read_patterns(self) -> None:
        """The prefix patterns with their version, read together (one slot)."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.get(self.keys.prefix_version)
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
        now = redis_now(self.redis) if now is None else now
        pipe = self.redis.pipeline(transaction=False)
        self.workers.beat(worker_id, ttl, now, pipe)
        self.workers.forget_dead(now, pipe)
        self.workers.tell(worker_id, info or {}, ttl, pipe)
        pipe.execute()

    def retire(self, worker_id: str) -> None:
        """Remove a worker that stops cleanly."""
        self.workers.retire(worker_id)

    def live_workers(self, now: float | None = None) -> dict[str, dict[str, str]]:
        """Workers whose last heartbeat has not expired, with their info."""
        return self.workers.alive_with_info(now)


_STALE_PATTERNS = "!prefixes"  # lua/prefix_members.lua's answer to an old list of patterns


def _versions(cached: Members | None) -> tuple[str, str]:
    """(topic version, prefix version) of what is cached; empty when nothing is."""
    if cached is None:
        return "", ""
    topic_version, _, prefix_version = cached.token.partition(".")
    return topic_version, prefix_version


def _fresh(topic: str, cached: Members | None, direct: list, by_prefix: list) -> Members | None:
    """The members the two scripts' replies say ``topic`` has; None if
    ``cached`` is current. A script that answers only its version means its
    half of ``cached`` is current."""
    token = f"{text(direct[0])}.{text(by_prefix[0])}"
    if cached and token == cached.token:
        return None
    topic_version, prefix_version = _versions(cached)
    old = cached.recipients if cached else ()
    recipients = (
        [Recipient(queue_name(topic, m), m) for m in map(text, direct[1:])
         if not is_stream_client(m)]  # they read the topic's history: no copies
        if len(direct) > 1 or text(direct[0]) != topic_version
        else [r for r in old if r.pattern is None])
    recipients += (
        [_by_pattern(text(m)) for m in by_prefix[1:]]
        if len(by_prefix) > 1 or text(by_prefix[0]) != prefix_version
        else [r for r in old if r.pattern is not None])
    return Members(token, tuple(recipients))


def _subscription_entry(raw: bytes | str | None) -> tuple[dict, Limits]:
    entry = json.loads(raw) if raw else {}
    return entry, limits_from_dict(entry.get("limits") or {})


def new_worker_id() -> str:
    return process_id()


def _by_pattern(member: str) -> Recipient:
    """A prefix subscriber, as prefix_members.lua names it: pattern, newline, client."""
    pattern, _, client_id = member.partition("\n")
    return Recipient(queue_name(pattern, client_id), client_id, pattern)

