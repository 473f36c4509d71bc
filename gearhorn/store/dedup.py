"""Publisher deduplication: the first fanout with a producer's id on a topic
within ``dedup_window`` is made; another with the same id is a duplicate.

One Redis key per id (``<p>dedup:{T}:<id>``, in the topic's hash slot on a
cluster), set only if absent, expiring after the window: so it holds across
worker processes and bridges. Its value is the first fanout's message id,
which the same job run again (its worker died) has too: that run goes on,
and makes the same copies (their unique keys derive from it).
"""

from __future__ import annotations

import redis

from gearhorn.store.keys import Keys
from gearhorn.store.redisutil import text

# Deletes the claim only if it is still ours (a later fanout may hold it).
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0
"""


class Deduplicator:
    def __init__(self, client: redis.Redis, keys: Keys, window: float) -> None:
        self.redis = client
        self.keys = keys
        self.window_ms = int(window * 1000)
        self._release = client.register_script(_RELEASE)

    def claim(self, topic: str, dedup_id: str, message_id: str) -> str:
        """``message_id`` if this fanout is the first with ``dedup_id`` on
        ``topic`` in the window (or the same one again); else the first's
        message id. One round trip (SET NX GET, Redis 7)."""
        if self.window_ms <= 0:
            return message_id
        first = self.redis.set(self.keys.dedup(topic, dedup_id), message_id, nx=True,
                               px=self.window_ms, get=True)
        return message_id if first is None else text(first)

    def seen_unique(self, topic: str, unique: str, job: str) -> bool:
        """Did another fanout job (not ``job`` run again) to ``topic`` carry
        the JSON ``unique`` within the window? Gearman coalesces by unique
        key: its copies still queued are that fanout's, and the result says so."""
        if self.window_ms <= 0:
            return False
        before = self.redis.set(self.keys.coalesce(topic, unique), job, px=self.window_ms,
                                get=True)
        return before is not None and text(before) != job

    def release(self, topic: str, dedup_id: str, message_id: str) -> None:
        """The fanout failed before it made its copies: a retry may go."""
        if self.window_ms > 0:
            self._release(keys=[self.keys.dedup(topic, dedup_id)], args=[message_id])
