"""Fanout throughput and Redis memory, with the peer measured in the same run.

    python bench/fanout.py            # everything (about 2 minutes on 2 cores)
    python bench/fanout.py --quick    # smaller counts, for a smoke run
    python bench/fanout.py --ledger-cost   # throughput with the delivery ledger on vs off
    python bench/fanout.py --setting-cost GEARHORN_REALTIME_HISTORY_SIZE=0 --turns 4
                                           # the defaults against one setting, in turns
    python bench/fanout.py --commits bf1f1be . --turns 4
                                           # two commits' pools, in turns
    python bench/fanout.py --defaults-off --turns 3
                                           # the defaults against each turned off

Starts its own redis-server and gearmand on free loopback ports (they stop
with this process) and a ``gearhorn worker`` pool, then measures:

1. copies per second accepted by gearmand for 1 topic x 10 / 100 / 1,000
   subscribers: background ``fanout`` jobs through the pool, against a plain
   ``gear.Client`` (TCP_NODELAY on) submitting the same copies one by one;
2. worker memory (RSS) while the pool pushes a million copies;
3. Redis memory per subscription, 1M subscriptions over 10,000 topics.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import gear
import redis

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from gearhorn import gearman  # noqa: E402
from gearhorn.rules.messages import Subscription  # noqa: E402
from gearhorn.runtime.children import die_with_parent
from gearhorn.store import redisconn
from gearhorn.store.keys import Keys  # noqa: E402
from gearhorn.store.registry import Registry  # noqa: E402
from gearhorn.supervision import servers


def start_pool(gm: servers.Managed, redis_url: str, processes: int,
               ledger: bool = True, env: dict[str, str] | None = None,
               tree: str | None = None, also: tuple[servers.Managed, ...] = ()
               ) -> subprocess.Popen:
    """A ``gearhorn worker`` pool; ``tree``: run the gearhorn of that checkout;
    ``also``: more gearmand it serves."""
    source = {"PYTHONPATH": tree} if tree else {}
    pool = subprocess.Popen(
        [sys.executable, "-m", "gearhorn", "worker", "--processes", str(processes),
         *(arg for server in (gm, *also) for arg in ("--gearman", server.address)),
         "--redis-url", redis_url, "--log-level", "WARNING"],
        # gearmand here keeps no queue (start_gearmand's default): no queue
        # Redis for the acknowledgements to wait for (gearhorn/store/fsync.py),
        # and the copies in its memory (bench/durable.py measures held ones).
        env={**os.environ, "GEARHORN_PERSISTENCE": "none", "GEARHORN_COPIES": "gearmand",
             "GEARHORN_LEDGER_ENABLED": str(ledger).lower(), **source, **(env or {})},
        cwd=tree, preexec_fn=die_with_parent)
    registry = Registry(redisconn.connect(redis_url), Keys())
    deadline = time.monotonic() + 60
    while len(registry.live_workers()) < processes:
        if time.monotonic() > deadline or pool.poll() is not None:
            raise SystemExit("worker pool did not start")
        time.sleep(0.1)
    return pool


def subscribe_many(registry: Registry, topic: str, count: int) -> None:
    for i in range(count):
        registry.subscribe(Subscription(topic, f"c{i}"))


def gearhorn_rate(gm: servers.Managed, topic: str, fanouts: int, width: int) -> float:
    """Copies/s: ``fanouts`` background fanout jobs, all in flight at once.

    Unique keys are new in every call: a key still queued from a warm-up
    would be coalesced by gearmand (and its copies not written again)."""
    client = gearman.Client([(gm.host, gm.port)])
    run = os.urandom(4).hex()
    jobs = [gearman.Copy("fanout", f"bench:{run}:{topic}:{i}",
                         json.dumps({"topic": topic, "payload": f"m{i}",
                                     "background": True}).encode())
            for i in range(fanouts)]
    start = time.perf_counter()
    outcomes = client.submit_foreground(jobs, timeout=600)
    elapsed = time.perf_counter() - start
    client.close()
    bad = [o for o in outcomes if not o.ok or json.loads(o.data)["copies"] != width]
    if bad:
        raise SystemExit(f"fanout failed: {bad[0]}")
    return fanouts * width / elapsed


def gear_client_rate(gm: servers.Managed, topic: str, fanouts: int, width: int) -> float:
    """Copies/s: the same copies submitted one by one with gear.Client."""
    client = gear.Client("bench-peer")
    client.addServer(gm.host, gm.port)
    client.waitForServer(10)
    for conn in client.active_connections:
        conn.conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    start = time.perf_counter()
    for i in range(fanouts):
        for c in range(width):
            job = gear.Job(f"{topic}_c{c}", f"m{i}".encode(), unique=f"p{i}:c{c}")
            client.submitJob(job, background=True)
        for conn in client.active_connections:
            conn.related_jobs.clear()  # gear never frees these; don't bill it
    elapsed = time.perf_counter() - start
    client.shutdown()
    return fanouts * width / elapsed


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fp:
        for line in fp:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def worker_pids(pool: subprocess.Popen) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pool.pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def bench_throughput(gm, registry, redis_url, quick: bool) -> list[tuple]:
    rows = []
    budget = 20_000 if quick else 100_000  # copies per measurement
    for width in (10, 100, 1000):
        topic = f"bench{width}"
        fanouts = max(1, budget // width)
        gearhorn_rate(gm, topic, max(1, fanouts // 10), width)  # warm up caches
        restart_gearmand_queue(gm)  # within the default bound (see pool_rates)
        ours = gearhorn_rate(gm, topic, fanouts, width)
        peer = gear_client_rate(gm, topic, max(1, fanouts // 5), width)
        rows.append((width, fanouts * width, ours, peer, ours / peer))
        print(f"  1 topic x {width:>5} subscribers: gearhorn {ours:>9,.0f} copies/s   "
              f"gear.Client one by one {peer:>8,.0f} copies/s   ratio {ours / peer:5.1f}",
              flush=True)
        restart_gearmand_queue(gm)
    return rows


def restart_gearmand_queue(gm: servers.Managed) -> None:
    """Empty the copy queues so later phases don't pay for earlier ones."""
    for f in gearman.status(gm.host, gm.port):
        if f.queued and f.name.startswith("bench"):
            # No worker is attached to these; dropping them is what a reset does.
            gearman.admin(gm.host, gm.port, f"drop function {f.name}")


def pool_rates(gm, redis_url, processes: int, quick: bool, ledger: bool = True,
               env: dict[str, str] | None = None, tree: str | None = None) -> list[float]:
    """Copies/s of a fresh pool at widths 10, 100 and 1,000 (after a warm-up each)."""
    budget = 20_000 if quick else 100_000
    pool = start_pool(gm, redis_url, processes, ledger=ledger, env=env, tree=tree)
    try:
        run = []
        for width in (10, 100, 1000):
            topic = f"bench{width}"
            fanouts = max(1, budget // width)
            gearhorn_rate(gm, topic, max(1, fanouts // 10), width)
            # The warm-up's copies go first: with them x10's queues would
            # pass the default bound (10,000 a queue, drop-head), and the
            # warden would be taking the excess while the run is measured.
            restart_gearmand_queue(gm)
            run.append(gearhorn_rate(gm, topic, fanouts, width))
            restart_gearmand_queue(gm)
        return run
    finally:
        pool.send_signal(signal.SIGTERM)
        pool.wait(30)
        drop_ledger(redis_url)


def drop_ledger(redis_url: str) -> None:
    """Each pool starts with an empty ledger (20 MB of it a pool would stay
    in Redis for the pools after)."""
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match="{gearhorn:ledger:*", count=1000):
        client.delete(key)


def bench_ledger_cost(gm, registry, redis_url, processes: int, quick: bool) -> None:
    """The same fanouts with the delivery ledger on and off."""
    rates: dict[bool, list[list[float]]] = {}
    for enabled in (True, False, True):
        rates.setdefault(enabled, []).append(
            pool_rates(gm, redis_url, processes, quick, ledger=enabled))
    for i, width in enumerate((10, 100, 1000)):
        on = sum(r[i] for r in rates[True]) / len(rates[True])
        off = rates[False][0][i]
        print(f"  1 topic x {width:>5} subscribers: ledger on {on:>9,.0f} copies/s   "
              f"off {off:>9,.0f} copies/s   cost {100 * (1 - on / off):5.1f}%", flush=True)


def bench_in_turns(processes: int, quick: bool, pools: dict[str, dict], turns: int) -> None:
    """The same fanouts through each pool (label -> ``pool_rates`` keywords:
    an ``env``, a source ``tree``), in turns whose order rotates (A B C,
    B C A, ...; two pools: A B, B A): each turn's figures to read the
    spread by, then the medians and each pool's over the first's. Each
    turn runs on a Redis and a gearmand of its own: fifty pools on the same
    servers ran each slower than the one before, whatever its setting (a
    rate at the tenth turn of five pools 0.4 of the first's, the ledger
    dropped between pools)."""
    import statistics

    labels = list(pools)
    rates: dict[str, list[list[float]]] = {label: [] for label in labels}
    for turn in range(turns):
        shift = turn % len(labels)
        with turn_servers() as (turn_gm, turn_url):
            for label in labels[shift:] + labels[:shift]:
                rates[label].append(pool_rates(turn_gm, turn_url, processes, quick,
                                               **pools[label]))
        print(f"  turn {turn + 1}: " + "   ".join(
            f"x{w} " + " / ".join(f"{rates[label][-1][i]:,.0f}" for label in labels)
            for i, w in enumerate((10, 100, 1000))), flush=True)
    first = labels[0]
    for i, width in enumerate((10, 100, 1000)):
        base = statistics.median(r[i] for r in rates[first])
        print(f"  1 topic x {width:>5} subscribers: {first} {base:>9,.0f} copies/s", flush=True)
        for label in labels[1:]:
            rate = statistics.median(r[i] for r in rates[label])
            print(f"      {label:<34} {rate:>9,.0f} copies/s   {first} / it "
                  f"{base / rate:5.2f}", flush=True)


@contextlib.contextmanager
def turn_servers():
    """(gearmand, Redis URL) for one turn, with the benchmark's
    subscriptions; stopped after."""
    with tempfile.TemporaryDirectory() as tmp:
        r_server = servers.start_redis()
        gm = servers.start_gearmand(data_dir=tmp)
        try:
            url = r_server.details["url"]
            registry = Registry(redis.Redis.from_url(url), Keys())
            for width in (10, 100, 1000):
                subscribe_many(registry, f"bench{width}", width)
            yield gm, url
        finally:
            gm.stop()
            r_server.stop()


# Each default a fanout pays for, and the setting that turns it off
# (--defaults-off): what the defaults cost, one at a time.
DEFAULTS_OFF = {
    "ledger off": {"GEARHORN_LEDGER_ENABLED": "false"},
    "metrics off": {"GEARHORN_METRICS_ENABLED": "false"},
    "bounded queues off (tally, warden)": {"GEARHORN_RETENTION_INTERVAL": "0"},
    "real-time topics off": {"GEARHORN_REALTIME_HISTORY_SIZE": "0"},
}


def bench_worker_memory(gm, registry, pool, total: int) -> list[tuple[int, int]]:
    topic = "benchmem"
    subscribe_many(registry, topic, 1000)
    pids = worker_pids(pool)
    samples = [(0, sum(rss_kib(p) for p in pids))]
    print(f"  before any copy:      workers' RSS {samples[0][1] / 1024:7.1f} MiB", flush=True)
    step = total // 4
    for done in range(step, total + 1, step):
        gearhorn_rate(gm, topic, step // 1000, 1000)
        samples.append((done, sum(rss_kib(p) for p in pids)))
        restart_gearmand_queue(gm)
        print(f"  after {done:>9,} copies: workers' RSS {samples[-1][1] / 1024:7.1f} MiB",
              flush=True)
    return samples


def bench_redis_memory(quick: bool) -> float:
    r_server = servers.start_redis()
    try:
        client = redis.Redis.from_url(r_server.details["url"])
        registry = Registry(client, Keys())
        subscriptions = 100_000 if quick else 1_000_000
        topics = 10_000
        base = client.info("memory")["used_memory"]
        per_topic = subscriptions // topics
        script = registry._subscribe
        pipe = client.pipeline(transaction=False)
        for t in range(topics):
            topic = f"topic.{t:05d}"
            for c in range(per_topic):
                keys = [registry.keys.topic(topic), registry.keys.topic_version(topic)]
                script(keys=keys, args=["1", topic, f"client-{c:06d}", registry.keys.channel],
                       client=pipe)
            pipe.sadd(registry.keys.topics, topic)
            if t % 100 == 99:
                pipe.execute()
        pipe.execute()
        used = client.info("memory")["used_memory"] - base
        per = used / subscriptions
        print(f"  {subscriptions:,} subscriptions over {topics:,} topics: "
              f"{used / 2**20:.1f} MiB, {per:.0f} bytes per subscription", flush=True)
        return per
    finally:
        r_server.stop()


def in_turns(args: argparse.Namespace) -> bool:
    """The modes that compare pools in turns (each turn on servers of its
    own); whether one was asked for."""
    if args.setting_cost:
        print(f"the defaults against {args.setting_cost}, {args.turns} alternating "
              "turns (each: defaults / with it, copies/s):")
        name, _, value = args.setting_cost.partition("=")
        pools = {"defaults": {}, args.setting_cost: {"env": {name: value}}}
    elif args.defaults_off:
        print(f"the defaults and each turned off, {args.turns} turns (each: "
              f"defaults / {' / '.join(DEFAULTS_OFF)}, copies/s; no queue persistence):")
        pools = {"defaults": {}, **{label: {"env": env} for label, env in DEFAULTS_OFF.items()}}
    elif args.commits:
        from bench.ab import checkouts

        print(f"{args.commits[0]} against {args.commits[1]}, {args.turns} alternating "
              "turns (copies/s of each):")
        with checkouts(args.commits) as trees:
            bench_in_turns(args.processes, args.quick,
                           {rev: {"tree": trees[rev]} for rev in args.commits}, args.turns)
        return True
    else:
        return False
    bench_in_turns(args.processes, args.quick, pools, args.turns)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--ledger-cost", action="store_true",
                        help="only compare throughput with the delivery ledger on and off")
    parser.add_argument("--setting-cost", metavar="NAME=VALUE",
                        help="only compare throughput on the defaults and with this "
                             "environment setting, e.g. GEARHORN_REALTIME_HISTORY_SIZE=0")
    parser.add_argument("--commits", nargs=2, metavar="REV",
                        help="only compare two commits' pools in turns (. is the working "
                             "tree; others are checked out into a temporary worktree)")
    parser.add_argument("--defaults-off", action="store_true",
                        help="only compare the defaults with each default turned off in "
                             "turn (ledger, metrics, bounded queues, real-time topics)")
    parser.add_argument("--turns", type=int, default=3,
                        help="of --setting-cost, --commits, --defaults-off")
    args = parser.parse_args()
    print(f"gearhorn fanout benchmark ({os.cpu_count()} cores, {args.processes} worker "
          f"processes, {'quick' if args.quick else 'full'} run)", flush=True)
    if in_turns(args):
        return
    with tempfile.TemporaryDirectory() as tmp:
        r_server = servers.start_redis()
        gm = servers.start_gearmand(data_dir=tmp)
        print("  gearmand", " ".join(gearman.admin(gm.host, gm.port, "version")))
        redis_url = r_server.details["url"]
        registry = Registry(redis.Redis.from_url(redis_url), Keys())
        for width in (10, 100, 1000):
            subscribe_many(registry, f"bench{width}", width)
        if args.ledger_cost:
            print("delivery ledger cost (ledger on: mean of a run before and after off):")
            bench_ledger_cost(gm, registry, redis_url, args.processes, args.quick)
            gm.stop()
            r_server.stop()
            return
        pool = start_pool(gm, redis_url, args.processes)
        try:
            print("throughput (copies accepted by gearmand):")
            bench_throughput(gm, registry, redis_url, args.quick)
            print("worker memory while fanning out:")
            bench_worker_memory(gm, registry, pool, 200_000 if args.quick else 1_000_000)
        finally:
            pool.send_signal(signal.SIGTERM)
            pool.wait(30)
            gm.stop()
            r_server.stop()
    print("redis memory:")
    bench_redis_memory(args.quick)


if __name__ == "__main__":
    main()
