"""``gearhorn up``: everything on loopback, for a first broadcast in minutes.

Redis, a Gearman server, the STOMP bridge, the web console and the worker pool.

Starts only what is missing: a Redis or Gearman server already listening at
the configured address is used as it is. Started servers keep their data in
``data_dir`` and stop with us (Ctrl-C, SIGTERM, or our death).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from urllib.parse import urlparse

import redis

from gearhorn import gearman, ports, queueupgrade, servers
from gearhorn.config import Config, to_env
from gearhorn.store import durability, redisconn
from gearhorn.store.dashed import DashedFunctions
from gearhorn.store.heldcopies import HeldCopies
from gearhorn.store.keys import Keys
from gearhorn.store.redisconn import REDIS_ERRORS
from gearhorn.store.registry import Registry
from gearhorn.worker import replay
from gearhorn.worker.pool import Pool

log = logging.getLogger(__name__)
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


_PERSISTENCE_NOTES = {
    "redis": "durable: gearmand's redis queue in {url} (AOF), survives kill -9 of everything",
    "sqlite": "durable: gearmand's sqlite queue in {dir}/gearmand.sqlite (slow: ~1,300 jobs/s)",
    "none": "NONE: queued copies are lost if gearmand stops (--persistence redis keeps them)",
}


class Embedded:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.started: list[servers.Managed] = []
        self.notes: dict[str, str] = {}
        self.gearmand: servers.Managed | None = None
        self.queue_redis: servers.Managed | None = None
        self._stopping = threading.Event()

    def run(self) -> int:
        try:
            self._ensure_redis()
            self._ensure_gearman()
            self.notes["acks"] = "\n            ".join(durability.check_at_start(self.config))
            self._ensure_bridge()
            self._ensure_web()
            threading.Thread(target=self._announce_when_ready, daemon=True).start()
            threading.Thread(target=self._restart_crashed, daemon=True).start()
            return Pool(self.config).run()
        finally:
            self._stopping.set()
            for server in reversed(self.started):
                server.stop()

    def _keys(self) -> Keys:
        return Keys.for_config(self.config)

    def _registry_redis(self) -> redis.Redis:
        return redisconn.for_config(self.config, socket_timeout=30)

    def _restart_crashed(self) -> None:
        """Start gearmand again when it, or the Redis holding its queue, crashed
        (a clean exit is a stop someone asked for). gearmand 1.1.20 never
        reconnects to its queue's Redis, so a restarted Redis restarts gearmand."""
        while not self._stopping.wait(0.5):
            queue_crashed = _crashed(self.queue_redis)
            if not (queue_crashed or _crashed(self.gearmand)):
                continue
            log.warning("%s crashed: starting it again", "gearmand's queue Redis"
                        if queue_crashed else "gearmand")
            try:
                if queue_crashed:
                    self._replace(self.queue_redis, self._start_queue_redis())
                self.gearmand.stop()
                self._replace(self.gearmand, self._start_gearmand(self.gearmand.port))
                log.warning("gearmand started again on port %s", self.gearmand.port)
            except (servers.ServerError, *REDIS_ERRORS, gearman.GearmanError) as exc:
                log.error("could not restart gearmand: %s (trying again)", exc)

    def _replace(self, old: servers.Managed, new: servers.Managed) -> None:
        self.started[self.started.index(old)] = new
        if old is self.gearmand:
            self.gearmand = new
        else:
            self.queue_redis = new

    def _ensure_redis(self) -> None:
        url = urlparse(self.config.redis_url)
        host, port = url.hostname or "127.0.0.1", url.port or 6379
        if servers.is_listening(host, port):
            if not ports.answers_as_redis(host, port):
                raise ports.not_what_was_expected(host, port, ports.REDIS_URL, "Redis")
            self.notes["redis"] = "already running, used as is"
            return
        if host not in _LOOPBACK:
            raise servers.ServerError(f"Redis at {host}:{port} is not reachable")
        redis_server = servers.start_redis(port, self.config.data_dir, appendonly=True)
        self.started.append(redis_server)
        self.notes["redis"] = f"started, data in {self.config.data_dir}/"
        _tell_repairs(redis_server)

    def _ensure_gearman(self) -> None:
        host, port = self.config.gearman_servers[0]
        if servers.is_listening(host, port):
            if not ports.answers_as_gearmand(host, port, self.config.gearman_tls):
                raise ports.not_what_was_expected(host, port, ports.GEARMAN_SERVERS, "gearmand")
            self.notes["gearman"] = "already running, used as is"
            self.notes["persistence"] = "whatever the running gearmand was started with"
            return  # persistence auto assumes nothing of it
        if host not in _LOOPBACK:
            raise servers.ServerError(f"gearmand at {host}:{port} is not reachable")
        if not servers.find_binary("gearmand"):
            self.started.append(servers.start_gear_server(port, self.config.data_dir))
            self.notes["gearman"] = "started gear.Server (gearmand is not installed)"
            self.notes["persistence"] = "none: gear.Server keeps jobs in memory only"
            self.config = self.config.replace(persistence="none")
            return
        if self.config.persistence == "auto":  # the gearmand started here
            if self.config.copies == "held":
                # gearhorn holds its copies: gearmand keeps only the jobs
                # submitted straight to it, in sqlite (no Redis of its own).
                self._upgrade_queue()
                self.config = self.config.replace(persistence="sqlite")
            else:  # its redis queue holds the copies
                self.config = self.config.replace(persistence="redis")
        if self.config.persistence == "redis":
            self._ensure_queue_redis()
        self.gearmand = self._start_gearmand(port)
        self.started.append(self.gearmand)
        version = " ".join(gearman.admin(host, port, "version", tls=self.config.gearman_tls))
        self.notes["gearman"] = f"started gearmand ({version})"
        note = _PERSISTENCE_NOTES[self.config.persistence].format(
            url=self.config.queue_redis_urls[0], dir=self.config.data_dir)
        if self.config.copies == "held":  # gearmand keeps only its own jobs then
            note = (f"{note}, for jobs submitted straight to gearmand (gearman -b): every "
                    f"copy gearhorn makes, and every SEND, is held in the registry's Redis")
        self.notes["persistence"] = note

    def _upgrade_queue(self) -> None:
        """Copies an older gearhorn left in gearmand's redis queue in
        ``data_dir`` become held copies (gearhorn/queueupgrade.py); the
        directory is then renamed, so later starts skip this."""
        old = os.path.join(self.config.data_dir, "gearmand-queue")
        if not os.path.isdir(old):
            return
        queue_redis = servers.start_redis(servers.free_port(), old, appendonly=True,
                                          barrier=False)
        try:
            registry = self._registry_redis()
            keys = self._keys()
            queue = redis.Redis(queue_redis.host, queue_redis.port, socket_timeout=60)
            barrier = durability.for_config(self.config, registry, queues=False)
            queueupgrade.move_to_held(queue, HeldCopies(registry, keys), keys,
                                      DashedFunctions(registry, keys).load(), barrier.wait)
            queue.close()
        finally:
            queue_redis.stop()
        os.rename(old, f"{old}.upgraded")
        log.info("gearmand's redis queue is no longer used: %s renamed %s.upgraded", old, old)

    def _ensure_queue_redis(self) -> None:
        url = urlparse(self.config.queue_redis_urls[0])
        host, port = url.hostname or "127.0.0.1", url.port or 6379
        if servers.is_listening(host, port):
            if not ports.answers_as_redis(host, port):
                raise ports.not_what_was_expected(host, port, ports.QUEUE_REDIS_URL, "Redis")
            return
        if host not in _LOOPBACK:
            raise servers.ServerError(f"the Redis for gearmand's queue at {host}:{port} "
                                      "is not reachable")
        self.queue_redis = self._start_queue_redis()
        self.started.append(self.queue_redis)

    def _start_queue_redis(self) -> servers.Managed:
        port = urlparse(self.config.queue_redis_urls[0]).port or 6379
        # A maxmemory with noeviction: a full queue Redis refuses new jobs
        # (the workers refuse fanouts at queue_store_guard of it) instead of
        # growing until the OOM killer stops it, or evicting queued jobs.
        limit = self.config.queue_maxmemory
        extra = ["--maxmemory", str(limit), "--maxmemory-policy", "noeviction"] if limit else []
        data_dir = os.path.join(self.config.data_dir, "gearmand-queue")
        queue = servers.start_redis(port, data_dir, appendonly=True, cpus=self._queue_cpus(),
                                    extra=extra)
        _tell_repairs(queue)
        return queue

    def _queue_cpus(self) -> set[int] | None:
        return servers.queue_cpus() if self.config.pin_queue else None

    def _start_gearmand(self, port: int) -> servers.Managed:
        """gearmand with the configured queue; with the redis queue, the jobs it
        would replay wrong are held before and resubmitted after (replay.py)."""
        if self.config.persistence != "redis":
            return servers.start_gearmand(port, self.config.data_dir,
                                          queue=self.config.persistence)
        url = urlparse(self.config.queue_redis_urls[0])
        queue = redis.Redis.from_url(self.config.queue_redis_urls[0], socket_timeout=60)
        return replay.start_mended(queue, self._registry_redis(), self._keys(), lambda: (
            servers.start_gearmand(port, self.config.data_dir, queue="redis",
                                   queue_server=(url.hostname or "127.0.0.1", url.port or 6379),
                                   cpus=self._queue_cpus())))

    def _ensure_bridge(self) -> None:
        host, port = self.config.bridge_host, self.config.bridge_port
        if servers.is_listening(host, port):
            if not ports.answers_as_bridge(host, port):
                # RabbitMQ's STOMP plugin, say: gearhorn starts without its bridge.
                self.notes["stomp"] = f"off: {ports.UP_BRIDGE_PORT.explain(host, port, 'is taken')}"
                self.notes["websocket"] = "off: no bridge started"
                self.config = self.config.replace(bridge_ws_port=0)
                return
            self.notes["stomp"] = "already running, used as is"
            return
        ws_port = self.config.bridge_ws_port
        if ws_port and servers.is_listening(host, ws_port):
            # Another program (RabbitMQ's web-stomp, say) has it: STOMP over
            # TCP still starts, and the banner says why WebSocket did not.
            self.notes["websocket"] = f"off: port {ws_port} is taken"
            self.config = self.config.replace(bridge_ws_port=0)
        self.started.append(servers.start_bridge(to_env(self.config), host, port))
        self.notes["stomp"] = "started"

    def _ensure_web(self) -> None:
        host, port = self.config.web_host, self.config.web_port
        if not port:
            self.notes["web"] = "off"
            return
        if servers.is_listening(host, port):
            # RabbitMQ's management UI uses 15672 too: gearhorn still starts.
            self.notes["web"] = f"off: port {port} is taken"
            return
        self.started.append(servers.start_web(to_env(self.config), host, port))
        self.notes["web"] = f"http://{host}:{port}/  (metrics at /metrics)"

    def _announce_when_ready(self) -> None:
        registry = Registry(redisconn.for_config(self.config),
                            Keys.for_config(self.config))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if len(registry.live_workers()) >= self.config.processes:
                    break
            except REDIS_ERRORS:
                pass
            time.sleep(0.2)
        print(banner(self.config, self.notes), flush=True)


def _tell_repairs(server: servers.Managed) -> None:
    """A torn AOF cut back at start (after a power cut): said on the terminal."""
    if "repaired" in server.details:
        log.warning("Redis on port %d started after repairing its append-only file: %s",
                    server.port, server.details["repaired"])


def _crashed(server: servers.Managed | None) -> bool:
    return server is not None and server.process.poll() not in (None, 0)


def websocket_url(config: Config) -> str:
    """Where browsers connect, or "" when STOMP over WebSocket is off."""
    if not config.bridge_ws_port:
        return ""
    scheme = "wss" if config.stomp_tls_cert else "ws"
    return f"{scheme}://{config.bridge_host}:{config.bridge_ws_port}/ws"


def banner(config: Config, notes: dict[str, str]) -> str:
    host, port = config.gearman_servers[0]
    g = f"gearman -h {host} -p {port}"
    return f"""
gearhorn is up.
  redis     {config.redis_url}  ({notes.get('redis', '')})
  gearman   {host}:{port}  ({notes.get('gearman', '')})
  queue     {notes.get('persistence', '')}
  acks      {notes.get('acks', '')}
  stomp     {config.bridge_host}:{config.bridge_port}  ({notes.get('stomp', '')})
  websocket {websocket_url(config) or notes.get('websocket', 'off')}
  console   {notes.get('web', 'off')}
  workers   {config.processes} processes

Broadcast from another terminal:
  {g} -f subscribe_fanout '{{"topic": "news", "client_id": "alice"}}'
  {g} -f fanout '{{"topic": "news", "payload": "hello", "background": true}}'
  {g} -w -c 1 -f news_alice        # prints alice's copy: hello

Press Ctrl-C to stop everything.
"""
