"""Three nodes, each run by ``gearhorn node`` as docs/operations.rst says,
one lost with its disk at a time: the scenario of
tests/integration/test_node_loss.py (``python -m tests.integration.node_loss
--json``).

Each node is a host of its own: a network namespace (tests/integration/netns.py),
10.0.2.2, 10.0.3.2, 10.0.4.2, where ``gearhorn node <it> <the others>`` runs
Redis (master or replica), a Sentinel, the fsync barrier, a plain gearmand,
a worker pool and a bridge, with ``min_replicas = 1``. Per-node producers
send foreground fanouts (Gearman) and SENDs with receipts (STOMP). Then a
node is lost three times at a random moment (the master's node, a
replica's, the master's again), and each is started again at once with the
same command on an empty data directory (the command waits out the
failover itself). A loss is either

- ``kill``: every process of the node killed -9 and its data deleted (its
  sockets close at once), or
- ``silent``: its processes frozen and every packet to and from it dropped
  for 12 s, as a power loss or a pulled cable looks to the others; then
  killed and rebuilt the same way.

At the end a Gearman subscriber and a STOMP subscriber take their queues;
every acknowledged id is looked for, and those received twice counted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter

import redis
import stomp

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, ROOT)

from gearhorn import gearman  # noqa: E402
from gearhorn.gearman import P  # noqa: E402
from gearhorn.runtime.children import die_with_parent  # noqa: E402
from tests.integration import netns  # noqa: E402

NODES = netns.NODES
REDIS, SENTINEL, GEARMAN, STOMP = 6379, 26379, 4730, 61613
MASTER_NAME = "gearhorn"
TOPIC = "orders"
SUBSCRIBERS = ("ledger", "mailer")  # ledger takes its copies over Gearman, mailer over STOMP
SILENT_FOR = 12.0  # seconds a silent node stays silent before it is rebuilt
# On top of gearhorn node's own settings: brisk heartbeats, as other tests have.
SETTINGS = {"GEARHORN_HEARTBEAT_INTERVAL": "1", "GEARHORN_WORKER_TTL": "4",
            "GEARHORN_FANOUT_TIMEOUT": "20",
            "GEARHORN_WEB_PORT": "0", "GEARHORN_BRIDGE_WS_PORT": "0",
            # Nobody consumes until the end: a queue's default bound (10,000
            # copies, drop-head) would drop by policy what a fast run acknowledged.
            "GEARHORN_QUEUE_MAX_LENGTH": "0", "GEARHORN_QUEUE_MAX_BYTES": "0"}


def wait_until(predicate, timeout: float, what: str, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(every)
    raise SystemExit(f"timed out after {timeout}s waiting for {what}")


class Node:
    """One node: ``gearhorn node`` in its namespace, as an operator runs it."""

    def __init__(self, address: str, netns_name: str, root: str) -> None:
        self.address, self.netns = address, netns_name
        self.dir = os.path.join(root, address)
        self.process: subprocess.Popen | None = None
        self.parts: list[subprocess.Popen] = []  # started --only PART

    def start(self, *only: str) -> subprocess.Popen:
        """``gearhorn node`` for this node (``only``: ``--only PART``, as a
        systemd unit runs it; several make several processes)."""
        os.makedirs(self.dir, exist_ok=True)
        others = [a for a in NODES if a != self.address]
        argv = ["ip", "netns", "exec", self.netns, sys.executable, "-m", "gearhorn", "node",
                self.address, *others, "--data-dir", os.path.join(self.dir, "data"),
                "--processes", "1", *(["--only", *only] if only else [])]
        with open(os.path.join(self.dir, f"node{'-' + only[0] if only else ''}.log"),
                  "ab") as log:
            process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, cwd=ROOT,
                                       env={**os.environ, **SETTINGS, "PYTHONPATH": ROOT},
                                       preexec_fn=die_with_parent,
                                       start_new_session=True)  # it and what it starts
        if only:
            self.parts.append(process)
        else:
            self.process = process
        return process

    def signal(self, sig: int) -> None:
        for process in [self.process, *self.parts]:
            if process is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, sig)

    def kill(self, keep: bool = False) -> None:
        """Every process of the node with -9, then its disk (``keep``: not)."""
        self.signal(signal.SIGKILL)
        for process in [self.process, *self.parts]:
            if process is not None:
                process.wait()
        self.process, self.parts = None, []
        if not keep:
            shutil.rmtree(os.path.join(self.dir, "data"), ignore_errors=True)

    def log(self) -> str:
        return "".join(self.log_of(name)[-3000:] for name in
                       ("", "worker", "bridge", "gearmand", "sentinel", "fsyncd", "redis"))

    def log_of(self, part: str) -> str:
        """What ``gearhorn node`` (``--only part``) said."""
        path = os.path.join(self.dir, f"node{'-' + part if part else ''}.log")
        if not os.path.exists(path):
            return ""
        with open(path, errors="replace") as fp:
            return fp.read()


def current_master(addresses) -> str | None:
    """The master's address as a Sentinel of ``addresses`` names it."""
    for address in addresses:
        try:
            client = redis.Redis(address, SENTINEL, socket_timeout=1, socket_connect_timeout=0.5)
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


def reaches_bridge(node: Node, address: str) -> bool:
    """A STOMP client on ``node``'s host connects to the bridge at ``address``."""
    probe = (f"import socket; s = socket.create_connection(({address!r}, {STOMP}), 5); "
             "s.sendall(b'CONNECT\\naccept-version:1.2\\nhost:/\\n\\n\\0'); "
             "print(s.recv(4096).split(b'\\n')[0].decode())")
    done = subprocess.run(["ip", "netns", "exec", node.netns, sys.executable, "-c", probe],
                          capture_output=True, text=True, timeout=30)
    return done.stdout.strip() == "CONNECTED"


def serving(address: str) -> bool:
    """The node's pool takes fanouts and its bridge listens."""
    try:
        table = {f.name: f for f in gearman.status(address, GEARMAN, timeout=1)}
    except (gearman.GearmanError, OSError):
        return False
    return "fanout" in table and table["fanout"].workers >= 1 and _listening(address, STOMP)


def _listening(address: str, port: int) -> bool:
    import socket
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


class Acknowledged:
    """The ids acknowledged (thread-safe), when each was sent and when it
    was acknowledged."""

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.sent: dict[str, float] = {}
        self.times: list[tuple[float, float]] = []  # (sent, acknowledged)
        self.refused = 0
        self._lock = threading.Lock()

    def sending(self, message_id: str) -> None:
        with self._lock:
            self.sent[message_id] = time.monotonic()

    def add(self, message_id: str) -> None:
        with self._lock:
            self.ids.add(message_id)
            self.times.append((self.sent.pop(message_id, 0.0), time.monotonic()))

    def first_after(self, moment: float) -> float | None:
        """When the first message sent after ``moment`` was acknowledged."""
        with self._lock:
            later = [acked for sent, acked in self.times if sent > moment]
        return min(later) if later else None


def fanout_once(node: str, message_id: str, wait: float = 10.0) -> bool:
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


def gearman_producer(node: str, acked: Acknowledged, stop: threading.Event) -> None:
    """Foreground fanouts to ``node``, one at a time, a fresh connection each
    (a producer gives up on one after a while and sends the next)."""
    count = 0
    while not stop.is_set():
        count += 1
        message_id = f"g{node.split('.')[2]}-{count}"
        acked.sending(message_id)
        if fanout_once(node, message_id):
            acked.add(message_id)
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


def stomp_producer(node: str, acked: Acknowledged, stop: threading.Event) -> None:
    """SENDs to /topic/orders with a receipt each, to ``node``'s bridge;
    heart-beats tell a silent bridge from a slow one, and a broken
    connection is made again."""
    count, connection = 0, None
    while not stop.is_set():
        try:
            if connection is None or not connection.is_connected():
                connection = stomp.Connection12([(node, STOMP)], heartbeats=(1000, 1000),
                                                auto_decode=False, reconnect_attempts_max=1,
                                                timeout=1)
                connection.set_listener("receipts", Receipts(acked))
                connection.connect(wait=True)
            count += 1
            message_id = f"s{node.split('.')[2]}-{count}"
            acked.sending(message_id)
            connection.send(destination=f"/topic/{TOPIC}", body=message_id, receipt=message_id)
            time.sleep(0.02)
        except (stomp.exception.StompException, OSError):
            connection = None
            time.sleep(0.2)
    if connection is not None and connection.is_connected():
        time.sleep(2)  # the last receipts
        with contextlib.suppress(stomp.exception.StompException, OSError):
            connection.disconnect()


def take_over_gearman(queue: str, expected: set[str], timeout: float,
                      nodes: list[str]) -> Counter:
    """A plain Gearman worker on every node's gearmand takes ``queue``'s
    copies until it has every one expected (then a while more, for any
    that come twice)."""
    got: Counter = Counter()
    workers = [gearman.WorkerConnection(node, GEARMAN, [queue], client_id="ledger")
               for node in nodes]
    for worker in workers:
        worker.open()
    deadline, settled = time.monotonic() + timeout, None
    try:
        while time.monotonic() < deadline:
            idle = True
            for worker in workers:
                for job in worker.grab(100):
                    got[job.data.decode()] += 1
                    worker.complete(job.handle)
                    idle = False
                worker.flush()
            if expected <= got.keys():
                settled = settled or time.monotonic()
                if time.monotonic() - settled > 5:
                    break
            if idle:
                time.sleep(0.1)
    finally:
        for worker in workers:
            worker.close()
    return got


class Collector(stomp.ConnectionListener):
    def __init__(self, connection) -> None:
        self.connection, self.got = connection, Counter()

    def on_message(self, frame) -> None:
        self.got[frame.body.decode()] += 1
        self.connection.ack(frame.headers["ack"])


def take_over_stomp(queue: str, expected: set[str], timeout: float, node: str) -> Counter:
    """A STOMP subscriber on ``node``'s bridge takes ``queue``."""
    connection = stomp.Connection12([(node, STOMP)], heartbeats=(0, 0), auto_decode=False)
    collector = Collector(connection)
    connection.set_listener("collector", collector)
    connection.connect(wait=True)
    connection.subscribe(destination=f"/queue/{queue}", id="1", ack="client-individual",
                         headers={"prefetch-count": "200"})
    deadline, settled = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        if expected <= collector.got.keys():
            settled = settled or time.monotonic()
            if time.monotonic() - settled > 5:
                break
        time.sleep(0.1)
    connection.disconnect()
    return Counter(collector.got)


def subscribe_all(node: str) -> None:
    for client_id in SUBSCRIBERS:
        body = json.dumps({"topic": TOPIC, "client_id": client_id}).encode()
        connection = gearman.Connection(node, GEARMAN)
        connection.send(gearman.encode(P.SUBMIT_JOB, b"subscribe_fanout", b"", body))
        deadline = time.monotonic() + 60
        while (packet := connection.read(deadline)) is not None:
            if packet.type == P.WORK_COMPLETE:
                break
            if packet.type in (P.WORK_FAIL, P.WORK_EXCEPTION):
                raise SystemExit(f"subscribe_fanout failed: {packet.args}")
        connection.close()


def start_three(nodes: list[Node]) -> None:
    """Every node's command at once, on empty disks: they choose a master
    among themselves, then serve."""
    for node in nodes:
        node.start()
    wait_until(lambda: role(current_master(NODES) or "").get("connected_slaves") == 2, 120,
               "a master with both replicas")
    for node in nodes:
        wait_until(lambda node=node: node.process.poll() is None and serving(node.address),
                   120, f"{node.address} serving")
    for node, other in zip(nodes, nodes[1:] + nodes[:1], strict=True):
        if not reaches_bridge(node, other.address):
            raise SystemExit(f"a client on {node.address} cannot reach {other.address}'s bridge")


@contextlib.contextmanager
def three_nodes(prefix: str):
    """Three nodes, each in a network namespace of its own, with their data
    under a new directory named ``prefix``...; their logs printed on a
    failure, and all of it gone afterwards (kept with
    GEARHORN_NODE_LOSS_KEEP=1, to read their logs)."""
    names = netns.make_namespaces(str(os.getpid()))
    root = tempfile.mkdtemp(prefix=prefix)
    nodes = [Node(a, n, root) for a, n in zip(NODES, names, strict=True)]
    keep = bool(os.environ.get("GEARHORN_NODE_LOSS_KEEP"))
    try:
        yield nodes
    except BaseException:
        for node in nodes:
            print(f"--- {node.address}\n{node.log()}", file=sys.stderr)
        raise
    finally:
        for node in nodes:
            node.kill(keep=keep)
        netns.remove_namespaces(names)
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def run(modes: list[str], seed: int, by_parts: bool = False) -> dict:
    """A loss per mode in ``modes`` (kill or silent); with ``by_parts`` the
    last lost node comes back a part at a time, its pool and bridge first,
    as a service manager may start them (etc/systemd/)."""
    rng = random.Random(seed)
    with three_nodes("node-loss-") as nodes:
        start_three(nodes)
        subscribe_all(NODES[0])
        acked, stop = Acknowledged(), threading.Event()
        producers = [threading.Thread(target=target, args=(a, acked, stop), daemon=True)
                     for a in NODES for target in (gearman_producer, stomp_producer)]
        for thread in producers:
            thread.start()
        wait_until(lambda: len(acked.ids) >= 50, 120, "the first acknowledgements")
        outages = [lose(nodes, loss, mode, acked, rng,
                        by_parts and loss == len(modes) - 1) for loss, mode in enumerate(modes)]
        time.sleep(2)
        stop.set()
        for thread in producers:
            thread.join(60)
        return delivered(acked, outages, seed, ",".join(modes))


def cold_start_by_parts(seed: int) -> dict:
    """Every node down (a power cut of all three), then one node started as
    systemd starts it, a part per process, in the worst order: its pool,
    bridge and gearmand before any Redis or Sentinel answers anywhere; the
    other two with ``gearhorn node``. The first node's parts must come up
    by themselves (its pool waits, started again), and a fanout through
    it be answered."""
    with three_nodes("cold-start-") as nodes:
        first = nodes[0]
        for part in ("worker", "bridge", "gearmand"):
            first.start(part)
        wait_until(lambda: "starting it again" in first.log_of("worker"), 60,
                   "the pool to find no Redis, and be started again")
        for part in ("sentinel", "fsyncd", "redis"):
            first.start(part)
        for node in nodes[1:]:
            node.start()
        wait_until(lambda: serving(first.address), 180, f"{first.address} serving")
        subscribe_all(first.address)
        answered = wait_until(lambda: fanout_once(first.address, f"cold-{time.time()}"), 120,
                              "a fanout through the first node answered", every=0.5)
        restarts = first.log_of("worker").count("starting it again")
        print(f"cold start a part at a time: the first node's pool started before any Redis, "
              f"was started again {restarts} times, came up and answered", flush=True)
        return {"answered": bool(answered), "worker_restarts": restarts, "seed": seed}


def lose(nodes: list[Node], loss: int, mode: str, acked: Acknowledged,
         rng: random.Random, by_parts: bool = False) -> dict:
    """The master's node (even losses) or a replica's, lost at a random
    moment, then started again at once on an empty disk (``by_parts``: a
    part at a time, the pool first)."""
    time.sleep(rng.uniform(1.0, 4.0))  # a random moment under load
    master = current_master(NODES)
    victim = next(n for n in nodes if (n.address == master) == (loss % 2 == 0))
    others = [a for a in NODES if a != victim.address]
    struck = time.monotonic()
    if mode == "silent":
        victim.signal(signal.SIGSTOP)
        netns.silence(victim.address)
    else:
        victim.kill()
    failover = None
    if victim.address == master:  # when the Sentinels name another master
        wait_until(lambda: current_master(others) not in (None, master), 60,
                   "the Sentinels to promote a replica", every=0.02)
        failover = round(time.monotonic() - struck, 2)
    answered = _wait_for_answer(acked, struck, SILENT_FOR if mode == "silent" else 90)
    if mode == "silent":
        time.sleep(max(0.0, SILENT_FOR - (time.monotonic() - struck)))
        victim.kill()
    netns.heal()
    if by_parts:  # the pool and the bridge before any part they need
        for part in ("worker", "bridge", "gearmand", "sentinel", "fsyncd", "redis"):
            victim.start(part)
        alive = victim.parts
    else:
        victim.start()  # at once: the command waits out the failover itself
        alive = [victim.process]
    outage = {"mode": mode, "node": victim.address, "was_master": victim.address == master,
              "failover_after_s": failover, "answered_again_after_s": answered,
              "by_parts": by_parts}
    print(f"{mode} {victim.address} ({'master' if outage['was_master'] else 'replica'})"
          f"{', back a part at a time' if by_parts else ''}: "
          f"answered again {'never' if answered is None else f'after {answered}s'}"
          f"{'' if failover is None else f' (a replica promoted after {failover}s)'}",
          flush=True)
    wait_until(lambda: all(p.poll() is None for p in alive) and serving(victim.address), 180,
               f"{victim.address} serving again")
    if by_parts:
        outage["worker_restarts"] = victim.log_of("worker").count("starting it again")
    return outage


def _wait_for_answer(acked: Acknowledged, moment: float, timeout: float) -> float | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        first = acked.first_after(moment)
        if first is not None:
            return round(first - moment, 2)
        time.sleep(0.05)
    return None


def delivered(acked: Acknowledged, outages: list[dict], seed: int, mode: str) -> dict:
    expected = set(acked.ids)
    got = {"ledger": take_over_gearman(f"{TOPIC}_ledger", expected, 240, list(NODES)),
           "mailer": take_over_stomp(f"{TOPIC}_mailer", expected, 240, NODES[0])}
    lost = {name: len(expected - set(ids)) for name, ids in got.items()}
    twice = {name: sum(n - 1 for n in ids.values() if n > 1) for name, ids in got.items()}
    print(f"{mode}: acknowledged {len(expected)} (refused {acked.refused}); lost {lost}; "
          f"received twice {twice}", flush=True)
    return {"mode": mode, "seed": seed, "acknowledged": len(expected), "refused": acked.refused,
            "acknowledged_by": {"gearman": sum(i.startswith("g") for i in expected),
                                "stomp": sum(i.startswith("s") for i in expected)},
            "lost": lost, "twice": twice,
            "missing": {n: sorted(expected - set(ids))[:20] for n, ids in got.items()},
            "outages": outages}


def main() -> None:
    parser = argparse.ArgumentParser(description="three nodes, one lost with its disk at a time")
    parser.add_argument("--modes", default="kill,silent,silent",
                        help="how each node is lost, in turn: kill or silent (the master's "
                             "node, a replica's, the master's again...)")
    parser.add_argument("--by-parts", action="store_true",
                        help="the last lost node comes back a part at a time, its pool first")
    parser.add_argument("--cold-start", action="store_true",
                        help="instead: every node down, one started a part at a time, its "
                             "pool before any Redis")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not os.environ.get("GEARHORN_NODE_LOSS_NETNS"):
        # Its own network and mount namespaces: nothing it drops or names leaves them.
        unshare = ["unshare", "-nm", "--propagation", "private"]
        if os.geteuid() != 0:
            unshare.insert(1, "-r")
        done = subprocess.run([*unshare, sys.executable, "-m", "tests.integration.node_loss",
                               *sys.argv[1:]], cwd=ROOT,
                              env={**os.environ, "GEARHORN_NODE_LOSS_NETNS": "1"})
        raise SystemExit(done.returncode)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    figures = (cold_start_by_parts(seed) if args.cold_start
               else run(args.modes.split(","), seed, args.by_parts))
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
