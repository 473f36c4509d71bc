"""The worker process's composition root: every collaborator built here,
once, each given only the settings it reads (the bridge's is
gearhorn/stomp/app.py's ``build_bridge``).

One Redis client, one key layout and one :class:`Registry` serve the
service, the warden, the janitor and presence events; the subscriber
cache, the header store and the observers are shared the same way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from gearhorn import gearman
from gearhorn.config import Config
from gearhorn.rules.events import Event
from gearhorn.runtime.background import Outage
from gearhorn.store import durability, redisconn
from gearhorn.store.deadletters import DeadLetterIndex
from gearhorn.store.dedup import Deduplicator
from gearhorn.store.delayed import DelayedItem, Releaser, Scheduler
from gearhorn.store.durability import Durability
from gearhorn.store.headers import HeaderStore
from gearhorn.store.heldcopies import HeldCopies
from gearhorn.store.history import History
from gearhorn.store.holders import Holders
from gearhorn.store.holding import HoldingClient
from gearhorn.store.keys import Keys
from gearhorn.store.ledger import Flusher, Ledger
from gearhorn.store.observers import LedgerObserver, Observer, Observers, StatsObserver
from gearhorn.store.presenceevents import PresenceEvents, announce_changes
from gearhorn.store.pressure import Pressure
from gearhorn.store.registry import Registry
from gearhorn.store.rejectroom import RoomKeeper
from gearhorn.store.stats import Stats
from gearhorn.store.subscribers import InvalidationListener, SubscriberCache
from gearhorn.store.tally import TallyWriter
from gearhorn.worker.fanout import Fanouts, FanoutStores
from gearhorn.worker.foreground import ForegroundSettings
from gearhorn.worker.janitor import Janitor
from gearhorn.worker.reaper import Reaper
from gearhorn.worker.service import FanoutService
from gearhorn.worker.warden import Warden, WardenSettings

log = logging.getLogger(__name__)


def fanout_stores(config: Config, registry: Registry) -> FanoutStores:
    """The stores a fanout writes, on the registry's Redis and keys."""
    client, keys = registry.redis, registry.keys
    return FanoutStores(HeaderStore(client, keys, config.headers_ttl),
                        Deduplicator(client, keys, config.dedup_window),
                        History(client, keys, config.history_policy),
                        RoomKeeper(client, keys),
                        Scheduler(client, keys, config.delay_shard_seconds, config.delay_lease,
                                  config.delay_lanes))


def build_service(config: Config, registry: Registry, cache: SubscriberCache,
                  client: gearman.Client, observer: Observer | None = None, *,
                  tally: TallyWriter | None = None, pressure: Pressure | None = None,
                  stores: FanoutStores | None = None,
                  sleep: Callable[[float], None] = time.sleep) -> FanoutService:
    """The Gearman functions' logic over ``registry`` and ``client``."""
    stores = stores or fanout_stores(config, registry)
    fanouts = Fanouts(ForegroundSettings.of(config), stores, cache, client, observer, tally,
                      pressure, sleep)
    return FanoutService(fanouts, registry, stores.history, config.max_payload_bytes, observer)


def _queue_store(config: Config, registry: redis.Redis) -> Callable[[], redis.Redis | None]:
    """The Redis the warden's memory check reads: the registry's, which
    holds the copies (``copies = held``); none with copies in gearmand."""
    return (lambda: registry) if config.copies == "held" else (lambda: None)


@dataclass
class WorkerParts:
    """A worker process's collaborators, built by :func:`build_worker`."""

    worker_id: str
    registry: Registry
    client: gearman.Client
    release_client: gearman.Client  # the releaser's thread has its own
    ledger: Ledger
    pressure: Pressure | None
    service: FanoutService
    flusher: Flusher
    durability: Durability
    warden: Warden | None  # None when retention_interval is 0
    releaser: Releaser
    listener: InvalidationListener
    janitor: Janitor
    presence_events: PresenceEvents | None
    jobs: gearman.JobSource
    holding: HoldingClient | None = None  # copies = held


def build_worker(config: Config, worker_id: str, functions: tuple[str, ...]) -> WorkerParts:
    """Everything a worker process runs with, for ``config``."""
    client_redis = redisconn.for_config(config, socket_timeout=10, socket_connect_timeout=5,
                                        health_check_interval=30)
    keys = Keys.for_config(config)
    registry = Registry(client_redis, keys)

    def gearman_client() -> gearman.Client:
        return gearman.Client(config.gearman_servers, batch=config.submit_batch,
                              tls=config.gearman_tls)

    client, release_client = gearman_client(), gearman_client()
    ledger = Ledger(client_redis, keys, config.ledger_maxlen, config.ledger_enabled,
                    source=worker_id, shards=config.ledger_shards,
                    held=config.copies == "held")
    # Answers wait for an fsync that covers them (gearhorn/store/durability.py):
    # held copies are in the registry's Redis alone, gearmand's queue gets none.
    acks = durability.for_config(config, client_redis)
    holding = None
    if config.copies == "held":  # gearhorn keeps the copies; gearmand dispatches them
        def answered(queue: str, unique: str, status: str, generation: int,
                     handle: str) -> None:
            ledger.record(Event.ANSWERED, queue, unique, reason=status, generation=generation,
                          handle=handle)
            flusher.poke()  # written within 0.1 s, as a fanout's entries are

        holding = HoldingClient(client, HeldCopies(client_redis, keys),
                                Holders(client_redis, keys), worker_id, config.worker_ttl,
                                config.heartbeat_interval, config.gearman_tls, answered,
                                durability=acks,
                                counts=ledger.counts if ledger.enabled else None)
        client, release_client = holding, holding.beside(release_client)
    stats = Stats(client_redis, keys, config.metrics_enabled,
                  buffered=not config.metrics_write_through)
    # Bounded queues (gearhorn/worker/warden.py); retention_interval 0: off.
    bounded = config.retention_interval > 0
    tally = TallyWriter(client_redis, keys) if bounded else None
    pressure = Pressure(client_redis, keys) if bounded else None
    # The ledger and the metrics hear of every step through one observer.
    observer = Observers(LedgerObserver(ledger), StatsObserver(stats))
    cache = SubscriberCache(registry, config.cache_size)
    stores = fanout_stores(config, registry)
    service = build_service(config, registry, cache, client, observer, tally=tally,
                            pressure=pressure, stores=stores)
    flusher = Flusher(*(b for b in (ledger, stats, tally) if b))
    warden = None
    if bounded:
        reaper = Reaper(config.gearman_servers, stores.headers,
                        DeadLetterIndex(client_redis, keys, stats), config.gearman_tls,
                        submit=holding.submit_background if holding else None)
        warden = Warden(WardenSettings.of(config), registry, reaper, observer, worker_id,
                        queue_store=_queue_store(config, client_redis))

    def release(item: DelayedItem) -> None:
        service.fanouts.release(item, release_client)
        flusher.poke()

    # Due delayed messages go out from a thread of their own, with their
    # own Gearman connection (a Client is not shared between threads).
    releaser = Releaser(stores.scheduler, release, config.delay_poll_interval)
    hearers = [releaser.announced, *([pressure.announced] if pressure else [])]

    def announced(data: bytes | str) -> None:
        for hear in hearers:
            hear(data)

    listener = InvalidationListener(client_redis, keys.channel, cache, also=announced,
                                    on_subscribed=releaser.look_now)
    janitor = Janitor(registry, lambda function: gearman.drop_function(
        config.gearman_servers, function, config.gearman_tls))
    return WorkerParts(
        worker_id, registry, client, release_client, ledger, pressure, service, flusher,
        acks, warden, releaser,
        listener, janitor,
        # Subscriptions change through the service, the janitor and the warden: one registry.
        announce_changes(config, registry),
        gearman.JobSource(config.gearman_servers, functions, worker_id, config.gearman_tls,
                          most=config.worker_batch,
                          outages=lambda what: Outage(log, what)), holding)
