"""A bridge's registration of what dies with it: heartbeats (``<p>bridges``)
and the list of its non-durable subscriptions and temp queues
(``<p>bridge:<id>``), which the pool's janitor (gearhorn/worker/janitor.py)
removes when the heartbeats stop."""

from __future__ import annotations

import logging

from gearhorn.rules.messages import Subscription
from gearhorn.store.liveness import of_bridges
from gearhorn.store.registry import Registry

log = logging.getLogger(__name__)

TOPIC, QUEUE = "topic", "queue"


def topic_entry(pattern: str, client_id: str) -> str:
    return f"{TOPIC}\t{pattern}\t{client_id}"


def queue_entry(function: str) -> str:
    return f"{QUEUE}\t{function}"


class BridgeLiveness:
    """A bridge's side: heartbeats, and the list of what dies with it."""

    def __init__(self, registry: Registry, bridge_id: str, ttl: float) -> None:
        self.registry = registry
        self.redis = registry.redis
        self.keys = registry.keys
        self.bridge_id = bridge_id
        self.ttl = ttl
        # What this bridge holds now; a topic entry with its subscription
        # (limits, bridge), to register it again as it was (_restore).
        self.entries: dict[str, Subscription | None] = {}
        self.liveness = of_bridges(self.redis, self.keys)
        self._beating = False

    def tell(self, info: dict[str, object]) -> None:
        """What this bridge says about itself (pid, host, connections...)."""
        self.liveness.tell(self.bridge_id, info, self.ttl)

    def heartbeat(self, now: float | None = None) -> None:
        """Renew; if the janitor swept this bridge anyway (its heartbeats were
        late, not missing), put back what it holds and say so."""
        added = self.liveness.beat(self.bridge_id, self.ttl, now)
        if added and self._beating and self.entries:
            log.error("bridge %s was taken for dead (heartbeats late by over %.0fs): "
                      "registering its %d subscriptions again", self.bridge_id, self.ttl,
                      len(self.entries))
            self._restore()
        self._beating = True

    def _restore(self) -> None:
        # A snapshot: under gevent each Redis call lets the bridge's sessions
        # add and release entries meanwhile.
        held = list(self.entries.items())
        self.redis.sadd(self.keys.bridge(self.bridge_id), *(entry for entry, _ in held))
        for entry, subscription in held:
            kind, _, rest = entry.partition("\t")
            if kind == QUEUE and entry in self.entries:
                self.redis.sadd(self.keys.temp_queues, rest)
            if kind == TOPIC and entry in self.entries:
                if subscription is None:
                    pattern, _, client_id = rest.partition("\t")
                    subscription = Subscription(pattern, client_id, bridge=self.bridge_id)
                self.registry.subscribe(subscription)
                if entry not in self.entries:  # released while it was registered again
                    self.registry.unsubscribe(subscription)
        for entry in [entry for entry, _ in held if entry not in self.entries]:
            self._write(entry, "srem")  # released meanwhile: unlisted again

    def holds(self, entry: str, subscription: Subscription | None = None) -> None:
        self.entries[entry] = subscription
        self._write(entry, "sadd")

    def releasing(self, entry: str) -> None:
        """About to be removed: a restore running meanwhile leaves it out."""
        self.entries.pop(entry, None)

    def released(self, entry: str) -> None:
        self.entries.pop(entry, None)
        self._write(entry, "srem")

    def _write(self, entry: str, command: str) -> None:
        """SADD or SREM ``entry`` in this bridge's list (and a temp queue in
        the list of live temp queues)."""
        pipe = self.redis.pipeline(transaction=False)
        getattr(pipe, command)(self.keys.bridge(self.bridge_id), entry)
        kind, _, name = entry.partition("\t")
        if kind == QUEUE:
            getattr(pipe, command)(self.keys.temp_queues, name)
        pipe.execute()

    def retire(self) -> None:
        """A clean stop: the bridge removed its subscriptions itself."""
        pipe = self.redis.pipeline(transaction=False)
        self.liveness.retire(self.bridge_id, pipe)
        pipe.delete(self.keys.bridge(self.bridge_id))
        pipe.execute()
