"""Driving real servers from tests: a worker pool process, gear and CLI clients."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter

import gear

from gearhorn import gearman
from gearhorn.gearman import PacketReader
from gearhorn.runtime.children import die_with_parent
from gearhorn.store import redisconn
from gearhorn.store.keys import Keys
from gearhorn.store.registry import Registry
from gearhorn.supervision import servers


def wait_for(predicate, timeout=20.0, interval=0.02, message="condition"):
    """Poll ``predicate`` until it returns a true value; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


def unique_topic(stem="t"):
    return f"{stem}{uuid.uuid4().hex[:10]}"


class ChildProcess:
    """A ``gearhorn`` command run as a real child process, its output in a log file.

    It dies with the test run (``die_with_parent``) if a test forgets to stop it.
    """

    name = "gearhorn"

    def __init__(self, argv, log_path, env=None):
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "gearhorn", *argv],
                                            stdout=log, stderr=subprocess.STDOUT,
                                            env=dict(os.environ, **(env or {})),
                                            preexec_fn=die_with_parent)

    def wait_listening(self, *ports, timeout=30.0):
        def listening():
            if self.process.poll() is not None:
                raise AssertionError(f"{self.name} exited:\n{self.log()}")
            return all(servers.is_listening("127.0.0.1", port) for port in ports)
        wait_for(listening, timeout, message=f"{self.name} to listen")

    def log(self, full=False):
        """The log's tail (for failure messages), or all of it."""
        if self.log_path == os.devnull:
            return ""
        with open(self.log_path, errors="replace") as fp:
            text = fp.read()
        return text if full else text[-5000:]

    def stop(self, timeout=20.0):
        """SIGTERM, then SIGKILL after ``timeout``; the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


class PoolProcess(ChildProcess):
    """``gearhorn worker`` as a real child process."""

    name = "worker pool"

    # Settings for every test pool: heart-beats at a brisk pace, but a worker
    # counts as dead only after 10 s without one and a foreground fanout
    # waits 20 s for its receivers, so a loaded machine cannot fake either.
    # A test that needs a shorter fanout timeout (a receiver that never
    # answers) sets its own.
    # Where gearmand keeps its queue is the default's (persistence = auto:
    # nothing assumed) unless a test says.
    SETTINGS = {"GEARHORN_HEARTBEAT_INTERVAL": "1", "GEARHORN_WORKER_TTL": "10",
                "GEARHORN_FANOUT_TIMEOUT": "20"}

    def __init__(self, gearman_servers, redis_url, processes=2, log_dir=None, extra=(),
                 tls=None, env=None, log_name="pool.log"):
        self.gearman_servers = list(gearman_servers)
        self.tls = tls  # gearman.TlsFiles of the servers; the pool reads its own from env
        self.redis_url = redis_url
        self.processes = processes
        self.registry = Registry(redisconn.connect(redis_url), Keys())
        argv = ["worker", "--processes", str(processes), "--redis-url", redis_url]
        for server in self.gearman_servers:
            argv += ["--gearman", server.address]
        super().__init__(argv + list(extra),
                         os.path.join(log_dir, log_name) if log_dir else os.devnull,
                         env={**self.SETTINGS, **(env or {})})

    def live(self):
        return self.registry.live_workers()

    def own_pids(self):
        """The pids of this pool's worker processes (its children that
        multiprocessing spawned, not its resource tracker)."""
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and _parent_of(int(entry)) == self.process.pid:
                with contextlib.suppress(OSError), open(f"/proc/{entry}/cmdline", "rb") as fp:
                    if b"spawn_main" in fp.read():
                        found.append(int(entry))
        return found

    def wait_ready(self, timeout=60.0):
        def ready():
            if self.process.poll() is not None:
                raise AssertionError(f"pool exited early:\n{self.log()}")
            if len(self.live()) < self.processes:
                return False
            for server in self.gearman_servers:
                table = {f.name: f for f in gearman.status(server.host, server.port,
                                                           tls=self.tls)}
                if "fanout" not in table or table["fanout"].workers < self.processes:
                    return False
            return True
        wait_for(ready, timeout, message="worker pool ready")
        return self


def _parent_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as fp:
            return int(fp.read().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


class _WakingClient(gear.Client):
    """``gear.Client`` that wakes the caller waiting on a job when the job
    ends, so a call costs its round trip and not a polling interval (the
    tests make thousands)."""

    def __init__(self, name):
        super().__init__(name)
        self.ended = threading.Condition()

    def _wake(self, job):
        with self.ended:
            self.ended.notify_all()
        return job

    def handleWorkComplete(self, packet):
        return self._wake(super().handleWorkComplete(packet))

    def handleWorkFail(self, packet):
        return self._wake(super().handleWorkFail(packet))

    def handleWorkException(self, packet):
        return self._wake(super().handleWorkException(packet))


class GearClient:
    """The real ``gear.Client`` submitting jobs and waiting for them."""

    def __init__(self, server):
        self.client = _WakingClient("gearhorn-tests")
        self.client.addServer(server.host, server.port)
        self.client.waitForServer(10)

    def submit(self, function, data, background=False, timeout=20.0):
        if not isinstance(data, bytes):
            data = json.dumps(data).encode()
        job = gear.Job(function, data)
        self.client.submitJob(job, background=background, timeout=timeout)
        if not background:
            with self.client.ended:
                if not self.client.ended.wait_for(lambda: job.complete, timeout):
                    raise AssertionError(f"timed out after {timeout}s waiting for {function} job")
        return job

    def call(self, function, payload, timeout=20.0):
        job = self.submit(function, payload, timeout=timeout)
        assert not job.failure, f"{function} failed: {b''.join(job.data)!r}"
        return json.loads(b"".join(job.data))

    def close(self):
        self.client.shutdown()


def gearman_cli(server, *args, data=None, timeout=20.0):
    """Run the ``gearman`` command-line tool against ``server``."""
    argv = ["gearman", "-h", server.host, "-p", str(server.port), *args]
    return subprocess.run(argv, input=data, capture_output=True, timeout=timeout)


def drain_queue(server, function, count=0, timeout=20.0):
    """Every job in ``function``, consumed with a real gear worker until the
    server reports the queue empty and at least ``count`` came (for a queue
    still being filled while this waits)."""
    worker = gearman.NoDelayWorker("gearhorn-tests-drain")
    worker.addServer(server.host, server.port)
    worker.registerFunction(function)
    worker.waitForServer(10)
    received = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            job = _get_job(worker, 0.2)
            if job is not None:
                received.append(job.arguments)
                job.sendWorkComplete()
            elif len(received) >= count and queue_depth(server, function) == 0:
                return received
            elif time.monotonic() > deadline:
                raise AssertionError(
                    f"{function}: {len(received)} of {count} jobs after {timeout}s")
    finally:
        worker.shutdown()


def _get_job(worker, timeout):
    timer = threading.Timer(timeout, worker.stopWaitingForJobs)
    timer.start()
    try:
        return worker.getJob()
    except gear.InterruptedError:
        return None
    finally:
        timer.cancel()


def drain_jobs(server, function, timeout=120.0, limit=None, until=None):
    """Every job in ``function`` (gearhorn.gearman.GrabbedJob), taken in bursts
    and completed, until gearmand reports the queue empty (or ``limit`` jobs
    were taken); an AssertionError after ``timeout`` seconds. With
    ``until(jobs)``, an empty queue ends it once that is true, or at the
    deadline (the caller asserts what came): held copies whose holder died
    reach gearmand again only once another worker takes them over."""
    worker = gearman.WorkerConnection(server.host, server.port, [function], "tests-drain")
    worker.open()
    got = []
    deadline = time.monotonic() + timeout
    try:
        while limit is None or len(got) < limit:
            jobs = worker.grab(64 if limit is None else min(64, limit - len(got)))
            for job in jobs:
                got.append(job)
                worker.complete(job.handle)
            late = time.monotonic() > deadline
            if not jobs and queue_depth(server, function) == 0 and (
                    until is None or late or until(got)):
                return got
            if not jobs and until is not None:
                time.sleep(0.05)  # polling for the copies a takeover hands again
            if late:
                raise AssertionError(f"{function}: still not empty after {timeout}s "
                                     f"({len(got)} jobs taken)")
        return got
    finally:
        worker.close()


def nothing_held(redis_url, queue):
    """``drain_jobs``'s ``until``: true once no copy of ``queue`` (a glob
    with ``*``) is held (copies = held, the default: every one was handed
    and answered)."""
    from gearhorn.store import redisconn
    from gearhorn.store.keys import Keys

    client = redisconn.connect(redis_url)  # a Redis Cluster's URL too
    key = Keys().copies(queue)
    if "*" in queue:  # a pattern: every queue it matches
        return lambda jobs=(): not any(client.hlen(k) for k in client.scan_iter(match=key))
    return lambda jobs=(): client.hlen(key) == 0


def queue_depth(server, function):
    for f in gearman.status(server.host, server.port):
        if f.name == function:
            return f.queued
    return 0


def clients_waiting(server, unique):
    """GET_STATUS_UNIQUE (41): (is the job known, how many clients wait for it)."""
    with socket.create_connection((server.host, server.port), timeout=20) as sock:
        sock.sendall(b"\0REQ" + struct.pack(">II", 41, len(unique))
                     + unique.encode())
        header = _exactly(sock, 12)
        kind, size = struct.unpack(">II", header[4:])
        fields = _exactly(sock, size).split(b"\0")
    assert kind == 42, kind  # STATUS_RES_UNIQUE
    return fields[1] == b"1", int(fields[5])


def _exactly(sock, count):
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        assert chunk, "gearmand closed the connection"
        data += chunk
    return data


def self_signed_certificate(folder, name):
    """A throwaway certificate for 127.0.0.1 (PEM cert and key paths), made
    with the openssl tool; it is its own CA."""
    from tests.needs import require_binary
    require_binary("openssl", "openssl")
    cert, key = os.path.join(folder, f"{name}.pem"), os.path.join(folder, f"{name}.key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", key, "-out", cert, "-subj", f"/CN={name}",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


class LoopbackProxy:
    """A loopback TCP proxy in front of a Gearman server: a process pointed
    at ``address`` reaches the server through :meth:`_forward`, a thread
    each way (``requests``: the process's side). Stops with ``close``."""

    def __init__(self, server):
        self.upstream = (server.host, server.port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.host, self.port = self._listener.getsockname()
        self.address = f"{self.host}:{self.port}"
        self._sockets = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.upstream)
            self._sockets += [downstream, upstream]
            threading.Thread(target=self._forward, args=(downstream, upstream, True),
                             daemon=True).start()
            threading.Thread(target=self._forward, args=(upstream, downstream, False),
                             daemon=True).start()

    def _forward(self, source, sink, requests):
        raise NotImplementedError

    def close(self):
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes the threads blocked on it
            sock.close()


class GearmanTap(LoopbackProxy):
    """A proxy (:class:`LoopbackProxy`) that counts the request packets
    passing through it by type: what a process pointed at ``address`` asks
    gearmand for (admin text connections pass uncounted), and the most of
    each type that came in one read."""

    def __init__(self, server):
        self.counts = Counter()
        self.most_in_one_read = Counter()
        self._lock = threading.Lock()
        super().__init__(server)

    def _forward(self, source, sink, requests):
        reader = PacketReader() if requests else None
        first = True
        while True:
            try:
                data = source.recv(65536)
                if not data:
                    break
                sink.sendall(data)
            except OSError:
                break
            if first and data[:1] != b"\0":
                reader = None  # an admin connection: text commands
            first = False
            if reader is not None:
                here = Counter(p.type for p in reader.feed(data))
                with self._lock:
                    self.counts.update(here)
                    for kind, n in here.items():
                        self.most_in_one_read[kind] = max(self.most_in_one_read[kind], n)
        for sock in (source, sink):
            sock.close()

    def count(self, packet_type):
        with self._lock:
            return self.counts[packet_type]


class Up:
    """``gearhorn up`` in a process group of its own, on free loopback ports."""

    def __init__(self, data_dir, ports=None, extra=(), store=None, env=None):
        """Logs in ``data_dir``; the servers' data in ``store`` (default
        ``data_dir/data``); ``env``: more settings."""
        self.data_dir = str(data_dir)
        self.store = store or os.path.join(self.data_dir, "data")
        self.ports = ports or {name: servers.free_port()
                               for name in ("redis", "gearman", "stomp")}
        self.log_path = os.path.join(self.data_dir, f"up-{len(os.listdir(self.data_dir))}.log")
        env = dict(os.environ, GEARHORN_BRIDGE_PORT=str(self.ports["stomp"]),
                   GEARHORN_BRIDGE_WS_PORT="0",
                   GEARHORN_HEARTBEAT_INTERVAL="0.3", GEARHORN_WORKER_TTL="1.5", **(env or {}))
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gearhorn", "up", "--processes", "2",
                 "--data-dir", self.store,
                 "--redis-url", f"redis://127.0.0.1:{self.ports['redis']}/0",
                 "--gearman", f"127.0.0.1:{self.ports['gearman']}", *extra],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=die_with_parent)  # its children die with it in turn
        wait_for(self._banner, timeout=90, message="the banner of gearhorn up")
        self.gearmand = servers.Managed("gearmand", None, self.ports["gearman"])
        self.redis_url = f"redis://127.0.0.1:{self.ports['redis']}/0"

    def text(self):
        with open(self.log_path, errors="replace") as fp:
            return fp.read()

    def _banner(self):
        if self.process.poll() is not None:
            raise AssertionError(f"gearhorn up exited:\n{self.text()[-3000:]}")
        return "gearhorn is up" in self.text()

    def kill_everything(self):
        """SIGKILL to every process at once: up, workers, bridge, gearmand, Redis."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        wait_for(lambda: not any(servers.is_listening("127.0.0.1", p)
                                 for p in self.ports.values()), 30, message="all dead")

    def stop(self):
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


# -- topic histories (stream subscribers) ---------------------------------------------


def offsets(messages):
    """The x-stream-offset of each STOMP MESSAGE."""
    return [int(m.headers["x-stream-offset"]) for m in messages]


def bodies(messages):
    return [m.body.decode() for m in messages]


def publish(gearmand, topic, names):
    """Foreground fanouts from a Gearman producer, one after the other."""
    from gearhorn.client import Producer

    with Producer([(gearmand.host, gearmand.port)]) as producer:
        for name in names:
            producer.publish(topic, name, background=False)
