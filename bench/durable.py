"""Durable copies per second: gearhorn's held copies, gearmand's own queues, and RabbitMQ.

    python bench/durable.py            # all of it (about 6 minutes on 2 cores)
    python bench/durable.py --quick    # smaller counts, for a smoke run
    python bench/durable.py --memory 200000    # memory per queued copy: held, in gearmand
    python bench/durable.py --latency 2000     # one fanout's p50/p99, after fsync,
                                               # when written, and with a replica
    python bench/durable.py --modes default,replica   # acknowledged after one replica
    python bench/durable.py --modes default,held,none   # every default (held copies,
                    # gearmand on sqlite for its own jobs) against held copies beside a
                    # memory gearmand, and copies in gearmand's memory (no durability)
    python bench/durable.py --modes default --gearmands 2   # two gearmand

Each gearhorn mode gets fresh servers on free loopback ports, with their data
on disk (a temporary folder under the current directory): the registry's
Redis with AOF and ``appendfsync no`` and its syncer serving the fsync
barrier, as ``gearhorn up`` runs it, gearmand with the queue under test, and
a pool of 2 ``gearhorn worker`` processes. The rate is copies per second for
which the producer got its answer: a foreground ``fanout`` job completes
once every copy is kept (held: its record in the registry's Redis; else
gearmand's JOB_CREATED) and an fsync covered the registry's writes
(``durability = fsync``, the default). The fsyncs each run took, and the
copies one fsync covered, are printed beside the rates. For the none mode,
gearmand alone on the same servers: the same copies pipelined by 2
processes of the workers' own Gearman client, 1,000 a batch: the ceiling of
a pool whose fanouts cost nothing (issue 52). gearmand's redis queue plugin
is no longer a mode: gearhorn does not run it (docs/design/index.rst, "What
went"); its last figures are in bench/log.rst.

gearmand's MySQL queue runs on Debian's MariaDB (durable defaults) when
installed. The peer is RabbitMQ (Debian's rabbitmq-server), in the same run: N durable
STOMP subscriptions to one topic (durable queues bound to amq.topic), and
messages sent ``persistent:true`` with a receipt each, which RabbitMQ gives
once the message is confirmed in every queue; copies = messages x N. The
same STOMP producer and durable subscriptions run against gearhorn's bridge
(mode default): the like-for-like comparison. A bridge RECEIPT, too, comes
once every copy is held in Redis and an fsync covered it. With the replica
mode, RabbitMQ's quorum queues on a three-node cluster on this machine
(bench/rabbit_cluster.py) are measured the same way: a message confirmed
once two of three nodes fsynced it, the peer of ``min_replicas = 1``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor

import redis
import stomp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import rabbit_cluster  # noqa: E402
from fanout import gearhorn_rate, start_pool, subscribe_many  # noqa: E402
from stomp_bridge import RabbitMQ, connect  # noqa: E402

from gearhorn import gearman  # noqa: E402
from gearhorn.runtime.children import die_with_parent
from gearhorn.store.keys import Keys  # noqa: E402
from gearhorn.store.registry import Registry  # noqa: E402
from gearhorn.supervision import servers

WIDTHS = (10, 100, 1000)
SUBSCRIPTIONS_PER_CONNECTION = 100  # gearhorn's stomp_max_subscriptions
PAYLOAD = "x" * 100


def wait_for_replicas(url: str, count: int, timeout: float = 60.0) -> None:
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + timeout
    while sum(1 for k, v in client.info("replication").items() if k.startswith("slave")
              and isinstance(v, dict) and v.get("state") == "online") < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"{count} replicas did not sync")
        time.sleep(0.1)
    client.close()


class GearhornServers:
    """Registry Redis, gearmand on ``queue`` (and its Redis), a worker pool,
    and with ``bridge`` a STOMP bridge."""

    def __init__(self, queue: str, processes: int, bridge: bool = False,
                 durability: str = "fsync", gearmands: int = 1, copies: str = "gearmand",
                 extra_env: dict[str, str] | None = None, replicas: int = 0) -> None:
        self.queue = queue
        self.tmp = tempfile.mkdtemp(prefix="bench-durable-", dir=os.getcwd())
        self.redis = servers.start_redis(data_dir=os.path.join(self.tmp, "redis"),
                                         appendonly=True)
        # replicas > 0: the registry's replicas, each write acknowledged once
        # that many have it (min_replicas, gearhorn/store/replicas.py)
        self.replicas = [servers.start_redis(
            data_dir=os.path.join(self.tmp, f"replica{n}"), appendonly=True, barrier=False,
            extra=["--replicaof", self.redis.host, str(self.redis.port)])
            for n in range(replicas)]
        if replicas:
            wait_for_replicas(self.redis.details["url"], replicas)
            extra_env = {**(extra_env or {}), "GEARHORN_MIN_REPLICAS": str(replicas)}
        self.mariadb = None
        self.gearmands: list[servers.Managed] = []
        if queue == "mysql":
            self.mariadb = MariaDB(self.tmp)
        for n in range(gearmands):
            address = ("127.0.0.1", self.mariadb.port) if queue == "mysql" else None
            self.gearmands.append(servers.start_gearmand(
                data_dir=os.path.join(self.tmp, f"gearmand{n}"), queue=queue,
                queue_server=address))
        self.gearmand = self.gearmands[0]
        # Where gearmand keeps its queue, and what an answer waits for:
        # with fsync, the syncers servers.start_redis runs beside each Redis.
        self.env = {"GEARHORN_PERSISTENCE": queue if queue == "sqlite" else "none",
                    "GEARHORN_DURABILITY": durability, "GEARHORN_COPIES": copies,
                    **(extra_env or {})}
        self.syncers = list(self.redis.companions)
        self.registry = Registry(redis.Redis.from_url(self.redis.details["url"]), Keys())
        for width in WIDTHS:
            subscribe_many(self.registry, f"bench{width}", width)
        self.pool = start_pool(self.gearmand, self.redis.details["url"], processes, env=self.env,
                               also=tuple(self.gearmands[1:]))
        self.bridge = self.start_bridge() if bridge else None

    def start_bridge(self) -> subprocess.Popen:
        """``gearhorn bridge`` (one process, as ``gearhorn up`` starts it)."""
        self.bridge_port = servers.free_port()
        bridge = subprocess.Popen(
            [sys.executable, "-m", "gearhorn", "bridge", "--port", str(self.bridge_port),
             "--ws-port", "0", *(a for g in self.gearmands for a in ("--gearman", g.address)),
             "--redis-url", self.redis.details["url"], "--log-level", "WARNING"],
            env={**os.environ, **self.env}, preexec_fn=die_with_parent)
        deadline = time.monotonic() + 60
        while not servers.is_listening("127.0.0.1", self.bridge_port):
            if time.monotonic() > deadline or bridge.poll() is not None:
                raise SystemExit("gearhorn bridge did not start")
            time.sleep(0.1)
        return bridge

    def rate(self, width: int, copies: int) -> float:
        fanouts = max(1, copies // width)
        gearhorn_rate(self.gearmand, f"bench{width}", max(1, fanouts // 10), width)  # warm-up
        return self.counting_fsyncs(lambda: gearhorn_rate(self.gearmand, f"bench{width}",
                                                          fanouts, width))

    def gearmand_rate(self, width: int, copies: int, clients: int = 2) -> float:
        """Copies/s gearmand itself takes on this setup, acknowledged as the
        pool's are: the copies of a fanout to ``width`` pipelined by the
        workers' own Gearman client, 1,000 a batch; ``clients``
        processes at once, as the pool's. What a pool could reach with this
        gearmand if a fanout cost it nothing (no JSON, look-up, ledger,
        tally): the ceiling of issue 52."""
        addresses = [g.address for g in self.gearmands]
        share = max(1, copies // clients)
        start = time.perf_counter()
        with ProcessPoolExecutor(clients) as pool:
            list(pool.map(_submit_acknowledged, [addresses] * clients,
                          [f"bench{width}"] * clients, [width] * clients, [share] * clients,
                          range(clients)))
        return share * clients / (time.perf_counter() - start)

    def stomp_rate(self, width: int, copies: int) -> float:
        return self.counting_fsyncs(lambda: stomp_persistent_rate(self.bridge_port, {}, width,
                                                                  copies))

    def counting_fsyncs(self, run) -> float:
        """``run()``'s rate; the fsyncs it took go to ``self.fsyncs``:
        (fsyncs per second, copies per fsync), summed over every Redis; the
        CPU it took to ``self.cpu``: (the pool's, gearmand's) ms per 1,000 copies."""
        rounds = sum(s.rounds for s in self.syncers)
        pool, gearmand = cpu_seconds([self.pool.pid]), cpu_seconds(
            [g.process.pid for g in self.gearmands])
        start = time.perf_counter()
        rate = run()
        elapsed = time.perf_counter() - start
        made = sum(s.rounds for s in self.syncers) - rounds
        self.fsyncs = (made / elapsed, rate * elapsed / made if made else 0.0)
        thousands = rate * elapsed / 1000
        self.cpu = ((cpu_seconds([self.pool.pid]) - pool) * 1000 / thousands,
                    (cpu_seconds([g.process.pid for g in self.gearmands]) - gearmand)
                    * 1000 / thousands)
        return rate

    def memory(self) -> dict[str, float]:
        """Bytes now: the pool's processes (RSS), gearmand's, and each Redis's
        used_memory."""
        found = {"pool": tree_rss(self.pool.pid),
                 "gearmand": sum(tree_rss(g.process.pid) for g in self.gearmands),
                 "registry Redis": float(self.registry.redis.info("memory")["used_memory"])}
        return found

    def close(self) -> None:
        for process in (self.bridge, self.pool):
            if process is not None:
                process.send_signal(signal.SIGTERM)
                process.wait(30)
        for server in (*self.gearmands, self.mariadb, *self.replicas, self.redis):
            if server is not None:
                server.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)


def tree_rss(pid: int) -> float:
    """Resident bytes of ``pid`` and every process below it."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fp:
            children = [int(c) for c in fp.read().split()]
        total = rss_mib(pid) * 1024 * 1024
    except OSError:
        return 0.0
    return total + sum(tree_rss(c) for c in children)


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU of ``pids`` and every process below them, now."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fp:
                fields = fp.read().rpartition(")")[2].split()
            with open(f"/proc/{pid}/task/{pid}/children") as fp:
                children = [int(c) for c in fp.read().split()]
        except OSError:  # gone meanwhile
            continue
        total += (int(fields[11]) + int(fields[12])) / tick + cpu_seconds(children)
    return total


def _submit_acknowledged(addresses: list[str], topic: str, width: int, copies: int,
                         part: int) -> None:
    """One client of :meth:`GearhornServers.gearmand_rate` (in a process of its own)."""
    client = gearman.Client([(a.rpartition(":")[0], int(a.rpartition(":")[2]))
                             for a in addresses])
    run = os.urandom(4).hex()
    try:
        for at in range(0, copies, 1000):
            client.submit_background([
                gearman.Copy(f"{topic}_c{n % width}", f"ceiling:{run}:{part}:{n}",
                             f'"m{n}"'.encode())
                for n in range(at, min(at + 1000, copies))])
    finally:
        client.close()


class MariaDB:
    """Debian's MariaDB on a free loopback port, data in ``folder``, with its
    durable defaults (InnoDB syncs its log at every commit); root without a
    passcode, database ``gearman`` (gearmand makes its table)."""

    @staticmethod
    def installed() -> bool:
        return bool(servers.find_binary("mariadbd") and shutil.which("mariadb-install-db"))

    def __init__(self, folder: str) -> None:
        data = os.path.join(folder, "mariadb")
        subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root",
                        "--auth-root-authentication-method=normal", "--skip-test-db"],
                       check=True, capture_output=True, timeout=300)
        self.port = servers.free_port()
        self.socket = os.path.join(folder, "mariadb.sock")
        self.process = subprocess.Popen(
            [servers.find_binary("mariadbd"), "--no-defaults", f"--datadir={data}",
             "--user=root", "--bind-address=127.0.0.1", f"--port={self.port}",
             f"--socket={self.socket}", "--skip-log-bin"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=die_with_parent)
        deadline = time.monotonic() + 120
        while not servers.is_listening("127.0.0.1", self.port):
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise SystemExit("MariaDB did not start")
            time.sleep(0.2)
        subprocess.run(["mariadb", f"--socket={self.socket}", "-uroot", "-e",
                        "CREATE DATABASE gearman"], check=True, timeout=60)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(60)


class Receipts(stomp.ConnectionListener):
    def __init__(self) -> None:
        self.count = 0
        self.changed = threading.Condition()
        self.error = ""

    def on_receipt(self, frame) -> None:
        with self.changed:
            self.count += 1
            self.changed.notify_all()

    def on_error(self, frame) -> None:
        with self.changed:
            self.error = frame.headers.get("message", "ERROR")
            self.changed.notify_all()

    def wait_for(self, count: int, timeout: float = 600) -> None:
        with self.changed:
            self.changed.wait_for(lambda: self.count >= count or self.error, timeout)
            if self.count < count:
                raise SystemExit(f"the broker gave {self.count} of {count} receipts "
                                 f"{self.error or 'in time'}")


def stomp_persistent_rate(port: int, login: dict, width: int, copies: int,
                          queue_type: str | None = None) -> float:
    """Copies/s into ``width`` durable subscriptions of one topic: persistent
    SENDs with receipts from one stomp.py producer. The same code for both
    brokers: the subscriptions are RabbitMQ's durable queues bound to
    amq.topic, and gearhorn's durable subscriptions (``durable:true``, a
    Gearman queue each that fills while the subscriber is away).
    ``queue_type``: RabbitMQ's ``x-queue-type`` for those queues (quorum)."""
    topic = f"durable{width}"
    declare = {"x-queue-type": queue_type} if queue_type else {}
    for first in range(0, width, SUBSCRIPTIONS_PER_CONNECTION):
        setup = connect(port, login)
        done = Receipts()
        setup.set_listener("r", done)
        last = min(width, first + SUBSCRIPTIONS_PER_CONNECTION)
        for i in range(first, last):  # durable: they outlive this connection
            setup.subscribe(f"/topic/{topic}", id=f"s{i}", ack="client",
                            headers={"durable": "true", "auto-delete": "false",
                                     "prefetch-count": "1", "receipt": f"sub{i}",
                                     **declare})
        done.wait_for(last - first)
        setup.disconnect()
    messages = max(1, copies // width)
    producer = connect(port, login)
    sent = Receipts()
    producer.set_listener("r", sent)
    start = time.perf_counter()
    for i in range(messages):
        producer.send(f"/topic/{topic}", PAYLOAD.encode(),
                      headers={"persistent": "true", "receipt": f"m{i}"})
    sent.wait_for(messages)
    elapsed = time.perf_counter() - start
    producer.disconnect()
    return messages * width / elapsed


MODES = ("default", "replica", "held", "sqlite", "mysql", "none")


def bench_modes(processes: int, quick: bool, chosen: tuple[str, ...] = MODES,
                gearmands: int = 1) -> dict[str, dict[int, float]]:
    # sqlite syncs every job: a few thousand copies take seconds already.
    durable = 20_000 if quick else 100_000
    slow = 2_000 if quick else 5_000
    # name: (gearmand queue, copies, durability, who keeps copies, label)
    modes = {
        # gearhorn up's setup: copies (and the bridge's SENDs) held by
        # gearhorn, gearmand on sqlite for other producers' jobs (none here);
        # acks after fsync
        "default": ("sqlite", durable, "fsync", "held", "every default (held)"),
        # the same, and each acknowledgement waits for one replica too
        "replica": ("sqlite", durable, "fsync", "held", "default + 1 replica waited for"),
        "sqlite": ("sqlite", slow, "fsync", "gearmand", "sqlite"),
        "mysql": ("mysql", slow, "fsync", "gearmand", "MySQL (MariaDB)"),
        "none": ("none", durable, "fsync", "gearmand", "none (memory only)"),
        # beside a plain gearmand (memory queue): gearhorn keeps the copies
        "held": ("none", durable, "fsync", "held", "none, copies held by gearhorn")}
    rates: dict[str, dict[int, float]] = {}
    for mode in chosen:
        queue, budget, durability, copies, label = modes[mode]
        if queue == "mysql" and not MariaDB.installed():
            print("  MySQL: not installed (apt-get install mariadb-server); not measured")
            continue
        # also measured as RabbitMQ is
        through_bridge = mode == "default"
        running = GearhornServers(queue, processes, bridge=through_bridge,
                                  durability=durability, gearmands=gearmands, copies=copies,
                                  replicas=1 if mode == "replica" else 0)
        fsyncs, cpu = {}, {}
        try:
            rates[mode] = {}
            for width in WIDTHS:
                rates[mode][width] = running.rate(width, budget)
                fsyncs[width], cpu[width] = running.fsyncs, running.cpu
            if mode == "none":  # the ceiling: gearmand alone, same setup
                rates[f"{mode} gearmand"] = {w: running.gearmand_rate(w, budget)
                                             for w in WIDTHS}
            if through_bridge:
                rates[f"{mode} stomp"] = {}
                for width in WIDTHS:
                    rates[f"{mode} stomp"][width] = running.stomp_rate(width, budget)
                    fsyncs[f"stomp {width}"] = running.fsyncs
        finally:
            running.close()
        show(f"gearmand queue {label}", rates[mode])
        if f"{mode} gearmand" in rates:
            show("  gearmand alone, the same acks", rates[f"{mode} gearmand"])
        if through_bridge:
            show("  the same, STOMP persistent", rates[f"{mode} stomp"])
        print("    CPU ms per 1,000 copies (pool / gearmand): " + ", ".join(
            f"x{w} {p:.0f} / {g:.0f}" for w, (p, g) in cpu.items()), flush=True)
        if durability == "fsync":
            print("    fsyncs/s (every Redis), copies per fsync: " + ", ".join(
                f"{k if isinstance(k, str) else f'x{k}'} {f:,.0f}/s {c:,.1f}"
                for k, (f, c) in fsyncs.items()), flush=True)
    if RabbitMQ.installed():
        with RabbitMQ() as rabbit:
            rates["rabbitmq"] = {w: stomp_persistent_rate(rabbit.port, rabbit.login, w,
                                                          durable) for w in WIDTHS}
        show("RabbitMQ, STOMP persistent", rates["rabbitmq"])
        if "replica" in chosen:  # the peer of a replica wait: a majority of three
            with rabbit_cluster.Brokers(3) as cluster:
                rates["rabbitmq quorum"] = {w: stomp_persistent_rate(
                    cluster.port, cluster.login, w, durable, "quorum") for w in WIDTHS}
            show("RabbitMQ, quorum queues on 3 nodes", rates["rabbitmq quorum"])
    else:
        print("  RabbitMQ: not installed (apt-get install rabbitmq-server); no comparison")
    return rates


def bench_latency(count: int, processes: int) -> None:
    """One producer, one fanout at a time to 10 subscribers (its copies
    background, the producer waiting for the answer): the latency of the
    default (copies held, answers after fsync) and of answering when
    written, alternating in one run (the servers of each fresh)."""
    # (durability, replicas waited for): the default, when written, and
    # the default with one replica (min_replicas = 1)
    setups = [("fsync", 0), ("written", 0), ("fsync", 1)]
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for durability, replicas in setups * 2:  # alternating: noise shows
        running = GearhornServers("sqlite", processes, durability=durability, copies="held",
                                  replicas=replicas)
        try:
            times = _fanout_times(running, count)
        finally:
            running.close()
        p50, p99 = times[len(times) // 2] * 1000, times[int(len(times) * 0.99)] * 1000
        results.setdefault((durability, replicas), []).append((p50, p99))
        print(f"  {durability:8} replicas {replicas}  p50 {p50:6.2f} ms   p99 {p99:6.2f} ms  "
              f"({count} fanouts x10)", flush=True)
    for what, base, added_by in (("the fsync barrier", ("written", 0), ("fsync", 0)),
                                 ("the replica wait", ("fsync", 0), ("fsync", 1))):
        for name, index in (("p50", 0), ("p99", 1)):
            added = [f[index] - w[index] for f, w in zip(
                results[added_by], results[base], strict=True)]
            print(f"  added by {what}, {name}: " + ", ".join(f"{a:+.2f} ms" for a in added))


def _fanout_times(running: GearhornServers, count: int) -> list[float]:
    """Seconds each of ``count`` fanouts took, one after another, sorted."""
    client = gearman.Client([(running.gearmand.host, running.gearmand.port)])
    times = []
    try:
        for i in range(count):
            job = json.dumps({"topic": "bench10", "payload": f"m{i}",
                              "background": True}).encode()
            start = time.perf_counter()
            outcome = client.call("fanout", job, timeout=60)
            times.append(time.perf_counter() - start)
            if not outcome.ok:
                raise SystemExit(f"fanout failed: {outcome.reason}")
    finally:
        client.close()
    return sorted(times)


def show(name: str, rates: dict[int, float]) -> None:
    print(f"  {name:32}  " + "   ".join(f"x{w}: {rates[w]:>8,.0f}" for w in WIDTHS)
          + "  copies/s", flush=True)


def bench_memory(copies: int, processes: int) -> None:
    """Memory per queued copy, nobody consuming: held copies (the pool's
    holders, the registry's Redis, gearmand) against copies in gearmand's
    memory queue (gearmand), each on fresh servers. The
    warden is off (no drops): every copy stays queued."""
    for copies_in in ("held", "gearmand"):
        running = GearhornServers("none", processes, copies=copies_in,
                                  extra_env={"GEARHORN_QUEUE_MAX_LENGTH": "0",
                                             "GEARHORN_QUEUE_MAX_BYTES": "0",
                                             "GEARHORN_LEDGER_ENABLED": "false"})
        try:
            before = running.memory()
            running.rate(100, copies)
            after = running.memory()
        finally:
            running.close()
        queued = copies + copies // 10  # the rate's warm-up too
        print(f"  copies {copies_in:8} " + "   ".join(
            f"{name} {(after[name] - before[name]) / queued:6.0f} B" for name in after)
            + f"  per copy ({queued:,} queued, x100)", flush=True)


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fp:
        for line in fp:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated, of {', '.join(MODES)} (default: all)")
    parser.add_argument("--latency", type=int, metavar="FANOUTS",
                        help="only measure the latency of single fanouts, fsync against written")
    parser.add_argument("--memory", type=int, metavar="COPIES",
                        help="only measure memory per queued copy, held against gearmand's queue")
    parser.add_argument("--gearmands", type=int, default=1,
                        help="gearmand servers")
    args = parser.parse_args()
    if args.latency:
        print(f"latency of one foreground fanout at a time ({os.cpu_count()} cores)", flush=True)
        bench_latency(args.latency, args.processes)
        return
    if args.memory:
        print(f"memory per queued copy ({os.cpu_count()} cores)", flush=True)
        bench_memory(args.memory, args.processes)
        return
    print(f"durable copies/s, 1 topic x {', '.join(map(str, WIDTHS))} subscribers "
          f"({os.cpu_count()} cores, {args.processes} worker processes, "
          f"{args.gearmands} gearmand, data on disk, "
          f"{'quick' if args.quick else 'full'} run)", flush=True)
    rates = bench_modes(args.processes, args.quick, tuple(args.modes.split(",")),
                        args.gearmands)
    print("ratios (same run):")
    for width in WIDTHS:
        parts = [f"{name} {rates[a][width] / rates[b][width]:5.2f}" for name, a, b in (
            ("default/RabbitMQ", "default", "rabbitmq"), ("default/none", "default", "none"),
            ("replica/default", "replica", "default"), ("replica/RabbitMQ", "replica", "rabbitmq"),
            ("replica/RabbitMQ quorum", "replica", "rabbitmq quorum"),
            ("default/sqlite", "default", "sqlite"), ("held/RabbitMQ", "held", "rabbitmq"),
            ("none/gearmand alone", "none", "none gearmand"),
            ("STOMP/RabbitMQ", "default stomp", "rabbitmq"))
            if a in rates and b in rates]
        print(f"  x{width}: " + "   ".join(parts))

if __name__ == "__main__":
    main()
