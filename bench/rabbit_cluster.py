"""RabbitMQ nodes for the benchmarks: one private node (bench/stomp_bridge.py's
peer), or a three-node cluster on one machine for quorum queues, the peer
of gearhorn with ``min_replicas = 1`` (bench/durable.py --modes replica).

Every node is Debian's rabbitmq-server on free loopback ports, its data in
a temporary folder, sharing one epmd on a free port and one Erlang cookie.
A quorum queue on three nodes confirms a message once a majority (two) has
written and fsynced it: what gearhorn's replica wait promises with one
replica, the nearest RabbitMQ has.

    python bench/rabbit_cluster.py     # start a cluster, print its status, stop
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from gearhorn.runtime.children import die_with_parent
from gearhorn.supervision import servers

SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
CTL = "/usr/lib/rabbitmq/bin/rabbitmqctl"


def installed() -> bool:
    return os.path.exists(SERVER) or shutil.which("rabbitmq-server") is not None


def _binary(path: str) -> str:
    return path if os.path.exists(path) else (shutil.which(os.path.basename(path)) or path)


class Node:
    """One rabbitmq-server: STOMP (and WebSocket STOMP) on loopback ports."""

    def __init__(self, home: str, name: str, epmd: int) -> None:
        self.folder = os.path.join(home, name)
        os.makedirs(self.folder)
        self.name = f"{name}@localhost"
        self.port, self.ws_port = servers.free_port(), servers.free_port()
        amqp, dist = servers.free_port(), servers.free_port()
        self.ports = (self.port, self.ws_port, amqp, dist)  # every port it listens on
        with open(os.path.join(self.folder, "rabbitmq.conf"), "w") as fp:
            fp.write(f"listeners.tcp.1 = 127.0.0.1:{amqp}\n"
                     f"stomp.listeners.tcp.1 = 127.0.0.1:{self.port}\n"
                     # STOMP over WebSocket at ws://127.0.0.1:ws_port/ws
                     f"web_stomp.tcp.ip = 127.0.0.1\nweb_stomp.tcp.port = {self.ws_port}\n"
                     "loopback_users.guest = true\n")
        with open(os.path.join(self.folder, "enabled_plugins"), "w") as fp:
            fp.write("[rabbitmq_stomp,rabbitmq_web_stomp].\n")
        self.env = {**os.environ, "HOME": home, "RABBITMQ_BASE": self.folder,
                    "RABBITMQ_CONFIG_FILE": os.path.join(self.folder, "rabbitmq"),
                    "RABBITMQ_ENABLED_PLUGINS_FILE": os.path.join(self.folder,
                                                                  "enabled_plugins"),
                    "RABBITMQ_MNESIA_BASE": os.path.join(self.folder, "mnesia"),
                    "RABBITMQ_LOG_BASE": os.path.join(self.folder, "log"),
                    "RABBITMQ_NODENAME": self.name, "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
                    "RABBITMQ_DIST_PORT": str(dist),
                    "ERL_EPMD_ADDRESS": "127.0.0.1", "ERL_EPMD_PORT": str(epmd)}
        self.log = open(os.path.join(self.folder, "server.out"), "wb")  # noqa: SIM115
        # A session of its own: the Erlang VM and its helpers stop together.
        self.process = subprocess.Popen([_binary(SERVER)], env=self.env, stdout=self.log,
                                        stderr=subprocess.STDOUT, start_new_session=True,
                                        preexec_fn=die_with_parent)

    def wait_listening(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while not all(servers.is_listening("127.0.0.1", p) for p in (self.port, self.ws_port)):
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise SystemExit(f"RabbitMQ {self.name} did not start; see {self.folder}")
            time.sleep(0.5)

    def ctl(self, *args: str) -> str:
        done = subprocess.run([_binary(CTL), "-n", self.name, *args], env=self.env,
                              capture_output=True, text=True, timeout=180)
        if done.returncode != 0:
            raise SystemExit(f"rabbitmqctl {' '.join(args)} on {self.name}: "
                             f"{done.stderr.strip() or done.stdout.strip()}")
        return done.stdout

    def stop(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        except ProcessLookupError:
            pass
        self.log.close()


class Brokers:
    """``count`` nodes, clustered when more than one; ``port`` is the first's
    STOMP port. A context manager that removes everything it made."""

    login = {"username": "guest", "passcode": "guest", "vhost": "/"}

    def __init__(self, count: int = 3) -> None:
        self.count = count

    def __enter__(self) -> Brokers:
        self.home = tempfile.mkdtemp(prefix="rabbit-")
        self.epmd = servers.free_port()
        cookie = os.path.join(self.home, ".erlang.cookie")
        with open(cookie, "w") as fp:  # one cookie: the nodes trust each other
            fp.write(f"gearhornbench{os.getpid()}")
        os.chmod(cookie, 0o400)
        tag = f"b{os.getpid()}"
        self.nodes: list[Node] = []
        try:
            for n in range(self.count):
                self.nodes.append(Node(self.home, f"{tag}n{n}", self.epmd))
            for node in self.nodes:
                node.wait_listening()
            for node in self.nodes[1:]:
                node.ctl("stop_app")
                node.ctl("join_cluster", self.nodes[0].name)
                node.ctl("start_app")
                node.wait_listening()
        except BaseException:
            self.__exit__()
            raise
        self.port, self.ws_port = self.nodes[0].port, self.nodes[0].ws_port
        return self

    def cpu_seconds(self) -> float:
        from proctree import tree_cpu_seconds
        return sum(tree_cpu_seconds(node.process.pid) for node in self.nodes)

    @property
    def proc(self) -> subprocess.Popen:
        """The first node's server (one node: the broker's process)."""
        return self.nodes[0].process

    def __exit__(self, *exc: object) -> None:
        for node in self.nodes:
            node.stop()
        # epmd runs as "epmd -daemon", detached and without its port in its
        # command line: ask it to stop on its port (pkill -f never matched it).
        subprocess.run(["epmd", "-kill"], env={**os.environ, "ERL_EPMD_PORT": str(self.epmd)},
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        shutil.rmtree(self.home, ignore_errors=True)


if __name__ == "__main__":
    with Brokers(3) as cluster:
        print(cluster.nodes[0].ctl("cluster_status"))
