"""``gearhorn up``: everything on loopback, for a first broadcast in minutes.

Redis, a Gearman server, the STOMP bridge and the worker pool.

Starts only what is missing: a Redis or Gearman server already listening at
the configured address is used as it is. Started servers keep their data in
``data_dir`` and stop with us (Ctrl-C, SIGTERM, or our death).
"""

from __future__ import annotations

import logging
import threading
import time
from urllib.parse import urlparse

import redis

from gearhorn import gearman, servers
from gearhorn.config import Config, to_env
from gearhorn.keys import Keys
from gearhorn.pool import Pool
from gearhorn.registry import Registry

log = logging.getLogger(__name__)
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


class Embedded:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.started: list[servers.Managed] = []
        self.notes: dict[str, str] = {}

    def run(self) -> int:
        try:
            self._ensure_redis()
            self._ensure_gearman()
            self._ensure_bridge()
            threading.Thread(target=self._announce_when_ready, daemon=True).start()
            return Pool(self.config).run()
        finally:
            for server in reversed(self.started):
                server.stop()

    def _ensure_redis(self) -> None:
        url = urlparse(self.config.redis_url)
        host, port = url.hostname or "127.0.0.1", url.port or 6379
        if servers.is_listening(host, port):
            self.notes["redis"] = "already running, used as is"
            return
        if host not in _LOOPBACK:
            raise servers.ServerError(f"Redis at {host}:{port} is not reachable")
        self.started.append(servers.start_redis(port, self.config.data_dir, appendonly=True))
        self.notes["redis"] = f"started, data in {self.config.data_dir}/"

    def _ensure_gearman(self) -> None:
        host, port = self.config.gearman_servers[0]
        if servers.is_listening(host, port):
            self.notes["gearman"] = "already running, used as is"
            return
        if host not in _LOOPBACK:
            raise servers.ServerError(f"gearmand at {host}:{port} is not reachable")
        if servers.find_binary("gearmand"):
            self.started.append(servers.start_gearmand(port, self.config.data_dir))
            version = " ".join(gearman.admin(host, port, "version"))
            self.notes["gearman"] = f"started gearmand ({version})"
        else:
            self.started.append(servers.start_gear_server(port, self.config.data_dir))
            self.notes["gearman"] = "started gear.Server (gearmand is not installed)"

    def _ensure_bridge(self) -> None:
        host, port = self.config.bridge_host, self.config.bridge_port
        if servers.is_listening(host, port):
            self.notes["stomp"] = "already running, used as is"
            return
        self.started.append(servers.start_bridge(to_env(self.config), host, port))
        self.notes["stomp"] = "started"

    def _announce_when_ready(self) -> None:
        registry = Registry(redis.Redis.from_url(self.config.redis_url),
                            Keys(self.config.key_prefix, self.config.matchmaking_channel))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if len(registry.live_workers()) >= self.config.processes:
                    break
            except redis.RedisError:
                pass
            time.sleep(0.2)
        print(banner(self.config, self.notes), flush=True)


def banner(config: Config, notes: dict[str, str]) -> str:
    host, port = config.gearman_servers[0]
    g = f"gearman -h {host} -p {port}"
    return f"""
gearhorn is up.
  redis     {config.redis_url}  ({notes.get('redis', '')})
  gearman   {host}:{port}  ({notes.get('gearman', '')})
  stomp     {config.bridge_host}:{config.bridge_port}  ({notes.get('stomp', '')})
  workers   {config.processes} processes

Broadcast from another terminal:
  {g} -f subscribe_fanout '{{"topic": "news", "client_id": "alice"}}'
  {g} -f fanout '{{"topic": "news", "payload": "hello", "background": true}}'
  {g} -w -c 1 -f news_alice        # prints alice's copy: hello

Press Ctrl-C to stop everything.
"""
