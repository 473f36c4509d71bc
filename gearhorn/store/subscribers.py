"""The worker-local subscriber cache and its invalidation.

Correctness comes from the version token: every lookup sends the cached
token to Redis (one round trip, ``lua/topic_members.lua`` and
``lua/prefix_members.lua``) and gets a member list back only when it
changed. So a fanout that starts after a subscribe completed always sees it,
on every worker, even if the matchmaking message has not arrived yet. The
matchmaking listener drops entries eagerly, which keeps memory to live
topics and costs nothing on the hot path.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

import redis

from gearhorn.rules.messages import PREFIX_WILDCARD
from gearhorn.runtime.background import Backoff, StoppableThread
from gearhorn.store.redisconn import REDIS_ERRORS
from gearhorn.store.redisutil import ScriptCall
from gearhorn.store.registry import Members, Recipient, Registry

log = logging.getLogger(__name__)


class SubscriberCache:
    """LRU cache of topic -> recipients, validated against Redis on every use."""

    def __init__(self, registry: Registry, max_entries: int = 10_000) -> None:
        self.registry = registry
        self.max_entries = max_entries
        self._entries: OrderedDict[str, Members] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def recipients(self, topic: str) -> tuple[Recipient, ...]:
        """The current recipients of ``topic``."""
        return self.recipients_of([topic])[topic]

    def recipients_of(self, topics: Iterable[str], also: Sequence[ScriptCall] = ()
                      ) -> dict[str, tuple[Recipient, ...]]:
        """The current recipients of each of ``topics``, checked in one round
        trip (with the script calls ``also``, made once)."""
        return self.recipients_with(topics, also)[0]

    def recipients_with(self, topics: Iterable[str], also: Sequence[ScriptCall] = ()
                        ) -> tuple[dict[str, tuple[Recipient, ...]], list]:
        """:meth:`recipients_of`, and the replies of the calls ``also``."""
        with self._lock:
            cached = {topic: self._entries.get(topic) for topic in topics}
        fresh, replies = self.registry.members_with(cached, also)
        current = {}
        with self._lock:
            for topic, members in fresh.items():
                if members is None:
                    self.hits += 1
                    members = cached[topic]
                else:
                    self.misses += 1
                self._entries[topic] = members
                self._entries.move_to_end(topic)
                current[topic] = members.recipients
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return current, replies

    def invalidate(self, topic: str | None = None) -> None:
        """Forget ``topic``, or everything when ``topic`` is None."""
        with self._lock:
            if topic is None:
                self._entries.clear()
            else:
                self._entries.pop(topic, None)

    def __len__(self) -> int:
        return len(self._entries)

    def handle_announcement(self, data: bytes | str) -> None:
        """Apply one matchmaking message (see ``gearhorn.store.keys``)."""
        try:
            message = json.loads(data)
            if message.get("op") in ("pressure", "due"):
                return  # the warden's (store/pressure.py) and the scheduler's (store/delayed.py)
            topic = message["topic"]
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("ignoring malformed matchmaking message %r", data[:200])
            return
        # A prefix change may touch any topic: drop them all.
        self.invalidate(None if str(topic).endswith(PREFIX_WILDCARD) else topic)


class InvalidationListener(StoppableThread):
    """Follows the matchmaking channel and invalidates ``cache``.

    While disconnected it cannot know what changed, so it clears the cache
    on every (re)connect; it retries with capped exponential backoff.
    """

    def __init__(self, client: redis.Redis, channel: str, cache: SubscriberCache,
                 also: Callable[[bytes | str], None] | None = None,
                 on_subscribed: Callable[[], None] | None = None) -> None:
        super().__init__("gearhorn-invalidation")
        self.client = client
        self.channel = channel
        self.cache = cache
        self.also = also  # told every message too (store/pressure.py, store/delayed.py)
        # Told of every (re)subscription, after which nothing is missed:
        # the releaser looks again for what was announced before it.
        self.on_subscribed = on_subscribed
        self.subscribed = threading.Event()

    def run(self) -> None:
        backoff = Backoff()
        while not self.stopping.is_set():
            try:
                self._listen()
                backoff.succeeded()
            except REDIS_ERRORS as exc:
                self.subscribed.clear()
                pause = backoff.failed()
                log.warning("matchmaking channel lost (%s); retrying in %.1fs", exc, pause)
                self.stopping.wait(pause)

    def _listen(self) -> None:
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        try:
            pubsub.subscribe(self.channel)
            self.cache.invalidate()
            if self.on_subscribed is not None:
                self.on_subscribed()
            self.subscribed.set()
            while not self.stopping.is_set():
                message = pubsub.get_message(timeout=1.0)
                if message and message["type"] == "message":
                    self.cache.handle_announcement(message["data"])
                    if self.also is not None:
                        self.also(message["data"])
        finally:
            pubsub.close()
