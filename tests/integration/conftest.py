import os
import shutil
import subprocess
import sys
import tempfile

import pytest
import redis

from gearhorn.runtime.children import die_with_parent
from gearhorn.supervision import redisclusters, servers
from tests import lossyfs
from tests.needs import missing, require_binary, require_module

from .helpers import PoolProcess, Up, wait_for


@pytest.fixture(scope="session")
def redis_server():
    require_binary("redis-server", "redis-server")
    server = servers.start_redis()
    yield server
    server.stop()


def pytest_generate_tests(metafunc):
    """A test marked ``cluster_too`` runs twice: on one Redis, and on the
    Redis Cluster (that run is marked ``cluster``)."""
    if "redis_url" in metafunc.fixturenames and metafunc.definition.get_closest_marker(
            "cluster_too"):
        metafunc.parametrize("redis_url", ["redis", pytest.param("cluster",
                                                                 marks=pytest.mark.cluster)],
                             indirect=True)


@pytest.fixture
def redis_url(request, redis_server):
    """A flushed Redis: the one of the session, or the cluster's first node
    when a ``cluster_too`` test runs its cluster turn."""
    if getattr(request, "param", "redis") == "cluster":
        cluster = request.getfixturevalue("redis_cluster")
        for node in cluster.nodes:
            redis.Redis.from_url(node.details["url"]).flushall()
        return cluster.url
    url = redis_server.details["url"]
    redis.Redis.from_url(url).flushall()
    return url


@pytest.fixture(scope="session")
def redis_cluster():
    """A Redis Cluster of 3 masters (tests/integration/test_redis_cluster.py)."""
    require_binary("redis-server", "redis-server")
    require_binary("redis-cli", "redis-tools")
    cluster = redisclusters.start_redis_cluster(masters=3)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def gearmand(tmp_path_factory):
    require_binary("gearmand", "gearman-job-server")
    server = servers.start_gearmand(data_dir=str(tmp_path_factory.mktemp("gearmand")))
    yield server
    server.stop()


@pytest.fixture
def own_gearmand(tmp_path):
    """A gearmand of the test's own, started with no queue options (one it
    may kill, or whose jobs no other test sees)."""
    require_binary("gearmand", "gearman-job-server")
    server = servers.start_gearmand(data_dir=str(tmp_path / "own-gearmand"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gear_server(tmp_path_factory):
    server = servers.start_gear_server(data_dir=str(tmp_path_factory.mktemp("gear")))
    yield server
    server.stop()


@pytest.fixture(params=["gearmand", "gear_server"])
def gearman_server(request):
    """Each test using it runs against C gearmand and against gear.Server."""
    return request.getfixturevalue(request.param)


@pytest.fixture
def gearman_cli_tool():
    return require_binary("gearman", "gearman-tools")


@pytest.fixture
def start_pool(redis_url, tmp_path):
    pools = []

    def start(gearman_servers, processes=2, env=None):
        pool = PoolProcess(gearman_servers, redis_url, processes, log_dir=str(tmp_path),
                           env=env)
        pools.append(pool)
        return pool.wait_ready()

    yield start
    for pool in pools:
        pool.stop()


@pytest.fixture
def start_bridge(redis_url, tmp_path):
    from .stomp_helpers import BridgeProcess

    bridges = []

    def start(gearman_servers, env=None, websocket=False):
        bridge = BridgeProcess(gearman_servers, redis_url, str(tmp_path), env, websocket)
        bridges.append(bridge)
        return bridge

    yield start
    for bridge in bridges:
        bridge.stop()


@pytest.fixture
def stomp_clients():
    from .stomp_helpers import StompClient

    clients = []

    def make(port, **kwargs):
        client = StompClient(port, **kwargs)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def fast_disk(tmp_path):
    """Where the servers of a fault test keep their data: tmpfs when there is
    one. gearmand's sqlite queue syncs every job to disk (about 1,300 jobs/s on
    this machine's disk, 30,000/s on tmpfs); a restart keeps the files either
    way, which is all these tests ask of persistence."""
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) and _free_mb("/dev/shm") > 256:
        path = tempfile.mkdtemp(prefix="gearhorn-faults-", dir="/dev/shm")
        yield path
        shutil.rmtree(path, ignore_errors=True)
    else:
        yield str(tmp_path)


def _free_mb(path):
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize / 2**20


class Restartable:
    """gearmand with its sqlite queue (for the jobs submitted straight to it:
    the producers' background fanouts) and the registry's Redis with AOF,
    each started again on the same port with the same data, as ``gearhorn
    up`` does."""

    queue = "sqlite"

    def __init__(self, data_dir):
        self.gearmand_dir = os.path.join(data_dir, "gearmand")
        self.redis_dir = os.path.join(data_dir, "redis")
        self.redis = servers.start_redis(data_dir=self.redis_dir, appendonly=True)
        self.redis_url = self.redis.details["url"]
        self.gearmand = self._start_gearmand(servers.free_port())

    def worker_env(self):
        """Settings that tell workers and bridges how gearmand keeps its queue."""
        return {"GEARHORN_PERSISTENCE": self.queue}

    def _start_gearmand(self, port):
        return servers.start_gearmand(port, self.gearmand_dir, queue=self.queue)

    def restart_gearmand(self):
        self.gearmand.stop()
        self.start_gearmand()

    def start_gearmand(self):
        self.gearmand = self._start_gearmand(self.gearmand.port)

    def restart_redis(self):
        self.redis.stop()
        self.start_redis()

    def start_redis(self):
        self.redis = servers.start_redis(port=self.redis.port, data_dir=self.redis_dir,
                                         appendonly=True)

    def kill_everything(self):
        """kill -9 of gearmand and the Redis at once, then both started again (not
        a power cut: what they wrote is in the page cache, which survives)."""
        for server in (self.gearmand, self.redis):
            server.process.kill()
        for server in (self.gearmand, self.redis):
            server.process.wait()
        self.start_redis()
        self.start_gearmand()

    def stop(self):
        for server in (self.gearmand, self.redis):
            server.stop()


@pytest.fixture
def persistent_servers(fast_disk):
    """gearmand on sqlite and the registry's Redis with AOF, restartable."""
    require_binary("gearmand", "gearman-job-server")
    require_binary("redis-server", "redis-server")
    running = Restartable(fast_disk)
    yield running
    running.stop()


@pytest.fixture
def report(request):
    """Say a line in the run's summary (the figures a fault test reports,
    such as duplicates): tests/conftest.py prints them at the end."""

    def write(line):
        request.node.user_properties.append(("report", line))
    return write


@pytest.fixture
def start_web(redis_url, tmp_path):
    from .web_helpers import WebProcess

    webs = []

    def start(gearman_servers, env=None, redis=None):
        web = WebProcess(gearman_servers, redis or redis_url, str(tmp_path), env)
        webs.append(web)
        return web

    yield start
    for web in webs:
        web.stop()


@pytest.fixture
def ups():
    """``gearhorn up`` in a process group of its own (helpers.Up), stopped after the test."""
    require_binary("gearmand", "gearman-job-server")
    require_binary("redis-server", "redis-server")
    started = []

    def start(*args, **kwargs):
        started.append(Up(*args, **kwargs))
        return started[-1]
    yield start
    for up in started:
        up.stop()


class LossyDisk:
    """tests/lossyfs.py mounted in a folder of the test's: a disk whose
    power can be cut (:meth:`power_cut`: every write not fsynced is gone);
    ``strict``: names and sizes too, until their folder or file is fsynced."""

    def __init__(self, root, strict=False):
        self.strict = strict
        self.backing = os.path.join(root, "backing")
        self.path = os.path.join(root, "mnt")
        self.control = os.path.join(root, "control.sock")
        os.makedirs(self.backing)
        os.makedirs(self.path)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.lossyfs", self.backing, self.path, self.control,
             *(["--strict"] if strict else [])],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(root, "lossyfs.log"), "ab"),  # noqa: SIM115
            preexec_fn=die_with_parent)
        wait_for(lambda: self.process.poll() is None and os.path.ismount(self.path)
                 and os.path.exists(self.control), 30, message="lossyfs mounted")

    def power_cut(self):
        """Drop what was not fsynced; returns the file system's account of it."""
        return lossyfs.control(self.control, "clear-cache")

    def stats(self):
        return lossyfs.control(self.control, "stats")

    def unmount(self):
        subprocess.run(["fusermount3", "-u", "-z", self.path], capture_output=True)
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class LazyDisk(LossyDisk):
    """The same, on LazyFS (dsrhaslab/lazyfs) built by hand: for comparing
    tests/lossyfs.py with it (``GEARHORN_LAZYFS=<its lazyfs/ folder>``,
    docs/reliability.rst). Not in CI: its source is not reachable there."""

    def __init__(self, root, lazyfs):
        self.strict = False
        self.backing = os.path.join(root, "backing")
        self.path = os.path.join(root, "mnt")
        self.fifo, self.done = os.path.join(root, "faults.fifo"), os.path.join(root, "done.fifo")
        for folder in (self.backing, self.path):
            os.makedirs(folder)
        for fifo in (self.fifo, self.done):
            os.mkfifo(fifo)
        # LazyFS takes a config path with "-o" in it (pytest-of-root) for an option.
        handle, config = tempfile.mkstemp(prefix="lazyfs", suffix=".toml")
        os.close(handle)
        with open(config, "w") as fp:
            fp.write(f'[faults]\nfifo_path="{self.fifo}"\nfifo_path_completed="{self.done}"\n'
                     '[cache]\napply_eviction=false\n[cache.simple]\ncustom_size="4gb"\n'
                     'blocks_per_page=1\n[filesystem]\nlog_all_operations=false\n'
                     'logfile=""\n')
        self.process = subprocess.Popen(
            [os.path.join(lazyfs, "build", "lazyfs"), self.path, "--config-path", config,
             "-o", "allow_other", "-o", "modules=subdir", "-o", f"subdir={self.backing}", "-f"],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(root, "lazyfs.log"), "ab"),  # noqa: SIM115
            preexec_fn=die_with_parent)
        wait_for(lambda: self.process.poll() is None and os.path.ismount(self.path), 30,
                 message="LazyFS mounted")

    def power_cut(self):
        with open(self.fifo, "w") as fifo:
            fifo.write("lazyfs::clear-cache\n")
        with open(self.done) as done:
            return done.readline().strip()

    def stats(self):
        return "LazyFS"


@pytest.fixture
def lossy_disk(tmp_path, request):
    """A folder on a file system that forgets what was not fsynced, on
    demand; parametrized indirectly with "strict" for the harsher metadata."""
    strict = getattr(request, "param", "lazyfs") == "strict"
    require_binary("fusermount3", "fuse3")
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        missing("/dev/fuse is not usable here: the power-cut tests need FUSE")
    lazyfs = os.environ.get("GEARHORN_LAZYFS")
    if lazyfs and not strict:
        disk = LazyDisk(str(tmp_path / "lazy"), lazyfs)
        yield disk
        disk.unmount()
        return
    require_module("mfusepy")
    disk = LossyDisk(str(tmp_path / "lossy"), strict=strict)
    yield disk
    disk.unmount()


@pytest.fixture
def spark_cluster(tmp_path):
    """A Spark standalone master and worker on loopback (spark_helpers.py)."""
    from .spark_helpers import SparkCluster

    require_binary("java", "default-jre-headless")
    cluster = SparkCluster(str(tmp_path))
    yield cluster
    cluster.stop()
