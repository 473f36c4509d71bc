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

from gearhorn import gearman
from gearhorn.config import UP_STORE_BOUND, Config, to_env
from gearhorn.runtime import ports
from gearhorn.store import durability, redisconn
from gearhorn.store.heldcopies import HeldCopies
from gearhorn.store.keys import Keys
from gearhorn.store.redisconn import REDIS_ERRORS
from gearhorn.store.registry import Registry
from gearhorn.supervision import queueupgrade, servers
from gearhorn.worker.pool import Pool

log = logging.getLogger(__name__)
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


_PERSISTENCE_NOTES = {
    "sqlite": "durable: gearmand's sqlite queue in {dir}/gearmand.sqlite (slow: ~1,300 jobs/s)",
    "none": "NONE: jobs queued in gearmand are lost if it stops (--persistence sqlite keeps "
            "them)",
}


class Embedded:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.started: list[servers.Managed] = []
        self.notes: dict[str, str] = {}
        self.gearmand: servers.Managed | None = None
        self.audit: servers.Managed | None = None
        self.audit_folder = os.path.join(config.data_dir, "audit")
        self.audit_restarts = 0
        self.audit_due = 0.0  # monotonic time of its next start after it stopped
        self._stopping = threading.Event()

    def run(self) -> int:
        try:
            self._ensure_redis()
            self._ensure_gearman()
            self.notes["acks"] = "\n            ".join(durability.check_at_start(self.config))
            self._ensure_bridge()
            self._ensure_web()
            self._ensure_audit()
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
        """Start gearmand again when it crashed (a clean exit is a stop
        someone asked for; the held copies it had go to it again), and the
        live audit whenever it stopped (the banner says it is live)."""
        while not self._stopping.wait(0.5):
            self._restart_audit()
            if not _crashed(self.gearmand):
                continue
            log.warning("gearmand crashed: starting it again")
            try:
                self.gearmand.stop()  # reaped, its companions too
                new = self._start_gearmand(self.gearmand.port)
                self.started[self.started.index(self.gearmand)] = new
                self.gearmand = new
                log.warning("gearmand started again on port %s", self.gearmand.port)
            except (servers.ServerError, gearman.GearmanError) as exc:
                log.error("could not restart gearmand: %s (trying again)", exc)

    def _restart_audit(self) -> None:
        """Again after 1, 2, 4 ... 60 s: an audit that cannot start (its
        Redis away) is not started in a loop."""
        if self.audit is None or self.audit.process.poll() is None:
            return
        now = time.monotonic()
        if not self.audit_due:
            self.audit_due = now + min(60.0, 2.0 ** self.audit_restarts)
            log.warning("the live audit stopped (exit status %s): starting it again in %g s",
                        self.audit.process.returncode, self.audit_due - now)
            return
        if now < self.audit_due or self._stopping.is_set():
            return
        self.audit_restarts += 1
        self.audit_due = 0.0
        new = servers.start_audit(to_env(self.config), self.audit_folder)
        self.started[self.started.index(self.audit)] = new
        self.audit = new

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
        if not self.config.queue_maxmemory:  # it holds gearhorn's alone: bound the copies
            self.config = self.config.replace(queue_maxmemory=UP_STORE_BOUND)
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
        if self.config.persistence == "redis":
            raise servers.ServerError(
                "gearhorn up no longer runs gearmand on its redis queue: gearhorn holds its "
                "copies in the registry's Redis, and gearmand keeps the jobs submitted "
                "straight to it in sqlite (persistence = auto or sqlite; "
                "docs/design/gearmand.rst, \"What went\")")
        self._upgrade_queue()  # an older data directory's copies, from its queue Redis
        if self.config.persistence == "auto":  # gearmand keeps only its own jobs
            self.config = self.config.replace(persistence="sqlite")
        self.gearmand = self._start_gearmand(port)
        self.started.append(self.gearmand)
        version = " ".join(gearman.admin(host, port, "version", tls=self.config.gearman_tls))
        self.notes["gearman"] = f"started gearmand ({version})"
        note = _PERSISTENCE_NOTES[self.config.persistence].format(dir=self.config.data_dir)
        if self.config.copies == "held":  # gearmand keeps only its own jobs then
            note = (f"{note}, for jobs submitted straight to gearmand (gearman -b): every "
                    f"copy gearhorn makes, and every SEND, is held in the registry's Redis")
        self.notes["persistence"] = note

    def _upgrade_queue(self) -> None:
        """Copies an older gearhorn left in gearmand's redis queue in
        ``data_dir`` become held copies (gearhorn/supervision/queueupgrade.py); the
        directory is then renamed, so later starts skip this."""
        old = os.path.join(self.config.data_dir, "gearmand-queue")
        if not os.path.isdir(old):
            return
        if self.config.copies != "held":  # nobody would hand the records out
            log.error("%s holds the copies of an older gearhorn: they are delivered at the "
                      "first start with copies = held", old)
            return
        queue_redis = servers.start_redis(servers.free_port(), old, appendonly=True,
                                          barrier=False)
        try:
            registry = self._registry_redis()
            keys = self._keys()
            queue = redis.Redis(queue_redis.host, queue_redis.port, socket_timeout=60)
            barrier = durability.for_config(self.config, registry)
            queueupgrade.move_to_held(queue, HeldCopies(registry, keys), keys,
                                      queueupgrade.dashed_functions(registry, keys),
                                      barrier.wait)
            queue.close()
        finally:
            queue_redis.stop()
        os.rename(old, f"{old}.upgraded")
        log.info("gearmand's redis queue is no longer used: %s renamed %s.upgraded", old, old)

    def _start_gearmand(self, port: int) -> servers.Managed:
        return servers.start_gearmand(port, self.config.data_dir, queue=self.config.persistence)

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

    def _ensure_audit(self) -> None:
        if not self.config.audit_enabled:
            self.notes["audit"] = "off (--no-audit)"
            return
        folder = self.audit_folder
        self.audit = servers.start_audit(to_env(self.config), folder)
        self.started.append(self.audit)
        self.notes["audit"] = (f"live: a copy not delivered within "
                               f"{self.config.audit_deadline:g} s while its subscriber takes "
                               f"others is a finding (here, at /metrics, in {folder}/findings)")

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
  audit     {notes.get('audit', 'off')}
  workers   {config.processes} processes

Broadcast from another terminal:
  {g} -f subscribe_fanout '{{"topic": "news", "client_id": "alice"}}'
  {g} -f fanout '{{"topic": "news", "payload": "hello", "background": true}}'
  {g} -w -c 1 -f news_alice        # prints alice's copy: hello

Press Ctrl-C to stop everything.
"""
