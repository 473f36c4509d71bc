"""What gearhorn costs as its subscriptions grow (issue 49).

    python bench/million.py                       # 1,000 and 100,000
    python bench/million.py --counts 1000 1000000 # a million: ~25 minutes
    python bench/million.py --wide 0              # without the wide topic
    python bench/million.py --cluster             # on a 3-master Redis Cluster
    python bench/million.py --status-at 100000 1000000  # gearmand's status alone
    python bench/million.py --counts 1000 1000000 --turns 3  # per-call only, in turns

For each count: a fresh Redis and gearmand, a pool of 2 ``gearhorn
worker`` processes with every default on (warden, janitor, metrics,
presence), and that many subscriptions (topics of 10). Then nothing is published for
``--seconds`` while the CPU time of the workers, gearmand and Redis is
read from /proc, and the warden's round counted in Redis's commands. The
peer is the smallest count of the same run: idle CPU is compared against
it (the target is within 2x at the largest).

Then, with the warden's rounds going on, the per-call figures: p50/p99 of
``subscribe_fanout`` and ``unsubscribe_fanout`` (200 each, new client ids
on a topic of 10), of ``topic_presence`` on a topic of 10 and on a topic of
``--wide`` subscribers (100,000; made with the others, so it is there at
every count), and copies/s of background fanouts to a topic of 10 (10,000
fanouts) and to the wide topic (3 fanouts). Then idle again, the wide
topic's queues holding their copies (nobody reads), and once more with 10
fanouts a second to a topic of 10 (the warden's rounds then have something
to look at each second). Everything is in the same
single Redis; a count's figures beside the smallest count's are the ratio
that matters.

With ``--turns N`` only the per-call figures are taken, every count's
servers and pool up at once and measured in alternating turns (1K, 1M,
1M, 1K, ...), the medians compared: what tells a real cost of the count
from the machine's noise, which swings a single fanout measure by a third.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import redis

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from fanout import gearhorn_rate  # noqa: E402

from gearhorn import gearman  # noqa: E402
from gearhorn.config import Config  # noqa: E402
from gearhorn.rules.messages import Subscription  # noqa: E402
from gearhorn.runtime.children import die_with_parent
from gearhorn.store import redisconn  # noqa: E402
from gearhorn.store.keys import Keys  # noqa: E402
from gearhorn.store.registry import Registry  # noqa: E402
from gearhorn.store.subscribers import SubscriberCache  # noqa: E402
from gearhorn.supervision import (
    redisclusters,  # noqa: E402
    servers,
)

WIDTH = 10  # subscribers per topic
CALLS = 200  # of each per-call figure
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and its threads, in seconds."""
    with open(f"/proc/{pid}/stat") as fp:
        fields = fp.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def subscribe_all(url: str, count: int, wide: int) -> None:
    """``count`` subscriptions over ``count / WIDTH`` topics, and ``wide``
    to the topic ``wide``: in two processes of 8 threads (the registry's
    own calls, a few round trips each)."""
    with ProcessPoolExecutor(2) as pool:
        list(pool.map(_subscribe_part, [url] * 2, [count] * 2, [wide] * 2, [0, 1]))


def _subscribe_part(url: str, count: int, wide: int, part: int) -> None:
    registry = Registry(redisconn.connect(url), Keys())

    def some(start: int) -> None:
        for n in range(start, min(start + 1000, count)):
            registry.subscribe(Subscription(f"idle.{n // WIDTH:06d}", f"c{n % WIDTH}"))
        for n in range(start, min(start + 1000, wide)):
            registry.subscribe(Subscription("wide", f"w{n}"))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(some, range(part * 1000, max(count, wide), 2000)))


@contextlib.contextmanager
def settled_pool(url: str, gm: servers.Managed):
    """A pool of 2 workers, every default on, once its warden has judged
    every new subscription (start-up, not idling: measured after it)."""
    pool = subprocess.Popen(
        [sys.executable, "-m", "gearhorn", "worker", "--processes", "2", "--gearman",
         gm.address, "--redis-url", url, "--log-level", "WARNING"],
        env={**os.environ, "GEARHORN_PERSISTENCE": "none"}, preexec_fn=die_with_parent)
    try:
        registry = Registry(redisconn.connect(url), Keys())
        client, keys = registry.redis, registry.keys
        deadline = time.monotonic() + 1200
        while len(registry.live_workers()) < 2:
            if time.monotonic() > deadline or pool.poll() is not None:
                raise SystemExit("worker pool did not start")
            time.sleep(0.1)
        while not client.exists(keys.warden_scanned) or client.scard(keys.renewed):
            if time.monotonic() > deadline or pool.poll() is not None:
                raise SystemExit("the warden never judged the new subscriptions")
            time.sleep(0.2)
        time.sleep(3)
        yield pool
    finally:
        pool.send_signal(signal.SIGTERM)
        pool.wait(60)


def idle_cpu(nodes: list[servers.Managed], pool: subprocess.Popen, gm: servers.Managed,
             seconds: float, profile: str = "") -> dict:
    """CPU per second of each part while idle; ``profile``: py-spy each worker to it."""
    pids = {"workers": [pool.pid, *children(pool.pid)], "gearmand": [gm.process.pid],
            "redis": [node.process.pid for node in nodes]}
    calls = commandstats(nodes)
    before = {k: sum(map(cpu_seconds, v)) for k, v in pids.items()}
    spies = [subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "py-spy"),
                               "record", "-o", f"{profile}.{pid}", "-f", "raw", "-r", "100",
                               "-d", str(int(seconds) - 2), "-p", str(pid)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for pid in pids["workers"]] if profile else []
    time.sleep(seconds)
    for spy in spies:
        spy.wait(60)
    after = {k: sum(map(cpu_seconds, v)) for k, v in pids.items()}
    later = commandstats(nodes)
    used = {name: count - calls.get(name, 0) for name, count in later.items()}
    top = sorted(((n, c) for n, c in used.items() if c), key=lambda nc: -nc[1])[:4]
    return {**{k: (after[k] - before[k]) / seconds for k in pids},
            "redis_commands": sum(used.values()) / seconds,
            "top": ", ".join(f"{n} {c / seconds:,.0f}/s" for n, c in top)}


def cache_bytes(url: str, count: int, wide: int) -> tuple[float, float]:
    """Bytes a worker's subscriber cache holds per cached subscription, with
    as many topics of 10 cached as it keeps (``cache_size``, 10,000) or
    exist; and MiB for the wide topic. Measured in this process with
    tracemalloc, on the worker's own cache class: the cache is bounded by
    topics, so its size does not grow with the subscriptions that exist."""
    import tracemalloc

    registry = Registry(redisconn.connect(url), Keys())
    topics = [f"idle.{n:06d}" for n in range(min(count // WIDTH, Config().cache_size))]
    tracemalloc.start()
    cache = SubscriberCache(registry, Config().cache_size)
    start = tracemalloc.get_traced_memory()[0]
    for at in range(0, len(topics), 500):
        cache.recipients_of(topics[at:at + 500])
    per = (tracemalloc.get_traced_memory()[0] - start) / max(1, len(topics) * WIDTH)
    start = tracemalloc.get_traced_memory()[0]
    if wide:
        cache.recipients("wide")
    wide_mib = (tracemalloc.get_traced_memory()[0] - start) / 2**20
    tracemalloc.stop()
    return per, wide_mib


@contextlib.contextmanager
def trickle(gm: servers.Managed, per_second: int = 10):
    """Fanouts to a topic of 10, ``per_second``, one after another, while
    the block runs: traffic elsewhere while the wide topic's queues hold
    copies (each warden round then has something to look at)."""
    stop = threading.Event()

    def send() -> None:
        client = gearman.Client([(gm.host, gm.port)])
        try:
            n = 0
            while not stop.wait(1 / per_second):
                body = {"topic": "idle.000004", "payload": f"t{n}", "background": True}
                client.call("fanout", json.dumps(body).encode(), 60)
                n += 1
        finally:
            client.close()

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(60)


def commandstats(nodes: list[servers.Managed]) -> dict[str, int]:
    """Calls per command, summed over ``nodes``."""
    total: dict[str, int] = {}
    for node in nodes:
        for name, entry in redis.Redis.from_url(node.details["url"]).info("commandstats").items():
            name = name.removeprefix("cmdstat_")
            total[name] = total.get(name, 0) + entry["calls"]
    return total


def used_memory(nodes: list[servers.Managed]) -> int:
    return sum(redis.Redis.from_url(n.details["url"]).info("memory")["used_memory"]
               for n in nodes)


def status_cost(gm: servers.Managed, reads: int = 5) -> tuple[int, float]:
    """(functions gearmand knows, ms to read and parse its ``status``): what
    every warden round pays once per gearmand."""
    start = time.perf_counter()
    for _ in range(reads):
        rows = gearman.status_rows(gm.host, gm.port, timeout=60)
    return len(rows), (time.perf_counter() - start) / reads * 1000


def status_at(functions: int) -> None:
    """What one ``status`` read costs once gearmand knows ``functions``
    queues (each given one job): what a warden round pays at that count."""
    gm = servers.start_gearmand()
    try:
        client = gearman.Client([(gm.host, gm.port)])
        started = time.monotonic()
        for at in range(0, functions, 10_000):
            client.submit_background([gearman.Copy(f"q{n:07d}", f"u{n}", b"x")
                                      for n in range(at, min(at + 10_000, functions))])
        client.close()
        made = time.monotonic() - started
        known, took = status_cost(gm, reads=3)
        print(f"  gearmand status with {known:,} functions: {took:,.0f} ms a read "
              f"(the functions made in {made:.1f} s)", flush=True)
    finally:
        gm.stop()


def settle(pool: subprocess.Popen, most: float = 0.1, within: float = 300.0) -> None:
    """Wait until the pool's processes use under ``most`` of a core over 2 s."""
    pids = [pool.pid, *children(pool.pid)]
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        before = sum(map(cpu_seconds, pids))
        time.sleep(2)
        if (sum(map(cpu_seconds, pids)) - before) / 2 < most:
            return
    print(f"  (the pool did not settle within {within:.0f} s)", flush=True)


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return ordered[len(ordered) // 2] * 1000, ordered[int(len(ordered) * 0.99) - 1] * 1000


def timed_calls(client: gearman.Client, function: str, bodies: list[dict]) -> tuple[float, float]:
    """p50 and p99 (ms) of one foreground call per body, one after another."""
    samples = []
    for body in bodies:
        start = time.perf_counter()
        outcome = client.call(function, json.dumps(body).encode(), 60)
        samples.append(time.perf_counter() - start)
        if not outcome.ok:
            raise SystemExit(f"{function} failed: {outcome.reason}")
    return percentiles(samples)


def per_call(gm: servers.Managed, wide: int) -> dict:
    """The per-call figures (see the module's doc)."""
    client = gearman.Client([(gm.host, gm.port)])
    try:
        subs = [{"topic": "idle.000001", "client_id": f"probe{i}"} for i in range(CALLS)]
        found = {"subscribe": timed_calls(client, "subscribe_fanout", subs),
                 "unsubscribe": timed_calls(client, "unsubscribe_fanout", subs),
                 "presence10": timed_calls(client, "topic_presence", [
                     {"topic": "idle.000002", "limit": 1000}] * CALLS)}
        if wide:
            found["presence_wide"] = timed_calls(client, "topic_presence", [
                {"topic": "wide", "limit": 1000}] * CALLS)
    finally:
        client.close()
    found["fanout10"] = gearhorn_rate(gm, "idle.000003", 10_000, WIDTH)
    if wide:
        found["fanout_wide"] = gearhorn_rate(gm, "wide", 3, wide)
    return found


def show(count: int, r: dict) -> None:
    print(f"  {count:>9,} subscriptions idle: workers {r['workers']:.3f} cores, "
          f"gearmand {r['gearmand']:.3f}, redis {r['redis']:.3f}, "
          f"{r['redis_commands']:,.0f} Redis commands/s ({r['top']})", flush=True)
    after = r["after"]
    print(f"  {count:>9,} subscriptions idle after the fanouts: workers {after['workers']:.3f} "
          f"cores, gearmand {after['gearmand']:.3f}, redis {after['redis']:.3f}", flush=True)
    busy = r["trickle"]
    print(f"  {count:>9,} subscriptions, 10 fanouts/s to a topic of 10 after the fanouts: "
          f"workers {busy['workers']:.3f} cores, redis {busy['redis']:.3f}, "
          f"{busy['redis_commands']:,.0f} Redis commands/s ({busy['top']})", flush=True)
    line = "  ".join(f"{name} p50 {r[name][0]:.2f} p99 {r[name][1]:.2f} ms"
                     for name in PER_CALL if name in r)
    print(f"  {count:>9,} subscriptions, calls: {line}", flush=True)
    rates = "  ".join(f"{name} {r[name]:,.0f} copies/s" for name in ("fanout10", "fanout_wide")
                      if name in r)
    print(f"  {count:>9,} subscriptions, fanouts: {rates}; Redis {r['redis_mib']:.1f} MiB, "
          f"{r['bytes_per_subscription']:.0f} bytes per subscription; gearmand status "
          f"({r['functions']:,} functions) {r['status_ms']:.1f} ms a read", flush=True)
    print(f"  {count:>9,} subscriptions, a worker's subscriber cache: {r['cache_bytes']:.0f} "
          f"bytes per cached subscription, the wide topic {r['cache_wide_mib']:.1f} MiB",
          flush=True)


def chart(results: dict[int, dict], path: str) -> None:
    """Each cost against the subscription count, one panel per kind."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = sorted(results)
    rows = [results[c] for c in counts]
    fig, axes = plt.subplots(2, 2, figsize=(9, 6), dpi=100)
    panels = [
        ("idle CPU (cores)", [("workers", [r["workers"] for r in rows]),
                              ("workers, after the fanouts", [r["after"]["workers"]
                                                              for r in rows]),
                              ("workers, 10 fanouts/s after them",
                               [r["trickle"]["workers"] for r in rows]),
                              ("Redis", [r["redis"] for r in rows]),
                              ("gearmand", [r["gearmand"] for r in rows])]),
        ("p99 of a call (ms)", [(name, [r[name][1] for r in rows]) for name in
                                ("subscribe", "unsubscribe", "presence10", "presence_wide")
                                if name in rows[0]]),
        ("fanout (copies/s)", [(name, [r[name] for r in rows]) for name in
                               ("fanout10", "fanout_wide") if name in rows[0]]),
        ("bytes per subscription", [("Redis, every key", [r["bytes_per_subscription"]
                                                          for r in rows]),
                                    ("a worker's cache, per cached one",
                                     [r["cache_bytes"] for r in rows])]),
    ]
    for ax, (title, series) in zip(axes.flat, panels, strict=True):
        for label, values in series:
            ax.plot(counts, values, marker="o", label=label)
        ax.set_xscale("log")
        ax.set_ylim(bottom=0)
        ax.set_title(title)
        ax.set_xlabel("subscriptions (topics of 10)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


@contextlib.contextmanager
def deployment(cluster: bool):
    """A fresh Redis (or 3-master Cluster) and gearmand: (nodes, url, gearmand)."""
    made = redisclusters.start_redis_cluster(masters=3) if cluster else servers.start_redis()
    gm = servers.start_gearmand()
    try:
        if cluster:
            yield made.nodes, made.url, gm
        else:
            yield [made], made.details["url"], gm
    finally:
        gm.stop()
        made.stop()


def in_turns(counts: list[int], wide: int, turns: int, cluster: bool) -> None:
    """The per-call figures of every count, in alternating turns, and the
    medians' ratios against the smallest count."""
    with contextlib.ExitStack() as stack:
        gearmands, pools = {}, []
        for count in counts:
            _, url, gm = stack.enter_context(deployment(cluster))
            subscribe_all(url, count, wide)
            pools.append(stack.enter_context(settled_pool(url, gm)))
            gearmands[count] = gm
            print(f"  {count:>9,} subscriptions ready", flush=True)
        taken: dict[int, list[dict]] = {count: [] for count in counts}
        for turn in range(turns):
            for count in counts if turn % 2 == 0 else counts[::-1]:
                # Every pool done with the last turn's after-work (the wide
                # topic's 100,000 queues judged), the one measured included.
                for pool in pools:
                    settle(pool)
                r = per_call(gearmands[count], wide)
                taken[count].append(r)
                print(f"  turn {turn + 1}, {count:>9,}: " + "  ".join(
                    f"{name} p99 {r[name][1]:.2f} ms" for name in PER_CALL if name in r)
                    + f"  fanout x{WIDTH} {r['fanout10']:,.0f}"
                    + (f"  wide {r['fanout_wide']:,.0f} copies/s" if wide else ""), flush=True)
    low = min(counts)
    for count in counts:
        rows = taken[count]
        line = "  ".join(f"{name} p99 {median([r[name][1] for r in rows]):.2f} ms"
                         for name in PER_CALL if name in rows[0])
        rates = {name: median([r[name] for r in rows]) for name in ("fanout10", "fanout_wide")
                 if name in rows[0]}
        print(f"  median of {turns}, {count:>9,}: {line}  " + "  ".join(
            f"{name} {rate:,.0f} copies/s" for name, rate in rates.items()), flush=True)
        if count != low:
            base = {name: median([r[name] for r in taken[low]]) for name in rates}
            print(f"  at {count:,} / at {low:,}: " + "  ".join(
                f"{name} {rate / base[name]:.2f}x" for name, rate in rates.items()), flush=True)


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


PER_CALL = ("subscribe", "unsubscribe", "presence10", "presence_wide")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[1000, 100_000])
    parser.add_argument("--wide", type=int, default=100_000,
                        help="subscribers of the wide topic (0: none)")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--cluster", action="store_true",
                        help="a 3-master Redis Cluster instead of one Redis")
    parser.add_argument("--profile", default="", help="py-spy each worker process to FILE.<pid>")
    parser.add_argument("--chart", default="", help="draw each cost by count to this PNG")
    parser.add_argument("--status-at", type=int, nargs="*", default=[], metavar="FUNCTIONS",
                        help="only: gearmand's status read with that many functions known")
    parser.add_argument("--turns", type=int, default=0,
                        help="only the per-call figures, every count up at once, in turns")
    args = parser.parse_args()
    if args.turns:
        in_turns(sorted(args.counts), args.wide, args.turns, args.cluster)
        return
    if args.status_at:
        for functions in args.status_at:
            status_at(functions)
        return
    print(f"gearhorn by subscription count: 2 worker processes, every default on, topics of "
          f"{WIDTH} and one of {args.wide:,}; {args.seconds:.0f} s idle; "
          f"{'a 3-master Redis Cluster' if args.cluster else 'one Redis'}", flush=True)
    results = {}
    for count in args.counts:
        with deployment(args.cluster) as (nodes, url, gm):
            empty = used_memory(nodes)
            started = time.monotonic()
            subscribe_all(url, count, args.wide)
            made = count + args.wide
            used = used_memory(nodes) - empty
            print(f"  {count:>9,} subscriptions (and {args.wide:,} wide) made in "
                  f"{time.monotonic() - started:5.1f} s", flush=True)
            with settled_pool(url, gm) as pool:
                r = idle_cpu(nodes, pool, gm, args.seconds,
                             f"{args.profile}.{count}" if args.profile else "")
                r.update(per_call(gm, args.wide))
                r["functions"], r["status_ms"] = status_cost(gm)
                # Idle again, gearmand now knowing every queue that got a
                # copy and the wide topic's holding them (nobody reads),
                # once the fanouts' own after-work (the ledger's and the
                # tallies' writes, the first judgement of every queue) is done.
                settle(pool)
                r["after"] = idle_cpu(nodes, pool, gm, args.seconds,
                                      f"{args.profile}.after.{count}" if args.profile else "")
                with trickle(gm):
                    r["trickle"] = idle_cpu(
                        nodes, pool, gm, args.seconds,
                        f"{args.profile}.trickle.{count}" if args.profile else "")
            r["redis_mib"], r["bytes_per_subscription"] = used / 2**20, used / made
            r["cache_bytes"], r["cache_wide_mib"] = cache_bytes(url, count, args.wide)
            results[count] = r
            show(count, r)
    low = min(results)
    for count, r in results.items():
        if count == low:
            continue
        base = results[low]
        print(f"  at {count:,} / at {low:,}: idle CPU of the workers "
              f"{r['workers'] / max(base['workers'], 0.001):.1f}x, subscribe p99 "
              f"{r['subscribe'][1] / base['subscribe'][1]:.2f}x, presence p99 "
              f"{r['presence10'][1] / base['presence10'][1]:.2f}x, fanout x{WIDTH} "
              f"{r['fanout10'] / base['fanout10']:.2f}x", flush=True)
    if args.chart:
        chart(results, args.chart)
        print(f"  chart: {args.chart}")


if __name__ == "__main__":
    main()
