"""Running the bridge: wire the broker, the server and the signals together."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

import gevent
import gevent.event

from gearhorn.background import Backoff
from gearhorn.config import Config, to_env
from gearhorn.naming import process_id
from gearhorn.servers import die_with_parent
from gearhorn.stomp import auth
from gearhorn.stomp.broker import Broker
from gearhorn.stomp.frames import Limits
from gearhorn.stomp.rules import SessionSettings
from gearhorn.stomp.server import BridgeServer
from gearhorn.store import redisconn
from gearhorn.store.keys import Keys
from gearhorn.store.registry import Registry

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


def build_server(config: Config) -> BridgeServer:
    credentials = _credentials(config)  # a bad file stops us before anything connects
    # Thousands of greenlets may need Redis at once (a burst of SUBSCRIBEs):
    # they wait for one of 64 connections instead of failing (redis-py's
    # plain pool raises "Too many connections" beyond 100).
    client = redisconn.for_config(config, max_connections=64, socket_timeout=10,
                                  socket_connect_timeout=5)
    registry = Registry(client, Keys.for_config(config))
    # Unique across hosts and restarts: the janitor cleans up by this id.
    bridge_id = process_id()
    broker = Broker(config, registry, bridge_id=bridge_id, credentials=credentials)
    limits = Limits(config.stomp_max_frame_bytes, config.stomp_max_headers,
                    config.stomp_max_header_length)
    settings = SessionSettings(heartbeat_send_ms=config.stomp_heartbeat_ms,
                               heartbeat_receive_ms=config.stomp_heartbeat_ms,
                               max_subscriptions=config.stomp_max_subscriptions,
                               max_backlog=config.stomp_max_backlog_bytes,
                               max_payload_bytes=config.max_payload_bytes)
    server = BridgeServer(broker, config.bridge_host, config.bridge_port, limits=limits,
                        settings=settings, max_connections=config.stomp_max_connections,
                        connect_timeout=config.stomp_connect_timeout,
                        frame_timeout=config.stomp_frame_timeout,
                        certfile=config.stomp_tls_cert or None,
                        keyfile=config.stomp_tls_key or None,
                        ws_port=config.bridge_ws_port or None,
                        reuse_port=config.bridge_reuse_port or config.bridge_processes > 1)
    broker.describe = lambda: {"connections": len(server.connections)}
    broker.start()  # after the ports are bound: a taken port stops us unregistered
    return server


def run_bridge(config: Config) -> int:
    """Serve until SIGTERM or SIGINT; then close every connection (unacked
    messages go back to gearmand) and exit. With ``bridge_processes`` N,
    this process is one of N bridges on the same ports (each a bridge of
    its own in the registry: topic subscriptions stay right whichever one
    a client reaches); it starts the others and stops them with itself."""
    server = build_server(config)
    stop = gevent.event.Event()
    gevent.signal_handler(signal.SIGTERM, stop.set)
    gevent.signal_handler(signal.SIGINT, stop.set)
    server.start()
    siblings = [gevent.spawn(_sibling, config, n, stop)
                for n in range(1, config.bridge_processes)]
    stop.wait()
    log.info("bridge stopping")
    gevent.joinall(siblings, timeout=30)
    server.stop(timeout=5)
    server.broker.retire()
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
