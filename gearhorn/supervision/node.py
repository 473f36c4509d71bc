"""``gearhorn node SELF PEER PEER``: everything one node of a three-node
deployment runs, started in order and started again when it dies
(docs/operations.rst, "Three nodes").

Redis (master or replica: gearhorn/supervision/noderole.py), its fsync
barrier, a Sentinel, a plain gearmand, the worker pool, the STOMP bridge
and the console, each bound to the node's own address; the pool and the
bridge follow the master the Sentinels name and acknowledge once a
replica has each write (``min_replicas = 1``) and an fsync covers it.
``--only PART`` runs one of them, for a service manager that runs each
part as its own service (etc/systemd/).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from gearhorn.config import Config, to_env
from gearhorn.runtime.background import Backoff
from gearhorn.runtime.children import die_with_parent
from gearhorn.supervision import noderole
from gearhorn.supervision.aofsync import AofSyncer
from gearhorn.supervision.servers import GEARMAND_HASH_BUCKETS, ServerError, find_binary

log = logging.getLogger(__name__)

REDIS_PORT, SENTINEL_PORT, GEARMAN_PORT = 6379, 26379, 4730
MASTER_NAME = "gearhorn"
PARTS = ("redis", "fsyncd", "sentinel", "gearmand", "worker", "bridge", "web")
ASK_TIMEOUT = 0.5  # seconds a node that is gone gets to answer a question


def redis_conf(node: str, folder: str) -> str:
    """Redis on a node: AOF, writes only while a replica follows (a master
    cut off from every replica for 10 s refuses them), its address announced."""
    return "\n".join([
        f"bind {node}", f"port {REDIS_PORT}", "protected-mode no", f"dir {folder}",
        "appendonly yes", "appendfsync no",  # the node's fsync barrier syncs (fsyncd)
        'save ""', "min-replicas-to-write 1", "min-replicas-max-lag 10",
        f"replica-announce-ip {node}", f"bind-source-addr {node}",
        "repl-diskless-sync-delay 0", ""])


def sentinel_conf(node: str, folder: str, master: str) -> str:
    """A Sentinel: quorum 2 of 3 (one node alone never promotes)."""
    return "\n".join([
        f"bind {node}", f"port {SENTINEL_PORT}", f"dir {folder}",
        f"sentinel announce-ip {node}",
        f"sentinel monitor {MASTER_NAME} {master} {REDIS_PORT} 2",
        f"sentinel down-after-milliseconds {MASTER_NAME} 1000",
        f"sentinel failover-timeout {MASTER_NAME} 5000", ""])


def node_config(config: Config, node: str, nodes: list[str]) -> Config:
    """The settings every gearhorn process of the node runs with."""
    sentinels = ",".join(f"{n}:{SENTINEL_PORT}" for n in nodes)
    return config.replace(
        redis_url=f"redis+sentinel://{sentinels}/{MASTER_NAME}/0",
        gearman_servers=tuple((n, GEARMAN_PORT) for n in nodes),
        min_replicas=config.min_replicas or 1, bridge_host=node, web_host=node)


@dataclass
class Part:
    """One process of the node and how to start it; started again, with a
    growing pause, when it dies."""

    name: str
    start: Callable[[], subprocess.Popen | None]
    process: subprocess.Popen | None = None
    backoff: Backoff | None = None
    next_try: float = 0.0
    failed: bool = False  # its last start failed: tried again at next_try


class Node:
    def __init__(self, config: Config, nodes: list[str], data_dir: str,
                 only: str | None = None) -> None:
        self.me, self.nodes = nodes[0], sorted(set(nodes), key=noderole._address_key)
        self.peers = [n for n in self.nodes if n != self.me]
        self.config = node_config(config, self.me, self.nodes)
        self.dir = os.path.abspath(data_dir)
        self.only = only
        self.stopping = threading.Event()
        self.syncer: AofSyncer | None = None
        self._said = ""
        starts = {"redis": self._start_redis, "fsyncd": self._start_syncer,
                  "sentinel": self._start_sentinel, "gearmand": self._start_gearmand,
                  "worker": lambda: self._gearhorn("worker"),
                  "bridge": lambda: self._gearhorn("bridge", "--host", self.me),
                  "web": lambda: self._gearhorn("web", "--host", self.me)}
        wanted = [p for p in PARTS if only in (None, p) and not (p == "web" and
                                                                  not self.config.web_port)]
        self.parts = [Part(name, starts[name], backoff=Backoff(0.5, 10.0)) for name in wanted]

    # -- the run ----------------------------------------------------------------

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stopping.set())
        try:
            for part in self.parts:
                if self.stopping.is_set():
                    break
                self._first_start(part)
            if not self.stopping.is_set() and self.only is None:
                print(self.banner(), flush=True)
            while not self.stopping.wait(0.5):
                for part in self.parts:  # --only too: a pool before its Redis comes up
                    self._look_after(part)
                if self.only in (None, "redis"):
                    self._follow_named_master()
            return 0
        finally:
            self._stop()

    def _first_start(self, part: Part) -> None:
        """Start ``part``; one that cannot start yet (its Redis not up: a
        part alone, as a service manager runs it) is tried again later."""
        try:
            part.process = part.start()
            log.info("node %s: %s started", self.me, part.name)
        except (ServerError, OSError, redis.RedisError) as exc:
            log.warning("node %s: %s cannot start yet (%s): trying again", self.me,
                        part.name, exc)
            part.failed = True
            part.next_try = time.monotonic() + part.backoff.failed()

    def _died(self, part: Part) -> bool:
        return part.process is not None and part.process.poll() is not None

    def _look_after(self, part: Part) -> None:
        if not (self._died(part) or part.failed) or time.monotonic() < part.next_try:
            return
        if part.process is not None:
            log.warning("node %s: %s exited (%s): starting it again", self.me, part.name,
                        part.process.returncode)
        try:
            part.process, part.failed = part.start(), False
            part.backoff.succeeded()
        except (ServerError, OSError, redis.RedisError) as exc:
            log.error("node %s: %s could not start again: %s", self.me, part.name, exc)
            part.failed = True
            part.next_try = time.monotonic() + part.backoff.failed()

    def _stop(self) -> None:
        for part in reversed(self.parts):
            if part.process is not None and part.process.poll() is None:
                part.process.terminate()
        for part in reversed(self.parts):
            if part.process is not None:
                try:
                    part.process.wait(20)
                except subprocess.TimeoutExpired:
                    part.process.kill()
        if self.syncer is not None:
            self.syncer.stop()

    def _say(self, text: str) -> None:
        """What the node waits for, said once (not every second)."""
        if text != self._said:
            self._said = text
            log.warning("node %s: %s", self.me, text)

    # -- Redis ------------------------------------------------------------------

    def _start_redis(self) -> subprocess.Popen:
        """Redis in the role the node's view decides; waits (and says why)
        while none can be decided."""
        process = None
        while not self.stopping.is_set():
            decision = noderole.decide(self.me, self._look(process))
            if decision.role == noderole.WAIT:
                self._say(decision.reason)
            elif decision.role == noderole.CANDIDATE:
                self._say(decision.reason)
                process = process or self._spawn_redis(None)
            elif process is not None:  # a candidate: it follows, or stays the master
                if decision.role == noderole.REPLICA:
                    self._redis(self.me).replicaof(decision.master, REDIS_PORT)
                return self._chose(process, decision)
            else:
                master = decision.master if decision.role == noderole.REPLICA else None
                return self._chose(self._spawn_redis(master), decision)
            self.stopping.wait(1.0)
        raise ServerError("stopped while waiting to start Redis")

    def _follow_named_master(self) -> None:
        """A replica of a master the Sentinels no longer name follows the
        one they name, at once. The Sentinel that led a failover points the
        other replicas at the new master only if it had seen them in the old
        master's INFO (read every 10 s): a replica that joined after that
        went on asking the lost master until a Sentinel's periodic check
        fixed it (+fix-slave-config), 5 s later in the node-loss test, and
        the new master took no write meanwhile (min-replicas-to-write)."""
        try:
            info = self._redis(self.me).info("replication")
            found = _ask(self.me, SENTINEL_PORT).sentinel_get_master_addr_by_name(MASTER_NAME)
        except redis.RedisError:
            return
        named = found[0].decode() if found and isinstance(found[0], bytes) else (
            found[0] if found else None)
        following = info.get("master_host")
        if info.get("role") != "slave" or named in (None, self.me, following):
            return  # the common case: one question to each, every half second
        try:
            named_role = self._redis(named).info("replication").get("role")
            master = noderole.master_to_follow(self.me, info.get("role"), following, named,
                                               named_role)
            if master is not None:
                self._redis(self.me).replicaof(master, REDIS_PORT)
                log.warning("node %s: the Sentinels name %s the master: this replica "
                            "follows it (it followed %s)", self.me, master, following)
        except redis.RedisError as exc:
            log.warning("node %s: could not follow the master %s: %s", self.me, named, exc)

    def _chose(self, process: subprocess.Popen, decision: noderole.Decision) -> subprocess.Popen:
        self._said = ""
        log.info("node %s: Redis is the %s", self.me, "master" if decision.role ==
                 noderole.MASTER else f"replica of {decision.master}")
        return process

    def _look(self, running: subprocess.Popen | None) -> noderole.Seen:
        candidates = {}
        for node in self.nodes:
            if node == self.me and running is None:
                continue
            try:
                info = self._redis(node).info("replication")
                candidates[node] = noderole.Candidate(
                    info.get("role", "master"), int(self._redis(node).dbsize()),
                    info.get("master_host"))
            except redis.RedisError:
                continue
        return noderole.Seen(self._named_master(), self._has_data(), candidates,
                             len(self.nodes))

    def _named_master(self) -> str | None:
        for node in self.nodes:
            try:
                found = _ask(node, SENTINEL_PORT).sentinel_get_master_addr_by_name(MASTER_NAME)
            except redis.RedisError:
                continue
            if found:
                host = found[0]
                return host.decode() if isinstance(host, bytes) else host
        return None

    def _has_data(self) -> bool:
        folder = os.path.join(self.dir, "redis", "appendonlydir")
        return os.path.isdir(folder) and bool(os.listdir(folder))

    def _redis(self, node: str) -> redis.Redis:
        return _ask(node, REDIS_PORT)

    def _spawn_redis(self, master: str | None) -> subprocess.Popen:
        folder = os.path.join(self.dir, "redis")
        conf = self._write(folder, "redis.conf", redis_conf(self.me, folder))
        argv = [_binary("redis-server", "redis-server"), conf]
        if master is not None:
            argv += ["--replicaof", master, str(REDIS_PORT)]
        process = self._spawn("redis", argv)
        self._wait(lambda: self._answers(process), "Redis to load its data", process)
        return process

    def _answers(self, process: subprocess.Popen) -> bool:
        try:
            return bool(self._redis(self.me).ping())
        except redis.RedisError:
            return False

    def _start_syncer(self) -> None:
        """The fsync barrier of this node's Redis, in this process (it
        reconnects by itself when Redis restarts)."""
        url = f"redis://{self.me}:{REDIS_PORT}/0"
        self.syncer = AofSyncer(url, os.path.join(self.dir, "redis")).start()
        return None

    # -- the others -------------------------------------------------------------

    def _start_sentinel(self) -> subprocess.Popen:
        folder = os.path.join(self.dir, "sentinel")
        path = os.path.join(folder, "sentinel.conf")
        if not os.path.exists(path):  # Sentinel keeps what it learns in its file
            master = self._named_master() or self._master_of_own_redis()
            self._write(folder, "sentinel.conf", sentinel_conf(self.me, folder, master))
        process = self._spawn("sentinel", [_binary("redis-sentinel", "redis-sentinel"), path])
        self._wait_listening(SENTINEL_PORT, "Sentinel", process)
        return process

    def _master_of_own_redis(self) -> str:
        info = self._redis(self.me).info("replication")
        return info.get("master_host") or self.me

    def _start_gearmand(self) -> subprocess.Popen:
        process = self._spawn("gearmand", [
            _binary("gearmand", "gearman-job-server"), "--listen", self.me, "--port",
            str(GEARMAN_PORT), "--log-file", "stderr", "--verbose", "WARNING",
            "--hashtable-buckets", str(GEARMAND_HASH_BUCKETS)])
        self._wait_listening(GEARMAN_PORT, "gearmand", process)
        return process

    def _gearhorn(self, command: str, *args: str) -> subprocess.Popen:
        env = {**os.environ, **to_env(self.config)}
        process = self._spawn(command, [sys.executable, "-m", "gearhorn", command, *args], env)
        port = {"bridge": self.config.bridge_port, "web": self.config.web_port}.get(command)
        if port:
            self._wait_listening(port, f"the {command}", process)
        return process

    # -- processes --------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        os.makedirs(self.dir, exist_ok=True)
        with open(os.path.join(self.dir, f"{name}.log"), "ab") as out:
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, env=env,
                                    preexec_fn=die_with_parent, cwd=self.dir)

    def _write(self, folder: str, name: str, text: str) -> str:
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, name)
        with open(path, "w") as fp:
            fp.write(text)
        return path

    def _wait_listening(self, port: int, what: str, process: subprocess.Popen) -> None:
        from gearhorn.supervision.servers import is_listening

        self._wait(lambda: is_listening(self.me, port, ASK_TIMEOUT), f"{what} to listen",
                   process)

    def _wait(self, ready: Callable[[], bool], what: str, process: subprocess.Popen,
              timeout: float = 600.0) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if process.poll() is not None:
                raise ServerError(f"node {self.me}: exited ({process.returncode}) waiting "
                                  f"for {what}; its log is in {self.dir}")
            if time.monotonic() > deadline or self.stopping.wait(0.1):
                raise ServerError(f"node {self.me}: gave up waiting for {what}")

    def banner(self) -> str:
        config = self.config
        web = f"http://{self.me}:{config.web_port}/" if config.web_port else "off"
        return f"""
gearhorn node {self.me} is up (peers {', '.join(self.peers)}; data in {self.dir}).
  redis     {self.me}:{REDIS_PORT}, its Sentinel on {SENTINEL_PORT}, its fsync barrier
  gearman   {self.me}:{GEARMAN_PORT} (plain: jobs submitted straight to it live in memory)
  stomp     {self.me}:{config.bridge_port}   console {web}
  workers   {config.processes} processes, following the master the Sentinels name
  acks      after a replica has each write (min_replicas = {config.min_replicas}) and an
            fsync covers it on the master: a node lost with its disk, or a power cut
            of every node, loses nothing acknowledged
Every part is started again when it dies; Ctrl-C or SIGTERM stops them all.
"""


def _ask(node: str, port: int) -> redis.Redis:
    """A client for one question to a node: no retry (redis-py's default
    tries a node that is away three more times, with growing pauses)."""
    return redis.Redis(node, port, socket_timeout=ASK_TIMEOUT * 4,
                       socket_connect_timeout=ASK_TIMEOUT, retry=Retry(NoBackoff(), 0))


def _binary(name: str, package: str) -> str:
    found = find_binary(name)
    if found is None:
        raise ServerError(f"{name} not found: apt-get install {package}")
    return found
