"""The live audit: its lag and memory, and what it costs the pool, in one run.

    python bench/audit.py            # 1,000 and 10,000 copies/s (90 s each), 4 turns, the report
    python bench/audit.py --quick    # 30 s each, 2 turns
    python bench/audit.py --engines count,spark   # the count-first audit beside Spark's
    python bench/audit.py --spark-workers 1,2      # Spark's capacity on a standalone cluster

``--engines``: ``count`` is ``gearhorn audit`` (count first, the default
since issue 79), ``spark`` is ``gearhorn audit --master local[*]`` (the
Spark Structured Streaming job it was before), each measured in turn on the
same servers in the same run.

Starts redis-server and gearmand (memory queue) on free loopback ports, a
``gearhorn worker`` pool (held copies, the default), 10 subscribers of one
topic with two consumer processes answering every copy, and ``gearhorn
audit`` with its defaults (a read of the ledger every 2 s, 5 s lateness, a
60 s deadline). Everything listens on 127.0.0.1 and stops with this process.

1. Lag and memory at a paced 1,000 and 10,000 copies/s: after a warm-up,
   each micro-batch's lag behind the ledger (from the export reading the
   ledger to the micro-batch's judgement; p50/p99), the copies/s the pool
   actually reached, the resident memory of the audit's process tree (the
   Python driver and Spark's JVM) at the end, and its findings (none).
2. The pool's throughput, unpaced, with the audit on and off in turns: off
   is the audit stopped (SIGSTOP to its process group), on is it running,
   after it has caught up with what came while it was stopped.
3. The batch report on the same ledger, for comparison: ``gearhorn ledger
   export`` of all of it, then ``gearhorn report``, timed.

``--spark-workers 1,2`` measures instead ``gearhorn audit --master`` on a
Spark standalone cluster (gearhorn/supervision/sparkcluster.py) of that
many workers of ``--spark-cores`` cores each, one cluster after the other:
its capacity, the copies/s it judges while behind (traffic paced above it
for ``--capacity-seconds``, then the time until it has judged it all).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.durable import tree_rss  # noqa: E402
from bench.fanout import start_pool, subscribe_many  # noqa: E402
from gearhorn import gearman  # noqa: E402
from gearhorn.runtime.children import die_with_parent
from gearhorn.store import redisconn  # noqa: E402
from gearhorn.store.keys import Keys  # noqa: E402
from gearhorn.store.registry import Registry  # noqa: E402
from gearhorn.supervision import servers
from gearhorn.supervision.sparkcluster import SparkStandalone  # noqa: E402

TOPIC, WIDTH = "audited", 10
CONSUMER = """
import sys, time
from gearhorn import gearman
worker = gearman.WorkerConnection(sys.argv[1], int(sys.argv[2]), sys.argv[3:])
worker.open()
while True:
    jobs = worker.grab(200)
    for job in jobs:
        worker.complete(job.handle)
    if not jobs:
        time.sleep(0.005)
"""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Audit:
    """``gearhorn audit`` in a process group of its own."""

    def __init__(self, redis_url: str, folder: str, engine: str = "count",
                 log_level: str = "WARNING", master: str | None = None) -> None:
        self.folder = folder
        master = master or ("local[*]" if engine == "spark" else None)
        spark = ["--master", master] if master else []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gearhorn", "audit", "--dir", folder, "--redis-url",
             redis_url, "--log-level", log_level, *spark],
            stdout=open(os.path.join(folder + ".log"), "ab"), stderr=subprocess.STDOUT,  # noqa: SIM115
            start_new_session=True, preexec_fn=die_with_parent,
            env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})

    def state(self) -> dict:
        try:
            with open(os.path.join(self.folder, "state.json")) as fp:
                return json.load(fp)
        except (OSError, ValueError):
            return {}

    def caught_up(self, timeout: float = 600) -> None:
        """Until it has judged a micro-batch whose clock is after now."""
        since, deadline = now_ms(), time.monotonic() + timeout
        while self.state().get("clock_ms", 0) <= since:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the audit is not judging; see {self.folder}.log")
            time.sleep(0.2)

    def pause(self, stopped: bool) -> None:
        os.killpg(self.process.pid, signal.SIGSTOP if stopped else signal.SIGCONT)

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGCONT)
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)


def fanouts(count: int, run: str) -> list[gearman.Copy]:
    return [gearman.Copy("fanout", f"bench:{run}:{i}", json.dumps(
        {"topic": TOPIC, "payload": f"m{i}", "background": True}).encode())
        for i in range(count)]


def paced(gm: servers.Managed, copies_per_s: int, seconds: float) -> float:
    """Fanouts at ``copies_per_s`` for ``seconds``; the copies/s reached."""
    client = gearman.Client([(gm.host, gm.port)])
    per_tick, sent = max(1, copies_per_s // WIDTH // 10), 0  # a tenth of a second
    started = time.monotonic()
    while (elapsed := time.monotonic() - started) < seconds:
        client.submit_foreground(fanouts(per_tick, f"{os.getpid()}-{sent}"), timeout=120)
        sent += per_tick
        time.sleep(max(0.0, sent / (copies_per_s / WIDTH) - (time.monotonic() - started)))
    client.close()
    return sent * WIDTH / elapsed


def unpaced(gm: servers.Managed, seconds: float) -> float:
    """Fanouts 500 at a time for ``seconds``; copies/s."""
    client = gearman.Client([(gm.host, gm.port)])
    sent, started = 0, time.monotonic()
    while time.monotonic() - started < seconds:
        client.submit_foreground(fanouts(500, f"u{os.getpid()}-{sent}"), timeout=300)
        sent += 500
    elapsed = time.monotonic() - started
    client.close()
    return sent * WIDTH / elapsed


def quantile(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000


def lag_and_memory(gm, audit: Audit, rate: int, seconds: float) -> dict:
    paced(gm, rate, min(20.0, seconds / 3))  # warm-up
    audit.caught_up()
    first = audit.state()["batch"]
    peak = [0.0]

    def sample() -> None:
        while not done.wait(1.0):
            peak[0] = max(peak[0], tree_rss(audit.process.pid))
    done = threading.Event()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    reached = paced(gm, rate, seconds)
    audit.caught_up()
    done.set()
    state = audit.state()
    batches = state["batch"] - first
    lags = state["lags_ms"][-batches:] if batches else []
    return {"rate": rate, "reached": reached, "batches": batches,
            "p50": quantile(lags, 0.5), "p99": quantile(lags, 0.99),
            "rss_mib": tree_rss(audit.process.pid) / 2**20, "peak_mib": peak[0] / 2**20,
            "state_rows": state.get("state_rows"),
            "findings": sum(sum(k.values()) for k in state["totals"].values())}


def in_turns(gm, audit: Audit, turns: int,
             seconds: float) -> tuple[list[float], list[float], list[int]]:
    """Unpaced copies/s with the audit on and off, and its lags while on
    (a round's lag behind the counts it read: unpaced is its hardest test)."""
    on, off, lags = [], [], []
    for _ in range(turns):
        audit.pause(True)
        off.append(unpaced(gm, seconds))
        audit.pause(False)
        audit.caught_up()
        first = audit.state()["batch"]
        on.append(unpaced(gm, seconds))
        state = audit.state()
        rounds = state["batch"] - first
        lags += state["lags_ms"][-rounds:] if rounds > 0 else []
        audit.caught_up()
    return on, off, lags


def batch_report(redis_url: str, tmp: str) -> tuple[float, float, str]:
    """(export seconds, report seconds, the report's summary line)."""
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "gearhorn", "ledger", "export", "--out",
                    f"{tmp}/ledger", "--redis-url", redis_url], check=True,
                   capture_output=True)
    exported = time.monotonic() - started
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "gearhorn", "report", "--ledger",
                          f"{tmp}/ledger", "--out", f"{tmp}/report"], check=True,
                         capture_output=True, text=True, env={**os.environ,
                                                              "GEARHORN_REDIS_URL": redis_url})
    return exported, time.monotonic() - started, out.stdout.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rates", default="1000,10000", help="copies/s to pace at")
    parser.add_argument("--engines", default="count", help="count, spark, or both in turn")
    parser.add_argument("--no-report", action="store_true", help="skip the batch report")
    parser.add_argument("--turns", type=int, help="on/off turns (default 4; --quick 2)")
    parser.add_argument("--turn", type=float, help="seconds of each turn (default 20; "
                        "300 for the 5-minute unpaced run)")
    parser.add_argument("--spark-workers", help="e.g. 1,2: Spark's capacity on a standalone "
                        "cluster of that many workers, instead of the rest")
    parser.add_argument("--spark-cores", type=int, default=1, help="cores of each worker")
    parser.add_argument("--capacity-rate", type=int, default=10_000,
                        help="copies/s paced while its capacity is measured (above it)")
    parser.add_argument("--capacity-seconds", type=float, default=120.0)
    parser.add_argument("--audit-log-level", default="WARNING",
                        help="the audit's (INFO: each round's closer looks, their time and "
                        "cause; the log is <tmp>/audit-<engine>.log)")
    args = parser.parse_args()
    seconds, turns, turn = (30.0, 2, 10.0) if args.quick else (90.0, 4, 20.0)
    turns, turn = args.turns or turns, args.turn or turn
    tmp = tempfile.mkdtemp(prefix="gearhorn-audit-bench-")
    redis_server = servers.start_redis(data_dir=f"{tmp}/redis")
    gm = servers.start_gearmand(data_dir=f"{tmp}/gearmand")
    redis_url = f"redis://127.0.0.1:{redis_server.port}/0"
    print(f"live audit ({os.cpu_count()} cores; 1 topic x {WIDTH} subscribers, 2 worker "
          f"processes, held copies, 2 consumer processes; audit defaults)", flush=True)
    pool = start_pool(gm, redis_url, 2, env={"GEARHORN_COPIES": "held"})
    subscribe_many(Registry(redisconn.connect(redis_url), Keys()), TOPIC, WIDTH)
    queues = [f"{TOPIC}_c{i}" for i in range(WIDTH)]
    consumers = [subprocess.Popen([sys.executable, "-c", CONSUMER, gm.host, str(gm.port),
                                   *queues[half::2]], preexec_fn=die_with_parent)
                 for half in (0, 1)]
    audits: list[Audit] = []
    try:
        if args.spark_workers:
            for workers in (int(n) for n in args.spark_workers.split(",")):
                on_cluster(gm, redis_url, f"{tmp}/cluster-{workers}", workers, args)
            return
        for engine in args.engines.split(","):
            audits.append(Audit(redis_url, f"{tmp}/audit-{engine}", engine,
                                args.audit_log_level))
            measure(gm, audits[-1], engine, args.rates, seconds, turns, turn)
            audits[-1].stop()
            print(f"{engine}: the audit's log: {tmp}/audit-{engine}.log", flush=True)
        if not args.no_report:
            exported, took, line = batch_report(redis_url, tmp)
            print(f"batch report on the same ledger: export {exported:.1f} s, report "
                  f"{took:.1f} s: {line}")
    finally:
        for audit in audits:
            audit.stop()
        for process in (*consumers, pool):
            process.terminate()
        gm.stop()
        redis_server.stop()


def on_cluster(gm: servers.Managed, redis_url: str, folder: str, workers: int,
               args: argparse.Namespace) -> None:
    """The Spark audit on a standalone cluster of ``workers`` workers: its
    capacity, paced above it, twice (the first includes its start)."""
    os.makedirs(folder)
    cluster = SparkStandalone(folder, workers=workers, cores=args.spark_cores).wait_ready()
    audit = Audit(redis_url, f"{folder}/audit", "spark", args.audit_log_level, cluster.url)
    try:
        for _ in range(2):
            got = capacity(gm, audit, args.capacity_rate, args.capacity_seconds)
            print(f"spark on {workers} worker(s) x {args.spark_cores} core(s): paced "
                  f"{args.capacity_rate:,} (reached {got['reached']:,.0f}) copies/s for "
                  f"{args.capacity_seconds:g} s, all judged after {got['took']:.0f} s: "
                  f"{got['capacity']:,.0f} copies/s"
                  f"{' (kept up: at least)' if got['kept_up'] else ''}; memory "
                  f"{got['rss_mib']:,.0f} MiB", flush=True)
    finally:
        audit.stop()
        cluster.stop()
    print(f"the audit's log: {folder}/audit.log", flush=True)


def capacity(gm: servers.Managed, audit: Audit, rate: int, seconds: float) -> dict:
    """Traffic at ``rate`` for ``seconds``, then until the audit has judged
    all of it: the copies sent over that time is what it judges a second
    (a micro-batch may take longer than the traffic: its clock moves in
    steps). When it is done within the traffic's time it kept up, and the
    figure is a lower bound."""
    audit.caught_up(timeout=1800)
    started = time.monotonic()
    reached = paced(gm, rate, seconds)
    rss = tree_rss(audit.process.pid) / 2**20
    audit.caught_up(timeout=3600)
    took = time.monotonic() - started
    return {"reached": reached, "took": took, "capacity": reached * seconds / took,
            "kept_up": took < seconds + 30, "rss_mib": rss}


def measure(gm, audit: Audit, engine: str, rates: str, seconds: float, turns: int,
            turn: float) -> None:
    audit.caught_up()
    for rate in (int(r) for r in rates.split(",")):
        got = lag_and_memory(gm, audit, rate, seconds)
        print(f"{engine}: paced {got['rate']:>6,} copies/s (reached {got['reached']:,.0f}): "
              f"audit lag p50 {got['p50']:.2f} s, p99 {got['p99']:.2f} s over "
              f"{got['batches']} rounds; audit memory {got['rss_mib']:,.0f} MiB (peak "
              f"{got['peak_mib']:,.0f}), state {got['state_rows']:,} rows; "
              f"findings {got['findings']}", flush=True)
    on, off, lags = in_turns(gm, audit, turns, turn)
    print(f"{engine}: pool copies/s, audit off: {', '.join(f'{r:,.0f}' for r in off)}")
    print(f"{engine}: pool copies/s, audit on:  {', '.join(f'{r:,.0f}' for r in on)}")
    ratios = [a / b for a, b in zip(on, off, strict=True)]
    print(f"{engine}: ratios (same run): on/off {', '.join(f'{r:.3f}' for r in ratios)}; "
          f"median {statistics.median(ratios):.3f}; audit lag while on, unpaced: p50 "
          f"{quantile(lags, 0.5) if lags else float('nan'):.2f} s, p99 "
          f"{quantile(lags, 0.99) if lags else float('nan'):.2f} s", flush=True)


if __name__ == "__main__":
    main()
