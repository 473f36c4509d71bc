"""Three nodes, one lost with its disk at a time: the scenario of
tests/integration/test_node_loss.py, run inside a network namespace of its
own (``unshare -n``; ``python -m tests.integration.node_loss --json``).

Each node has its own loopback address (127.0.0.2, .3, .4) for every
server it runs, and its own data directory: a Redis (the first node's the
master, the others its replicas), a Sentinel, a plain gearmand, a
``gearhorn worker`` pool and a ``gearhorn bridge``, all as
etc/three-nodes/README.rst says, with ``min_replicas = 1``. Producers send
foreground fanouts (Gearman) and SENDs with receipts (STOMP) to whichever
node answers; then a node's processes are killed with -9 and its data
directory deleted, at a random moment, three times (the master's node, a
replica's, the master's again), and each lost node is started again empty,
as a replica of the master the Sentinels name (never as a master over its
replicas' data). At the end a Gearman subscriber and a STOMP subscriber
take their queues, and every acknowledged id is looked for.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import string
import subprocess
import sys
import tempfile
import threading
import time

import redis
import stomp

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RECIPE = os.path.join(ROOT, "etc", "three-nodes")
sys.path.insert(0, ROOT)

from gearhorn import gearman  # noqa: E402
from gearhorn.gearman import P  # noqa: E402
from gearhorn.runtime.children import die_with_parent  # noqa: E402
from gearhorn.supervision import servers  # noqa: E402

NODES = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
# tests/integration/minority.py: each node in a network namespace of its own.
NODES_IN_NAMESPACES = ("10.0.2.2", "10.0.3.2", "10.0.4.2")
REDIS, SENTINEL, GEARMAN, STOMP = 6379, 26379, 4730, 61613
MASTER_NAME = "gearhorn"
TOPIC = "orders"
SUBSCRIBERS = ("ledger", "mailer")  # ledger takes its copies over Gearman, mailer over STOMP
# On top of etc/three-nodes/gearhorn.conf: brisk heartbeats, as other tests have.
SETTINGS = {"GEARHORN_HEARTBEAT_INTERVAL": "1", "GEARHORN_WORKER_TTL": "4",
            "GEARHORN_FANOUT_TIMEOUT": "20",
            "GEARHORN_WEB_PORT": "0", "GEARHORN_BRIDGE_WS_PORT": "0",
            # Nobody consumes until the end: a queue's default bound (10,000
            # copies, drop-head) would drop by policy what a fast run acknowledged.
            "GEARHORN_QUEUE_MAX_LENGTH": "0", "GEARHORN_QUEUE_MAX_BYTES": "0"}


def sentinel_url() -> str:
    hosts = ",".join(f"{node}:{SENTINEL}" for node in NODES)
    return f"redis+sentinel://{hosts}/{MASTER_NAME}/0"


def wait_until(predicate, timeout: float, what: str, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(every)
    raise SystemExit(f"timed out after {timeout:g}s waiting for {what}")


class Node:
    """The servers of one node: started, killed with -9, started again."""

    def __init__(self, address: str, root: str, replication: bool,
                 netns: str | None = None) -> None:
        self.address, self.replication = address, replication
        self.netns = netns  # a network namespace of the node's own (tests/integration/minority.py)
        self.dir = os.path.join(root, address)
        self.processes: list[subprocess.Popen] = []

    def spawn(self, name: str, argv: list[str], port: int | None,
              env: dict[str, str] | None = None) -> None:
        os.makedirs(self.dir, exist_ok=True)
        if self.netns is not None:
            argv = ["ip", "netns", "exec", self.netns, *argv]
        with open(os.path.join(self.dir, f"{name}.log"), "ab") as log:
            process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, env=env,
                                       preexec_fn=die_with_parent, cwd=self.dir,
                                       start_new_session=True)  # its group: it and its children
        self.processes.append(process)
        if port is not None:
            wait_until(lambda: process.poll() is not None
                       or servers.is_listening(self.address, port), 60, f"{name} to listen")
            if process.poll() is not None:
                raise SystemExit(f"{name} on {self.address} exited: {self.log(name)}")

    def log(self, name: str) -> str:
        with open(os.path.join(self.dir, f"{name}.log"), errors="replace") as fp:
            return fp.read()[-3000:]

    def render(self, name: str, folder: str, **values: str) -> str:
        """etc/three-nodes/<name> for this node, written into ``folder``."""
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(RECIPE, name)) as fp:
            text = string.Template(fp.read()).substitute(NODE=self.address, DIR=folder, **values)
        path = os.path.join(folder, name)
        for recipe, here in zip(("10.0.0.2", "10.0.0.3", "10.0.0.4"), NODES, strict=True):
            text = text.replace(recipe, here)  # the recipe's addresses, as this run has them
        with open(path, "w") as fp:
            fp.write(text)
        return path

    def start_redis(self, master: str | None) -> None:
        """Redis as the recipe has it; as a replica of ``master`` when one is
        named: a node that comes back empty never starts as a master (its
        replicas would copy its empty data set)."""
        argv = [servers.find_binary("redis-server"),
                self.render("redis.conf", os.path.join(self.dir, "redis"))]
        if not self.replication:
            argv += ["--min-replicas-to-write", "0"]
        if master is not None and master != self.address:
            argv += ["--replicaof", master, str(REDIS)]
        self.spawn("redis", argv, REDIS)

    def rejoin_redis(self, others: list[Node]) -> bool:
        """Redis started again by etc/three-nodes/rejoin-redis, as an operator
        would: False when it refused (the Sentinels still name this empty
        node the master)."""
        argv = [os.path.join(RECIPE, "rejoin-redis"),
                self.render("redis.conf", os.path.join(self.dir, "redis")), self.address,
                *(n.address for n in others)]
        try:
            self.spawn("redis", argv, REDIS, {**os.environ, "SENTINEL_PORT": str(SENTINEL)})
        except SystemExit:
            self.processes.pop()  # it refused and exited
            return False
        return True

    def start_sentinel(self, master: str) -> None:
        conf = self.render("sentinel.conf", os.path.join(self.dir, "sentinel"), MASTER=master)
        self.spawn("sentinel", [servers.find_binary("redis-server"), conf, "--sentinel"],
                   SENTINEL)

    def start_gearhorn(self, redis_url: str) -> None:
        config = self.render("gearhorn.conf", os.path.join(self.dir, "gearhorn"))
        gearmands = ["--config", config]
        env = {**os.environ, **SETTINGS, "PYTHONPATH": ROOT}
        if not self.replication:
            env.update(GEARHORN_MIN_REPLICAS="0", GEARHORN_REDIS_URL=redis_url)
        self.spawn("gearmand", [servers.find_binary("gearmand"), "--listen", self.address,
                                "--port", str(GEARMAN), "--log-file", "stderr",
                                "--verbose", "WARNING"], GEARMAN)
        self.spawn("worker", [sys.executable, "-m", "gearhorn", "worker", "--processes", "1",
                              *gearmands], None, env)
        self.spawn("bridge", [sys.executable, "-m", "gearhorn", "bridge", "--host",
                              self.address, "--port", str(STOMP), "--ws-port", "0",
                              *gearmands], STOMP, env)

    def kill(self, keep: bool = False) -> None:
        """Every process of the node with -9 (each server's whole group: a
        worker pool's processes too), then its disk (``keep``: not)."""
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        for process in self.processes:
            process.wait()
        self.processes = []
        if not keep:
            shutil.rmtree(self.dir, ignore_errors=True)


def current_master(alive: list[Node]) -> str | None:
    """The master's address as the Sentinels of ``alive`` name it."""
    for node in alive:
        try:
            client = redis.Redis(node.address, SENTINEL, socket_timeout=1,
                                 socket_connect_timeout=0.5)
            found = client.sentinel_get_master_addr_by_name(MASTER_NAME)
            client.close()
            if found:
                host = found[0]
                return host.decode() if isinstance(host, bytes) else host
        except redis.RedisError:
            continue
    return None


def role(address: str) -> dict:
    try:
        client = redis.Redis(address, REDIS, socket_timeout=1, socket_connect_timeout=0.5)
        info = client.info("replication")
        client.close()
        return info
    except redis.RedisError:
        return {}


class Acknowledged:
    """The ids acknowledged (thread-safe), and when the last one was."""

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.times: list[float] = []
        self.refused = 0
        self._lock = threading.Lock()

    def add(self, message_id: str) -> None:
        with self._lock:
            self.ids.add(message_id)
            self.times.append(time.monotonic())

    def first_after(self, moment: float) -> float | None:
        with self._lock:
            later = [t for t in self.times if t > moment]
        return min(later) if later else None


def fanout_once(node: str, message_id: str, wait: float = 30.0) -> bool:
    """A foreground fanout on a fresh connection to ``node``'s gearmand:
    True once acknowledged for every subscriber within ``wait`` seconds."""
    body = json.dumps({"topic": TOPIC, "payload": message_id, "background": True})
    connection = gearman.Connection(node, GEARMAN, connect_timeout=0.5)
    try:
        connection.open()
        connection.send(gearman.encode(P.SUBMIT_JOB, b"fanout", message_id.encode(),
                                       body.encode()))
        deadline = time.monotonic() + wait
        while (packet := connection.read(deadline)) is not None:
            if packet.type == P.WORK_COMPLETE:
                return json.loads(packet.args[-1]).get("copies") == len(SUBSCRIBERS)
            if packet.type in (P.WORK_FAIL, P.WORK_EXCEPTION):
                return False
    except (gearman.GearmanError, OSError, ValueError):
        return False
    finally:
        connection.close()
    return False


def gearman_producer(acked: Acknowledged, stop: threading.Event) -> None:
    """Foreground fanouts, one at a time, each on a fresh connection to the
    next node (a dead node's attempt fails fast)."""
    count = 0
    while not stop.is_set():
        count += 1
        if fanout_once(NODES[count % len(NODES)], f"g{count}"):
            acked.add(f"g{count}")
        else:
            acked.refused += 1
            time.sleep(0.05)


class Receipts(stomp.ConnectionListener):
    def __init__(self, acked: Acknowledged) -> None:
        self.acked = acked

    def on_receipt(self, frame) -> None:
        self.acked.add(frame.headers["receipt-id"])

    def on_error(self, frame) -> None:
        self.acked.refused += 1


def stomp_producer(acked: Acknowledged, stop: threading.Event) -> None:
    """SENDs to /topic/orders with a receipt each, on one connection to a
    bridge, moving to the next node's bridge when it breaks."""
    count, turn, connection = 0, 0, None
    while not stop.is_set():
        try:
            if connection is None or not connection.is_connected():
                turn += 1
                connection = stomp.Connection12([(NODES[turn % len(NODES)], STOMP)],
                                                heartbeats=(0, 0), auto_decode=False,
                                                reconnect_attempts_max=1, timeout=1)
                connection.set_listener("receipts", Receipts(acked))
                connection.connect(wait=True)
            count += 1
            connection.send(destination=f"/topic/{TOPIC}", body=f"s{count}",
                            receipt=f"s{count}")
            time.sleep(0.02)
        except (stomp.exception.StompException, OSError):
            connection = None
            time.sleep(0.1)
    if connection is not None and connection.is_connected():
        time.sleep(2)  # the last receipts
        connection.disconnect()


def take_over_gearman(queue: str, expected: set[str], timeout: float,
                      nodes: list[str]) -> set[str]:
    """A plain Gearman worker on the gearmand of every node up takes ``queue``'s copies."""
    got: set[str] = set()
    workers = [gearman.WorkerConnection(node, GEARMAN, [queue], client_id="ledger")
               for node in nodes]
    for worker in workers:
        worker.open()
    deadline = time.monotonic() + timeout
    try:
        while not expected <= got and time.monotonic() < deadline:
            idle = True
            for worker in workers:
                for job in worker.grab(100):
                    got.add(job.data.decode())
                    worker.complete(job.handle)
                    idle = False
                worker.flush()
            if idle:
                time.sleep(0.1)
    finally:
        for worker in workers:
            worker.close()
    return got


class Collector(stomp.ConnectionListener):
    def __init__(self, connection) -> None:
        self.connection, self.got = connection, set()

    def on_message(self, frame) -> None:
        self.got.add(frame.body.decode())
        self.connection.ack(frame.headers["ack"])


def take_over_stomp(queue: str, expected: set[str], timeout: float, node: str) -> set[str]:
    """A STOMP subscriber on ``node``'s bridge takes ``queue``."""
    connection = stomp.Connection12([(node, STOMP)], heartbeats=(0, 0), auto_decode=False)
    collector = Collector(connection)
    connection.set_listener("collector", collector)
    connection.connect(wait=True)
    connection.subscribe(destination=f"/queue/{queue}", id="1", ack="client-individual",
                         headers={"prefetch-count": "200"})
    deadline = time.monotonic() + timeout
    while not expected <= collector.got and time.monotonic() < deadline:
        time.sleep(0.1)
    connection.disconnect()
    return set(collector.got)


def subscribe_all() -> None:
    for client_id in SUBSCRIBERS:
        body = json.dumps({"topic": TOPIC, "client_id": client_id}).encode()
        connection = gearman.Connection(NODES[0], GEARMAN)
        connection.send(gearman.encode(P.SUBMIT_JOB, b"subscribe_fanout", b"", body))
        deadline = time.monotonic() + 60
        while (packet := connection.read(deadline)) is not None:
            if packet.type == P.WORK_COMPLETE:
                break
            if packet.type in (P.WORK_FAIL, P.WORK_EXCEPTION):
                raise SystemExit(f"subscribe_fanout failed: {packet.args}")
        connection.close()


def run(replication: bool, kills: int, seed: int) -> dict:
    rng = random.Random(seed)
    root = tempfile.mkdtemp(prefix="node-loss-")
    nodes = [Node(address, root, replication) for address in NODES]
    active = nodes if replication else nodes[:1]  # without replication: one Redis
    try:
        for node in active:
            node.start_redis(None if node is nodes[0] else nodes[0].address)
        if replication:
            for node in nodes:
                node.start_sentinel(nodes[0].address)
            wait_until(lambda: role(NODES[0]).get("min_slaves_good_slaves") == 2, 60,
                       "both replicas to sync")
        url = sentinel_url() if replication else f"redis://{NODES[0]}:{REDIS}/0"
        for node in nodes:
            node.start_gearhorn(url)
        subscribe_all()
        acked, stop = Acknowledged(), threading.Event()
        producers = [threading.Thread(target=gearman_producer, args=(acked, stop), daemon=True),
                     threading.Thread(target=stomp_producer, args=(acked, stop), daemon=True)]
        for thread in producers:
            thread.start()
        wait_until(lambda: len(acked.ids) >= 50, 120, "the first acknowledgements")
        outages = []
        for kill in range(kills):
            time.sleep(rng.uniform(1.0, 4.0))  # a random moment under load
            master = current_master(nodes) if replication else NODES[0]
            victim = next(n for n in nodes if (n.address == master) == (kill % 2 == 0))
            killed_at = time.monotonic()
            victim.kill()
            answered = _wait_for_answer(acked, killed_at, 90)
            outages.append({"node": victim.address, "was_master": victim.address == master,
                            "answered_again_after_s": answered})
            again = "never" if answered is None else f"after {answered}s"
            print(f"killed {victim.address} ({'master' if victim.address == master else 'replica'}"
                  f"): answered again {again}", flush=True)
            if not replication:
                break
            _start_again(victim, nodes)
        time.sleep(2)
        stop.set()
        for thread in producers:
            thread.join(60)
        return _delivered(acked, outages, seed, [n.address for n in nodes if n.processes])
    finally:
        for node in nodes:
            node.kill(keep=bool(os.environ.get("GEARHORN_NODE_LOSS_KEEP")))
        if not os.environ.get("GEARHORN_NODE_LOSS_KEEP"):
            shutil.rmtree(root, ignore_errors=True)


def _wait_for_answer(acked: Acknowledged, moment: float, timeout: float) -> float | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        first = acked.first_after(moment)
        if first is not None:
            return round(first - moment, 2)
        time.sleep(0.05)
    return None


def _start_again(node: Node, nodes: list[Node]) -> None:
    """The lost node, empty: Redis started by the recipe's rejoin-redis (a
    replica of the master the other Sentinels name; refused, and tried again,
    while they still name this node), its Sentinel watching that master."""
    others = [n for n in nodes if n is not node]
    wait_until(lambda: node.rejoin_redis(others), 90, "rejoin-redis to start it", every=0.5)
    master = role(node.address).get("master_host") or node.address
    node.start_sentinel(master)
    wait_until(lambda: role(node.address).get("master_link_status") == "up", 90,
               f"{node.address} to sync from {master}")
    node.start_gearhorn(sentinel_url())


def _delivered(acked: Acknowledged, outages: list[dict], seed: int, up: list[str]) -> dict:
    expected = set(acked.ids)
    # Without replication the registry is gone with its node: what was held
    # there cannot be found again, so a short look is enough to show it.
    patience = 180 if len(up) == len(NODES) else 30
    got = {"ledger": take_over_gearman(f"{TOPIC}_ledger", expected, patience, up),
           "mailer": take_over_stomp(f"{TOPIC}_mailer", expected, patience, up[0])}
    missing = {name: sorted(expected - ids)[:20] for name, ids in got.items()}
    lost = {name: len(expected - ids) for name, ids in got.items()}
    print(f"acknowledged {len(expected)} (refused {acked.refused}); lost {lost}", flush=True)
    return {"seed": seed, "acknowledged": len(expected), "refused": acked.refused,
            "acknowledged_by": {"gearman": sum(i.startswith("g") for i in expected),
                                "stomp": sum(i.startswith("s") for i in expected)},
            "lost": lost, "missing": missing, "outages": outages}


def main() -> None:
    parser = argparse.ArgumentParser(description="three nodes, one lost with its disk at a time")
    parser.add_argument("--no-replication", action="store_true",
                        help="one Redis, no replicas: the run that must lose")
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not os.environ.get("GEARHORN_NODE_LOSS_NETNS"):
        unshare = ["unshare", "-n"] if os.geteuid() == 0 else ["unshare", "-rn"]
        done = subprocess.run([*unshare, sys.executable, "-m", "tests.integration.node_loss",
                               *sys.argv[1:]], cwd=ROOT,
                              env={**os.environ, "GEARHORN_NODE_LOSS_NETNS": "1"})
        raise SystemExit(done.returncode)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    figures = run(not args.no_replication, args.kills, seed)
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
