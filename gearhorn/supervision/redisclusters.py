"""Redis Cluster and Sentinel on loopback, for the tests, benchmarks and
recipes that need them (``gearhorn up`` runs one Redis; ``gearhorn node``
runs a Sentinel on each of three nodes)."""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass

from gearhorn.supervision.servers import (
    HOST,
    Managed,
    ServerError,
    find_binary,
    free_port,
    spawn,
    start_redis,
)


@dataclass
class RedisClusterServers:
    """The nodes of a Redis Cluster started by :func:`start_redis_cluster`."""

    nodes: list[Managed]
    # A folder made for it (no data_dir given): removed when it stops.
    own_dir: str | None = None

    @property
    def url(self) -> str:
        """A URL of one node: the cluster client finds the others from it."""
        return self.nodes[0].details["url"]

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        if self.own_dir is not None:
            shutil.rmtree(self.own_dir, ignore_errors=True)


def start_redis_cluster(masters: int = 3, replicas: int = 0, data_dir: str | None = None,
                        node_timeout_ms: int = 2000, timeout: float = 120.0) -> RedisClusterServers:
    """A Redis Cluster of ``masters`` masters with ``replicas`` replicas each,
    on 127.0.0.1, made with ``redis-cli --cluster create``. Each node keeps
    its nodes.conf (and AOF, so a restarted node comes back) in ``data_dir``,
    without the fsync barrier, which does not cover a cluster (its syncer
    would ask each node for a key most of them do not serve)."""
    cli = find_binary("redis-cli")
    if cli is None:
        raise ServerError("redis-cli not found: apt-get install redis-tools")
    own_dir = None if data_dir else tempfile.mkdtemp(prefix="gearhorn-cluster-")
    data_dir = data_dir or own_dir
    nodes = []
    try:
        for index in range(masters * (1 + replicas)):
            nodes.append(start_redis(cluster_port(), os.path.join(data_dir, f"node{index}"),
                                     appendonly=True, barrier=False, extra=[
                                         "--cluster-enabled", "yes",
                                         "--cluster-config-file", "nodes.conf",
                                         "--cluster-node-timeout", str(node_timeout_ms)]))
        created = subprocess.run(
            [cli, "--cluster", "create", *(n.address for n in nodes),
             "--cluster-replicas", str(replicas), "--cluster-yes"],
            capture_output=True, text=True, timeout=timeout)
        if created.returncode != 0:
            raise ServerError(f"redis-cli --cluster create failed:\n{created.stdout}"
                              f"{created.stderr}")
        cluster = RedisClusterServers(nodes, own_dir)
        wait_for_cluster(cluster, masters * (1 + replicas), timeout)
        return cluster
    except BaseException:
        for node in nodes:
            node.stop()
        if own_dir is not None:
            shutil.rmtree(own_dir, ignore_errors=True)
        raise


def start_redis_sentinel(master: Managed, name: str, data_dir: str,
                         down_after_ms: int = 1000) -> Managed:
    """A Redis Sentinel (quorum 1) watching ``master`` as ``name``; it keeps
    its config file, which Sentinel rewrites, in ``data_dir``."""
    binary = find_binary("redis-server")
    if binary is None:
        raise ServerError("redis-server not found: apt-get install redis-server")
    os.makedirs(data_dir, exist_ok=True)
    port = free_port()
    conf = os.path.join(os.path.abspath(data_dir), "sentinel.conf")
    with open(conf, "w") as fp:
        fp.write(f"bind {HOST}\nport {port}\ndir {os.path.abspath(data_dir)}\n"
                 f"sentinel monitor {name} {master.host} {master.port} 1\n"
                 f"sentinel down-after-milliseconds {name} {down_after_ms}\n"
                 f"sentinel failover-timeout {name} 10000\n")
    server = spawn("redis-sentinel", [binary, conf, "--sentinel"], port,
                    os.path.join(data_dir, "sentinel.log"))
    server.details["url"] = f"redis+sentinel://{HOST}:{port}/{name}/0"
    return server


def cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is free too, so at most 55535."""
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(20_000, 55_536)
        if _bindable(port) and _bindable(port + 10_000):
            return port
    raise ServerError("no free port pair for a Redis Cluster node")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def wait_for_cluster(cluster: RedisClusterServers, known: int, timeout: float = 120.0) -> None:
    """Until every running node says cluster_state:ok and knows ``known`` nodes."""
    cli = find_binary("redis-cli")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = []
        for node in cluster.nodes:
            if node.process.poll() is not None:
                continue
            out = subprocess.run([cli, "-h", node.host, "-p", str(node.port), "cluster", "info"],
                                 capture_output=True, text=True, timeout=30).stdout
            info = dict(line.strip().split(":", 1) for line in out.splitlines() if ":" in line)
            states.append(info.get("cluster_state") == "ok"
                          and int(info.get("cluster_known_nodes", 0)) >= known)
        if states and all(states):
            return
        time.sleep(0.1)
    raise ServerError(f"Redis Cluster not ready after {timeout}s")
