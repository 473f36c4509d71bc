"""What the warden's rounds tell the workers and the operators: the
reject-publish queues at their limit (``<p>full``), the largest backlogs
(``<p>backlogs``) and the queue store's memory against its guard
(``<p>store``: the workers refuse fanouts while it is over; ``gearhorn
status``, the console and ``/readyz`` show it)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import redis

from gearhorn.store.keys import Keys
from gearhorn.store.redisconn import REDIS_ERRORS

BACKLOGS_KEPT = 20  # largest backlogs in <p>backlogs


@dataclass(frozen=True)
class Backlog:
    queue: str
    topic: str
    client_id: str
    depth: int
    size: int
    oldest_age: float | None  # seconds
    consumers: int
    limits: str

    def to_dict(self) -> dict[str, object]:
        return {"queue": self.queue, "topic": self.topic, "client_id": self.client_id,
                "depth": self.depth, "bytes": self.size, "oldest_age": self.oldest_age,
                "consumers": self.consumers, "limits": self.limits}


class RoundReport:
    """Writes a round's outcome; tells the workers when it changed."""

    def __init__(self, client: redis.Redis, keys: Keys,
                 queue_store: Callable[[], redis.Redis | None] | None, store_guard: float,
                 store_most: int = 0) -> None:
        self.redis = client
        self.keys = keys
        self.queue_store = queue_store
        self.store_guard = store_guard
        # The store's memory where its Redis sets no maxmemory: the held
        # copies share the registry's Redis, whose own maxmemory would stop
        # heartbeats and subscriptions too, so the guard alone bounds them.
        self.store_most = store_most
        self._full: set[str] = set()
        self._over = ""
        self._largest: list[Backlog] = []  # as last published

    def mark_full(self, full: set[str]) -> None:
        if full == self._full and self.redis.scard(self.keys.full) == len(full):
            return
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self.keys.full)
        if full:
            pipe.sadd(self.keys.full, *full)
        pipe.execute()
        self._full = full
        self._announce()

    def publish(self, backlogs: list[Backlog], now: float) -> None:
        backlogs.sort(key=lambda b: -b.depth)
        self._largest = backlogs[:BACKLOGS_KEPT]
        store = self._store_state(self._largest)
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(self.keys.backlogs, json.dumps({
            "at": now, "queues": [b.to_dict() for b in self._largest]}))
        pipe.hset(self.keys.store, mapping={k: str(v) for k, v in store.items()})
        pipe.execute()
        self._store_said(store)

    def refresh_store(self) -> None:
        """The queue store's state again, between two rounds that judged
        (copies are being made: the guard must see it fill)."""
        if self.queue_store is None:
            return
        store = self._store_state(self._largest)
        self.redis.hset(self.keys.store, mapping={k: str(v) for k, v in store.items()})
        self._store_said(store)

    def _store_said(self, store: dict[str, object]) -> None:
        if store["over"] != self._over:
            self._over = str(store["over"])
            self._announce()

    def _announce(self) -> None:
        """Workers read ``<p>full`` and ``<p>store`` again at once (pressure.py)."""
        self.redis.publish(self.keys.channel, json.dumps({"op": "pressure"}))

    def _store_state(self, backlogs: list[Backlog]) -> dict[str, object]:
        """The queue store's memory against the guard, and the one-line reason
        fanouts are refused while it is over (empty when it is not)."""
        client = self.queue_store() if self.queue_store else None
        if client is None:
            return {"used": 0, "max": 0, "guard": 0, "over": ""}
        try:
            memory = client.info("memory")
        except REDIS_ERRORS as exc:
            return {"used": 0, "max": 0, "guard": 0, "over": "", "error": str(exc)}
        used = int(memory.get("used_memory", 0))
        most = int(memory.get("maxmemory", 0)) or self.store_most
        guard = int(most * self.store_guard) if most else 0
        over = ""
        if guard and used >= guard:
            largest = ", ".join(f"{b.queue} ({b.depth:,} copies)" for b in backlogs[:3])
            over = (f"queue store full: {_mib(used)} of {_mib(most)} used, over the guard of "
                    f"{_mib(guard)}; largest backlogs: {largest or 'none'}")
        return {"used": used, "max": most, "guard": guard, "over": over}


def _mib(n: int) -> str:
    return f"{n / 1048576:.0f} MiB"
