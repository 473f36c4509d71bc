"""Starting the servers gearhorn needs, on loopback, as children that die with us.

Used by ``gearhorn up``, by the integration tests and by the benchmarks.
Every child gets PR_SET_PDEATHSIG, so it stops by itself if its parent dies
(even by SIGKILL), and listens on 127.0.0.1 only.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field

from gearhorn.errors import GearhornError
from gearhorn.runtime.children import die_with_parent
from gearhorn.supervision import aofrepair
from gearhorn.supervision.aofsync import AofSyncer

HOST = "127.0.0.1"
_SBIN = ("/usr/sbin", "/usr/local/sbin", "/sbin")


class ServerError(GearhornError, RuntimeError):
    """A server could not be started; the message says why and what to install."""


def find_binary(name: str) -> str | None:
    """``name`` on PATH or in an sbin directory (gearmand lives in /usr/sbin)."""
    found = shutil.which(name)
    if found:
        return found
    for folder in _SBIN:
        path = os.path.join(folder, name)
        if os.access(path, os.X_OK):
            return path
    return None


# Ports handed out by free_port in this process: never the same one twice.
_HANDED_OUT: set[int] = set()


def _ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for the local end of outgoing connections."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fp:
            low, high = (int(n) for n in fp.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _port_stripe() -> tuple[int, int]:
    index, _, count = os.environ.get("GEARHORN_PORT_STRIPE", "0/1").partition("/")
    return int(index), max(int(count or 1), 1)


def free_port() -> int:
    """A loopback port free now, for a server about to be started.

    Not one the kernel would give (bind to port 0): those come from the
    ephemeral range, where any outgoing connection made meanwhile (a client
    of another server) may take it before the server binds it. So a port
    below that range, never handed out twice by this process.

    Processes that pick ports at the same time (the test suite's parallel
    workers, and what they start) each set ``GEARHORN_PORT_STRIPE=i/n``:
    each takes every ``n``-th port from the ``i``-th, so none picks another's."""
    low, _ = _ephemeral_ports()
    index, count = _port_stripe()
    for _ in range(200):
        port = random.randrange(10_000 + index, max(low, 10_001 + index), count)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as sock:
            try:
                sock.bind((HOST, port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    with socket.socket() as sock:  # a crowded range: the kernel's choice after all
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def is_listening(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


@dataclass
class Managed:
    """A child server process."""

    name: str
    process: subprocess.Popen
    port: int
    host: str = HOST
    log_path: str | None = None
    details: dict[str, str] = field(default_factory=dict)
    # What runs beside the server in this process and ends with it (a Redis's
    # fsync barrier, gearhorn/supervision/aofsync.py): anything with a stop().
    companions: list = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def stop(self, timeout: float = 10.0) -> None:
        self._stop_companions()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self._stop_companions()

    def _stop_companions(self) -> None:
        while self.companions:
            self.companions.pop().stop()

    def log_tail(self, lines: int = 20) -> str:
        if not self.log_path or not os.path.exists(self.log_path):
            return ""
        with open(self.log_path, errors="replace") as fp:
            return "".join(fp.readlines()[-lines:])


def spawn(name: str, argv: list[str], port: int, log_path: str | None,
           env: dict[str, str] | None = None, inherit_output: bool = False,
           cpus: set[int] | None = None) -> Managed:
    def prepare() -> None:
        die_with_parent()
        if cpus:  # before exec, so every thread the server starts inherits it
            os.sched_setaffinity(0, cpus)

    out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115
    try:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                   stdout=None if inherit_output else out,
                                   stderr=None if inherit_output else subprocess.STDOUT,
                                   env=env, preexec_fn=prepare)
    finally:
        if log_path:
            out.close()
    server = Managed(name, process, port, log_path=log_path)
    _wait_until_listening(server)
    return server


def _wait_until_listening(server: Managed, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise ServerError(f"{server.name} exited with {server.process.returncode} "
                              f"before listening on {server.address}\n{server.log_tail()}")
        if is_listening(server.host, server.port, timeout=0.2):
            return
        time.sleep(0.02)
    server.kill()
    raise ServerError(f"{server.name} did not listen on {server.address} within {timeout}s")


def start_redis(port: int | None = None, data_dir: str | None = None,
                appendonly: bool = False, cpus: set[int] | None = None,
                extra: list[str] | None = None, barrier: bool = True) -> Managed:
    """redis-server on 127.0.0.1; with ``data_dir`` its data persists there;
    ``cpus`` pins it (see :func:`queue_cpus`); ``extra``: more options.
    ``appendonly`` with ``data_dir`` serves the fsync barrier beside it
    unless ``barrier`` is false (a Redis Cluster node in tests and benches:
    the barrier does not cover a cluster, whose nodes then leave the sync to
    the kernel: with ``everysec`` a million subscriptions' bench saw calls
    stall up to a second, p99, while nodes rewrote their AOF)."""
    binary = find_binary("redis-server")
    if binary is None:
        raise ServerError("redis-server not found: apt-get install redis-server")
    port = port or free_port()
    argv = [binary, "--bind", HOST, "--port", str(port), "--protected-mode", "yes",
            "--daemonize", "no", "--save", "", "--appendonly", "yes" if appendonly else "no"]
    if appendonly:
        # Every command in the AOF before its answer; gearhorn/supervision/aofsync.py
        # syncs the files to disk (everysec may answer first: aofsync.py).
        argv += ["--appendfsync", "no"]
    log_path, repaired = None, []
    if data_dir:
        os.makedirs(data_dir, exist_ok=True)
        argv += ["--dir", os.path.abspath(data_dir), "--save", "60 1"]
        log_path = os.path.join(data_dir, "redis.log")
        # After a power cut: the torn tail cut back, so Redis starts by itself.
        repaired = aofrepair.repair(data_dir) if appendonly else []
    argv += extra or []
    server = spawn("redis-server", argv, port, log_path, cpus=cpus)
    server.details["url"] = f"redis://{HOST}:{port}/0"
    if repaired:
        server.details["repaired"] = "; ".join(repaired)
    if appendonly and data_dir and barrier:
        # Its fsync barrier: acknowledgements wait for it (gearhorn/store/fsync.py).
        server.companions.append(_serve_barrier(server.details["url"], data_dir))
    _wait_until_loaded(server)
    return server


def _serve_barrier(url: str, data_dir: str) -> AofSyncer:
    syncer = AofSyncer(url, os.path.abspath(data_dir)).start()
    if not syncer.serving.wait(30):
        syncer.stop()
        raise ServerError(f"the fsync barrier of the Redis at {url} did not start")
    return syncer


def _wait_until_loaded(server: Managed, timeout: float = 600.0) -> None:
    """Redis answers LOADING until its AOF is read back; gearmand started on
    it then would replay nothing and fail every job, so wait for a PONG."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise ServerError(f"redis-server exited while loading\n{server.log_tail()}")
        try:
            with socket.create_connection((server.host, server.port), timeout=5) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(64).startswith(b"+PONG"):
                    return
        except OSError:
            pass  # exiting (the poll above says so next) or busy: ask again
        time.sleep(0.05)
    raise ServerError(f"redis-server on {server.address} still loading after {timeout}s")


# gearmand's job hash tables default to 991 buckets: with unique keys its
# ingest falls from ~184,000 to ~29,000 jobs/s by 200,000 queued jobs (measured,
# docs/benchmarks.rst). A million buckets cost 8 MB and keep it flat.
GEARMAND_HASH_BUCKETS = 1_000_003


def start_gearmand(port: int | None = None, data_dir: str | None = None,
                   queue: str = "none", queue_server: tuple[str, int] | None = None,
                   threads: int = 0, hash_buckets: int = GEARMAND_HASH_BUCKETS,
                   cpus: set[int] | None = None) -> Managed:
    """The C gearmand on 127.0.0.1.

    ``queue`` says where it keeps background jobs: ``"redis"`` (its redis
    queue in the Redis at ``queue_server``), ``"mysql"`` (database ``gearman``
    as root at ``queue_server``: benchmarks), ``"sqlite"`` (a file in
    ``data_dir``) or ``"none"`` (memory only).
    """
    binary = find_binary("gearmand")
    if binary is None:
        raise ServerError("gearmand not found: apt-get install gearman-job-server")
    port = port or free_port()
    argv = [binary, "--listen", HOST, "--port", str(port), "--threads", str(threads),
            "--log-file", "stderr", "--verbose", "WARNING",
            "--hashtable-buckets", str(hash_buckets), *queue_options(queue, data_dir, queue_server)]
    log_path = None
    if data_dir:
        os.makedirs(data_dir, exist_ok=True)
        log_path = os.path.join(data_dir, "gearmand.log")
    return spawn("gearmand", argv, port, log_path, cpus=cpus)


def queue_cpus() -> set[int] | None:
    """One core for gearmand and the Redis of its queue, or None on one core.

    gearmand writes each job to its redis queue with a blocking round trip,
    so the pair runs in lockstep: on one core the hand-over is a context
    switch, across cores a cross-CPU wake-up: 1.4 to 3.3 times the durable
    rate here (bench/durable.py, docs/benchmarks.rst).
    """
    allowed = sorted(os.sched_getaffinity(0))
    return {allowed[-1]} if len(allowed) > 1 else None


def queue_options(queue: str, data_dir: str | None = None,
                  queue_server: tuple[str, int] | None = None) -> list[str]:
    """gearmand's command-line options for a persistent queue (docs/reliability.rst)."""
    if queue in ("redis", "mysql") and queue_server is None:
        raise ServerError(f"a {queue} queue needs the address of its server")
    if queue == "redis":
        return ["--queue-type", "redis", "--redis-server", queue_server[0],
                "--redis-port", str(queue_server[1])]
    if queue == "mysql":
        return ["--queue-type", "MySQL", "--mysql-host", queue_server[0],
                "--mysql-port", str(queue_server[1]), "--mysql-user", "root",
                "--mysql-db", "gearman"]
    if queue == "sqlite":
        if not data_dir:
            raise ServerError("a sqlite queue needs a data_dir")
        db = os.path.join(os.path.abspath(data_dir), "gearmand.sqlite")
        return ["--queue-type", "libsqlite3", "--libsqlite3-db", db]
    if queue == "none":
        return []
    raise ServerError(f"unknown gearmand queue {queue!r}")


def start_gear_server(port: int | None = None, data_dir: str | None = None,
                      tls: tuple[str, str, str] | None = None) -> Managed:
    """The pure-Python ``gear.Server`` in its own process (tests, no gearmand);
    ``tls`` = (ca, cert, key) PEM files makes it speak TLS only."""
    port = port or free_port()
    argv = [sys.executable, "-m", "gearhorn.supervision.gearserver", "--host", HOST,
            "--port", str(port)]
    if tls:
        argv += ["--ssl-ca", tls[0], "--ssl-cert", tls[1], "--ssl-key", tls[2]]
    log_path = os.path.join(data_dir, "gear-server.log") if data_dir else None
    if data_dir:
        os.makedirs(data_dir, exist_ok=True)
    return spawn("gear.Server", argv, port, log_path)


def start_web(env: dict[str, str], host: str, port: int) -> Managed:
    """``gearhorn web`` (metrics, health, console) in its own gevent process."""
    return _start_gevent_process("gearhorn web", "gearhorn.web", env, host, port)


def start_bridge(env: dict[str, str], host: str, port: int) -> Managed:
    """The STOMP bridge in its own (gevent) process; it logs to our terminal."""
    return _start_gevent_process("STOMP bridge", "gearhorn.stomp", env, host, port)


def start_audit(env: dict[str, str], folder: str) -> Managed:
    """``gearhorn audit`` (count first, no Spark) with its state in ``folder``; it
    listens on nothing and prints its findings to our terminal."""
    process = subprocess.Popen([sys.executable, "-m", "gearhorn", "audit", "--dir", folder],
                               stdin=subprocess.DEVNULL, env={**os.environ, **env},
                               preexec_fn=die_with_parent)
    return Managed("live audit", process, 0)


def _start_gevent_process(name: str, module: str, env: dict[str, str], host: str,
                          port: int) -> Managed:
    """``python -m module``, which patches the standard library before
    anything imports it; its log goes to our terminal."""
    server = spawn(name, [sys.executable, "-m", module], port, None,
                    env={**os.environ, **env}, inherit_output=True)
    server.host = host
    return server
