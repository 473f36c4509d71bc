"""Cleaning up after a bridge that died without a word (kill -9, a crash).

Why it is shaped so: docs/design/notes.rst, "gearhorn/worker/janitor.py".
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gearhorn.rules.messages import Subscription
from gearhorn.rules.naming import queue_name
from gearhorn.store.bridges import QUEUE, TOPIC
from gearhorn.store.liveness import of_bridges
from gearhorn.store.redisconn import REDIS_ERRORS
from gearhorn.store.redisutil import text
from gearhorn.store.registry import Registry

log = logging.getLogger(__name__)

class Janitor:
    """The pool's side: remove what dead bridges left behind."""

    def __init__(self, registry: Registry, drop_queue: Callable[[str], None]) -> None:
        self.registry = registry
        self.redis = registry.redis
        self.keys = registry.keys
        self.drop_queue = drop_queue
        self.bridges = of_bridges(self.redis, self.keys)

    def sweep(self, now: float | None = None) -> int:
        """Clean up after every bridge whose heartbeat expired; returns how many."""
        cleaned = 0
        for bridge_id in self.bridges.dead(now):
            # One sweeper per dead bridge; the claim expires if that one dies too.
            if not self.redis.set(self.keys.sweeping(bridge_id), "1", nx=True, ex=60):
                continue
            try:
                self._clean(bridge_id)
                cleaned += 1
            except REDIS_ERRORS as exc:
                log.warning("cleanup after bridge %s interrupted: %s", bridge_id, exc)
        return cleaned

    def _clean(self, bridge_id: str) -> None:
        entries = [text(e) for e in self.redis.smembers(self.keys.bridge(bridge_id))]
        for entry in entries:
            kind, _, rest = entry.partition("\t")
            if kind == TOPIC:
                pattern, _, client_id = rest.partition("\t")
                self.registry.unsubscribe(Subscription(pattern, client_id))
                self.drop_queue(queue_name(pattern, client_id))
            elif kind == QUEUE:
                self.redis.srem(self.keys.temp_queues, rest)
                self.drop_queue(rest)
        pipe = self.redis.pipeline(transaction=False)
        self.bridges.retire(bridge_id, pipe)
        pipe.delete(self.keys.bridge(bridge_id))
        pipe.execute()
        log.info("bridge %s is gone: removed its %d subscriptions and temp queues",
                 bridge_id, len(entries))
