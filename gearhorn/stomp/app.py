"""Running the bridge: the composition root that builds its parts and wires
them to the server and the signals."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

import gevent
import gevent.event

from gearhorn import gearman
from gearhorn.config import Config, to_env
from gearhorn.rules import auth
from gearhorn.rules.events import Event
from gearhorn.rules.naming import process_id
from gearhorn.runtime import collector
from gearhorn.runtime.background import Backoff
from gearhorn.runtime.children import die_with_parent
from gearhorn.stomp.flusher import LedgerFlusher
from gearhorn.stomp.protocol.frames import FrameLimits
from gearhorn.stomp.protocol.rules import SessionSettings
from gearhorn.stomp.queues.attachments import Attachments
from gearhorn.stomp.queues.bounds import QueueBounds
from gearhorn.stomp.queues.counts import QueueCounts
from gearhorn.stomp.queues.giveback import GiveBack
from gearhorn.stomp.queues.maxdeliveries import DeadLetterer
from gearhorn.stomp.queues.publisher import Publisher
from gearhorn.stomp.queues.registrations import Registrations
from gearhorn.stomp.queues.replies import Requester
from gearhorn.stomp.sessions.backend import Backend
from gearhorn.stomp.sessions.logins import Logins
from gearhorn.stomp.topics.appending import HistoryFirst
from gearhorn.stomp.topics.feeds import TopicFeeds
from gearhorn.stomp.transport.server import BridgeServer
from gearhorn.store import durability, redisconn
from gearhorn.store.deadletters import DeadLetterIndex
from gearhorn.store.delayed import Scheduler
from gearhorn.store.directcalls import DirectCalls
from gearhorn.store.headers import HeaderStore
from gearhorn.store.heldcopies import HeldCopies
from gearhorn.store.history import History
from gearhorn.store.holders import Holders
from gearhorn.store.holding import HoldingClient
from gearhorn.store.keys import Keys
from gearhorn.store.ledger import Ledger
from gearhorn.store.observers import LedgerObserver, Observers, StatsObserver
from gearhorn.store.presenceevents import announce_changes
from gearhorn.store.redeliveries import Redeliveries
from gearhorn.store.registry import Registry
from gearhorn.store.stats import Stats
from gearhorn.store.subscribers import SubscriberCache

log = logging.getLogger(__name__)


def _credentials(config: Config) -> auth.Credentials:
    if not config.stomp_credentials_file:
        log.warning("no stomp_credentials_file: anyone who reaches the bridge may connect")
        return auth.Credentials.open()
    credentials = auth.load(config.stomp_credentials_file)
    log.info("STOMP logins checked against %s (%d users, anonymous %s)",
             config.stomp_credentials_file, len(credentials.users),
             "allowed" if credentials.anonymous else "refused")
    return credentials


class Bridge:
    """One bridge process: its server and the background work of its parts."""

    def __init__(self, server: BridgeServer, registrations: Registrations,
                 flusher: LedgerFlusher, attachments: Attachments,
                 history_first: HistoryFirst | None = None,
                 holding: HoldingClient | None = None) -> None:
        self.server = server
        self.holding = holding
        self.registrations = registrations
        self.flusher = flusher
        self.attachments = attachments
        self.history_first = history_first

    def start(self) -> None:
        """Heartbeats and the ledger's flusher, then the connections."""
        if self.holding is not None:
            # Alive before holding anything: a holder not seen alive has its
            # copies taken over by the other processes.
            self.registrations.liveness.heartbeat()
            self.holding.start()
        self.registrations.start()
        self.flusher.start()
        self.server.start()

    def stop(self) -> None:
        """Close every connection (unacked messages go back to gearmand), let
        the queues give back what they held, write the last ledger events,
        then remove what this bridge held in Redis."""
        self.server.stop(timeout=5)
        if self.history_first is not None:  # so nobody waits for their pens to lapse
            self.history_first.give_back_pens(timeout=5)
        self.attachments.wait_released(timeout=10)
        if self.holding is not None:  # let go of them before others take them over
            self.holding.stop()
        # Beating until here: the holder's heartbeat (worker_ttl) must not
        # lapse while its copies are still held and given back.
        self.registrations.stop_heartbeats()
        self.flusher.stop()
        self.registrations.retire()


def build_bridge(config: Config) -> Bridge:
    """The composition root: each part gets only the settings it uses."""
    logins = Logins(_credentials(config))  # a bad file stops us before anything connects
    # Thousands of greenlets may need Redis at once (a burst of SUBSCRIBEs):
    # they wait for one of 64 connections instead of failing (redis-py's
    # plain pool raises "Too many connections" beyond 100).
    client = redisconn.for_config(config, max_connections=64, socket_timeout=10,
                                  socket_connect_timeout=5)
    keys = Keys.for_config(config)
    # The per-message calls (append, look-up, stream reads) skip the pool.
    direct = DirectCalls(client)
    registry = Registry(client, keys, direct)
    announce_changes(config, registry)  # presence events, if asked for
    # Unique across hosts and restarts: the janitor cleans up by this id.
    bridge_id = process_id()
    servers, tls = config.gearman_servers, config.gearman_tls
    headers = HeaderStore(client, keys, config.headers_ttl)
    bounds = QueueBounds(registry)
    ledger = Ledger(client, keys, config.ledger_maxlen, config.ledger_enabled,
                    source=f"bridge-{bridge_id}", shards=config.ledger_shards,
                    held=config.copies == "held")
    # Counts of the SENDs no worker fans out (gearhorn/stomp/topics/appending.py).
    stats = Stats(client, keys, config.metrics_enabled, buffered=True)
    flusher = LedgerFlusher(ledger, bounds, stats)
    observer = LedgerObserver(ledger, recorded=flusher.recorded)
    history = History(client, keys, config.history_policy, direct)
    streams = TopicFeeds(history, observer)
    history_first = HistoryFirst(history, SubscriberCache(registry), streams,
                                 Observers(observer, StatsObserver(stats)), caller=bridge_id)
    streams.own_pens = history_first.pens  # their topics' feeds need not read meanwhile
    acks = durability.for_config(config, client)
    holding = None
    if config.copies == "held":  # the bridge's background jobs are copies it holds
        def answered(queue: str, unique: str, status: str, generation: int,
                     handle: str) -> None:
            ledger.record(Event.ANSWERED, queue, unique, reason=status, generation=generation,
                          handle=handle)
            flusher.recorded()

        holding = HoldingClient(gearman.Client(servers, tls=tls), HeldCopies(client, keys),
                                Holders(client, keys), bridge_id, config.worker_ttl,
                                config.heartbeat_interval, tls, answered, durability=acks,
                                counts=ledger.counts if ledger.enabled else None)
    publisher = Publisher(servers, tls, headers,
                          Scheduler(client, keys, config.delay_shard_seconds,
                                    config.delay_lease, config.delay_lanes),
                          bounds, config.fanout_timeout, history_first=history_first,
                          holding=holding)
    # Five times a worker's: the janitor removes a bridge's subscriptions
    # only when it is surely dead, not merely busy for a few seconds. Its
    # held copies, though, are taken over as soon as a dead worker's (their
    # lease is the HoldingClient's own).
    registrations = Registrations(registry, bridge_id, 5 * config.worker_ttl,
                                  config.heartbeat_interval)
    handouts = Redeliveries(client, keys, config.headers_ttl, direct)
    dead_letterer = DeadLetterer(publisher, DeadLetterIndex(client, keys, stats), observer)
    attachments = Attachments(servers, tls, bridge_id, headers_of=headers.for_uniques,
                              dead_letter=dead_letterer,
                              max_deliveries=config.max_deliveries, handouts=handouts,
                              give_back=GiveBack(handouts, tls), bounds=bounds)
    backend = Backend(logins=logins, publisher=publisher,
                      requests=Requester(publisher, headers, registrations,
                                         config.request_timeout),
                      queues=attachments, registrations=registrations,
                      counts=QueueCounts(attachments, registry), observer=observer,
                      streams=streams,
                      durability=acks)
    server = _server(config, backend)
    registrations.describe = lambda: {"connections": len(server.connections)}
    return Bridge(server, registrations, flusher, attachments, history_first, holding)


def _server(config: Config, backend: Backend) -> BridgeServer:
    limits = FrameLimits(config.stomp_max_frame_bytes, config.stomp_max_headers,
                    config.stomp_max_header_length)
    settings = SessionSettings(heartbeat_send_ms=config.stomp_heartbeat_ms,
                               heartbeat_receive_ms=config.stomp_heartbeat_ms,
                               max_subscriptions=config.stomp_max_subscriptions,
                               max_backlog=config.stomp_max_backlog_bytes,
                               max_payload_bytes=config.max_payload_bytes)
    return BridgeServer(backend, config.bridge_host, config.bridge_port, limits=limits,
                        settings=settings, max_connections=config.stomp_max_connections,
                        connect_timeout=config.stomp_connect_timeout,
                        frame_timeout=config.stomp_frame_timeout,
                        certfile=config.stomp_tls_cert or None,
                        keyfile=config.stomp_tls_key or None,
                        ws_port=config.bridge_ws_port or None,
                        reuse_port=config.bridge_reuse_port or config.bridge_processes > 1)


def run_bridge(config: Config) -> int:
    """Serve until SIGTERM or SIGINT; then close every connection (unacked
    messages go back to gearmand) and exit. With ``bridge_processes`` N,
    this process is one of N bridges on the same ports (each a bridge of
    its own in the registry: topic subscriptions stay right whichever one
    a client reaches); it starts the others and stops them with itself."""
    bridge = build_bridge(config)
    durability.check_at_start(config)  # a setting that cannot be kept stops the start here
    stop = gevent.event.Event()
    gevent.signal_handler(signal.SIGTERM, stop.set)
    gevent.signal_handler(signal.SIGINT, stop.set)
    bridge.start()
    collector.tune_for_serving()  # half the bridge's time under load, left as it was
    siblings = [gevent.spawn(_sibling, config, n, stop)
                for n in range(1, config.bridge_processes)]
    stop.wait()
    log.info("bridge stopping")
    gevent.joinall(siblings, timeout=30)
    bridge.stop()
    return 0


def _sibling(config: Config, number: int, stop: gevent.event.Event) -> None:
    """Keep bridge process ``number`` running until ``stop``; then SIGTERM it."""
    env = {**os.environ, **to_env(config.replace(bridge_processes=1, bridge_reuse_port=True))}
    backoff = Backoff(0.5, cap=10.0)
    while not stop.is_set():
        child = subprocess.Popen([sys.executable, "-m", "gearhorn.stomp"], env=env,
                                 preexec_fn=die_with_parent)
        log.info("bridge process %d started (pid %d)", number, child.pid)
        started = time.monotonic()
        while child.poll() is None and not stop.wait(0.5):
            pass
        if child.poll() is None:
            child.terminate()
            child.wait()
            return
        log.warning("bridge process %d exited with %s; restarting", number, child.returncode)
        if time.monotonic() - started > 5:
            backoff.succeeded()  # it ran a while: restart at once, not after a pause
        stop.wait(backoff.failed())
