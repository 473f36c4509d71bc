"""Running the bridge: wire the broker, the server and the signals together."""

from __future__ import annotations

import logging
import signal

import gevent
import gevent.event
import redis

from gearhorn.config import Config
from gearhorn.keys import Keys
from gearhorn.naming import process_id
from gearhorn.registry import Registry
from gearhorn.stomp import auth
from gearhorn.stomp.broker import Broker
from gearhorn.stomp.frames import Limits
from gearhorn.stomp.rules import SessionSettings
from gearhorn.stomp.server import BridgeServer

log = logging.getLogger(__name__)


def build_server(config: Config) -> BridgeServer:
    # Thousands of greenlets may need Redis at once (a burst of SUBSCRIBEs):
    # they wait for one of 64 connections instead of failing (redis-py's
    # plain pool raises "Too many connections" beyond 100).
    pool = redis.BlockingConnectionPool.from_url(config.redis_url, max_connections=64,
                                                 timeout=30, socket_timeout=10,
                                                 socket_connect_timeout=5)
    registry = Registry(redis.Redis(connection_pool=pool),
                        Keys(config.key_prefix, config.matchmaking_channel))
    if config.stomp_credentials_file:
        credentials = auth.load(config.stomp_credentials_file)
        log.info("STOMP logins checked against %s (%d users, anonymous %s)",
                 config.stomp_credentials_file, len(credentials.users),
                 "allowed" if credentials.anonymous else "refused")
    else:
        credentials = auth.Credentials.open()
        log.warning("no stomp_credentials_file: anyone who reaches the bridge may connect")
    # Unique across hosts and restarts: the janitor cleans up by this id.
    bridge_id = process_id()
    broker = Broker(config, registry, bridge_id=bridge_id, credentials=credentials)
    broker.start()
    limits = Limits(config.stomp_max_frame_bytes, config.stomp_max_headers,
                    config.stomp_max_header_length)
    settings = SessionSettings(heartbeat_send_ms=config.stomp_heartbeat_ms,
                               heartbeat_receive_ms=config.stomp_heartbeat_ms,
                               max_subscriptions=config.stomp_max_subscriptions,
                               max_backlog=config.stomp_max_backlog_bytes,
                               max_payload_bytes=config.max_payload_bytes)
    return BridgeServer(broker, config.bridge_host, config.bridge_port, limits=limits,
                        settings=settings, max_connections=config.stomp_max_connections,
                        connect_timeout=config.stomp_connect_timeout,
                        frame_timeout=config.stomp_frame_timeout,
                        certfile=config.stomp_tls_cert or None,
                        keyfile=config.stomp_tls_key or None,
                        ws_port=config.bridge_ws_port or None)


def run_bridge(config: Config) -> int:
    """Serve until SIGTERM or SIGINT; then close every connection (unacked
    messages go back to gearmand) and exit."""
    server = build_server(config)
    stop = gevent.event.Event()
    gevent.signal_handler(signal.SIGTERM, stop.set)
    gevent.signal_handler(signal.SIGINT, stop.set)
    server.start()
    stop.wait()
    log.info("bridge stopping")
    server.stop(timeout=5)
    server.broker.retire()
    return 0
