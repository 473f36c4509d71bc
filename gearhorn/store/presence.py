"""Who is subscribed to a topic, and where (``topic_presence``).

Cheap whatever the topic's size: the count is SCARD, the client ids come a
page at a time (SSCAN from a cursor), and what is known of each (Gearman or
STOMP, which bridge, since when) is one HMGET of the page's records in
``<p>subscriptions``. Prefix subscriptions that cover the topic are counted
by pattern, not listed.
"""

from __future__ import annotations

import json

from gearhorn.rules.messages import PREFIX_WILDCARD, PresenceQuery
from gearhorn.rules.naming import queue_name
from gearhorn.store.redisutil import text
from gearhorn.store.registry import Registry


class Presence:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.redis = registry.redis
        self.keys = registry.keys

    def of(self, query: PresenceQuery) -> dict[str, object]:
        """The topic's subscriber count (direct and by prefix), a page of its
        direct subscribers and the cursor of the next page (0: none)."""
        topic = query.topic
        key = (self.keys.prefix_set(topic) if topic.endswith(PREFIX_WILDCARD)
               else self.keys.topic(topic))
        direct = self.redis.scard(key)
        cursor, members = self._page(key, query.cursor, query.limit)
        patterns = [] if topic.endswith(PREFIX_WILDCARD) else self._patterns(topic)
        return {"topic": topic,
                "subscribers": direct + sum(p["subscribers"] for p in patterns),
                "direct": direct, "patterns": patterns,
                "clients": self._clients(topic, sorted(members)), "cursor": cursor}

    def _page(self, key: str, cursor: int, limit: int) -> tuple[int, list[str]]:
        """About ``limit`` members from ``cursor`` (SSCAN's count is a hint:
        a page may hold a few more; none is skipped)."""
        members: list[str] = []
        while True:
            cursor, found = self.redis.sscan(key, cursor, count=limit - len(members))
            members += [text(m) for m in found]
            if cursor == 0 or len(members) >= limit:
                return int(cursor), members

    def _patterns(self, topic: str) -> list[dict[str, object]]:
        patterns = sorted(p for p in (text(m) for m in self.redis.smembers(self.keys.prefixes))
                          if topic.startswith(p[:-1]))
        pipe = self.redis.pipeline(transaction=False)
        for pattern in patterns:
            pipe.scard(self.keys.prefix_set(pattern))
        return [{"pattern": p, "subscribers": n}
                for p, n in zip(patterns, pipe.execute(), strict=True) if n]

    def _clients(self, topic: str, client_ids: list[str]) -> list[dict[str, object]]:
        if not client_ids:
            return []
        queues = [queue_name(topic, c) for c in client_ids]
        records = self.redis.hmget(self.keys.subscriptions, queues)
        return [_client(client_id, queue, raw)
                for client_id, queue, raw in zip(client_ids, queues, records, strict=True)]


def _client(client_id: str, queue: str, raw: bytes | None) -> dict[str, object]:
    record = json.loads(raw) if raw else {}
    bridge = record.get("bridge", "")
    return {"client_id": client_id, "queue": queue, "via": "stomp" if bridge else "gearman",
            "bridge": bridge, "durable": bool(record.get("durable")),
            "since": record.get("since")}
