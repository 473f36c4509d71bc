"""What one bridge holds in Redis, and that it is alive (runs under gevent):
its non-durable topic subscriptions and temp queues, listed under the
bridge's id so that the pool's janitor removes them if the bridge dies
(gearhorn/worker/janitor.py), and the heartbeat that says it has not."""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable

import gevent

from gearhorn.rules.limits import Limits
from gearhorn.rules.messages import Subscription, validate_topic
from gearhorn.runtime.background import Fault, Outage
from gearhorn.store.bridges import BridgeLiveness, queue_entry, topic_entry
from gearhorn.store.redisconn import REDIS_ERRORS
from gearhorn.store.registry import Registry

log = logging.getLogger(__name__)


class Registrations:
    """Topic subscriptions and temp queues of one bridge, with its liveness."""

    def __init__(self, registry: Registry, bridge_id: str, ttl: float,
                 heartbeat_interval: float) -> None:
        self.registry = registry
        self.bridge_id = bridge_id
        self.liveness = BridgeLiveness(registry, bridge_id, ttl)
        self.heartbeat_interval = heartbeat_interval
        # What the heartbeat tells the console (the server's connections).
        self.describe: Callable[[], dict[str, object]] = dict
        self._heart: gevent.Greenlet | None = None

    def subscribe_topic(self, pattern: str, client_id: str, durable: bool = False,
                        limits: Limits | None = None, linger: int | None = None) -> None:
        """``linger``: for a stream reader, seconds its topic's history is kept
        after the last reader left (gearhorn/store/registry.py)."""
        subscription = Subscription(validate_topic(pattern, allow_prefix=True), client_id,
                                    limits, bridge=self.bridge_id, durable=durable)
        if not durable:  # listed first, so a crash right after leaves nothing unlisted
            self.liveness.holds(topic_entry(pattern, client_id), subscription)
        self.registry.subscribe(subscription, linger)

    def unsubscribe_topic(self, pattern: str, client_id: str) -> None:
        entry = topic_entry(pattern, client_id)
        self.liveness.releasing(entry)
        self.registry.unsubscribe(Subscription(pattern, client_id))
        self.liveness.released(entry)  # listed until now, so a crash leaves nothing unlisted

    def temp_queue_opened(self, function: str) -> None:
        self.liveness.holds(queue_entry(function))

    def temp_queue_closed(self, function: str) -> None:
        self.liveness.released(queue_entry(function))

    def temp_queue_exists(self, function: str) -> bool:
        """Whether some bridge's connection holds this temp queue now."""
        return bool(self.registry.redis.sismember(self.registry.keys.temp_queues, function))

    def start(self) -> None:
        self._heart = gevent.spawn(self._heartbeats)

    def stop_heartbeats(self) -> None:
        if self._heart is not None:
            self._heart.kill(block=False)

    def retire(self) -> None:
        """A clean stop: what the bridge held goes (after its sessions ended)."""
        self.stop_heartbeats()
        try:
            self.liveness.retire()
        except REDIS_ERRORS as exc:
            log.warning("could not retire bridge %s: %s", self.bridge_id, exc)

    def _heartbeats(self) -> None:
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        outage = Outage(log, "redis (bridge heartbeat)")
        fault = Fault(log, f"bridge {self.bridge_id}: heartbeat")
        while True:
            try:
                self.liveness.heartbeat()
                self.liveness.tell({**info, **self.describe()})
                outage.succeeded()
                fault.succeeded()
            except REDIS_ERRORS as exc:
                outage.failed(exc)
            except Exception as exc:  # noqa: BLE001 - a beat lost; the next ones must still come
                fault.failed(exc)
            gevent.sleep(self.heartbeat_interval)
