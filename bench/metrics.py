"""What metrics cost: /metrics scrape time by topic count, and fanout throughput on vs off.

    python bench/metrics.py            # 1,000 and 100,000 topics; on/off rounds (~4 min)
    python bench/metrics.py --quick    # smaller counts, for a smoke run

Scrape: a Redis and a gearmand on free loopback ports hold N topics with a
subscriber, copies counted for each, and one queued job in each topic's
queue (so gearmand's status lists N functions). ``gearhorn web`` runs with
the default ``metrics_top`` (100); GET /metrics is timed 20 times (scrapes
within a second share the console's sample), then the web process's CPU
over 30 s of nobody scraping and no console open (the console then
samples every 10 s; every second while one is open, or less often when a
sample is slow),
and a fresh sample is timed on its own. The peer is the irreducible part:
gearmand's own ``status`` text over the same queues, fetched, not parsed.

Throughput: background fanouts to 1 and 10 subscribers through a pool of 2
``gearhorn worker`` processes with metrics on (the default: counts written
every 0.1 s), write-through (``metrics_write_through``) and off, in rotated
rounds (the median of each is printed), gearmand without persistence so
that the metrics' cost weighs the most it can.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request

import redis

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from fanout import gearhorn_rate, start_pool, subscribe_many  # noqa: E402

from gearhorn import gearman  # noqa: E402
from gearhorn.runtime.children import die_with_parent
from gearhorn.store.keys import Keys  # noqa: E402
from gearhorn.store.registry import Registry  # noqa: E402
from gearhorn.supervision import servers
from gearhorn.web.snapshot import Collector  # noqa: E402


def fill(client: redis.Redis, gm: servers.Managed, topics: int) -> None:
    """``topics`` topics, one subscriber and some copies each, one job queued each."""
    keys = Keys()
    for start in range(0, topics, 10_000):
        names = [f"topic{i}" for i in range(start, min(topics, start + 10_000))]
        pipe = client.pipeline(transaction=False)
        pipe.sadd(keys.topics, *names)
        for i, name in enumerate(names):
            pipe.sadd(keys.topic(name), "c0")
            pipe.zadd(keys.stats("copies"), {name: start + i})
            pipe.zadd(keys.stats("fanouts"), {name: start + i})
        pipe.execute()
        jobs = gearman.Client([(gm.host, gm.port)])
        jobs.submit_background([gearman.Copy(f"{n}_c0", f"u-{n}", b"x") for n in names])
        jobs.close()


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fp:
        fields = fp.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(call, rounds: int = 20) -> tuple[float, float]:
    """(median, max) milliseconds of ``call``."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), max(times)


def bench_scrape(topics: int) -> None:
    red = servers.start_redis()
    gm = servers.start_gearmand()
    port = servers.free_port()
    web = subprocess.Popen([sys.executable, "-m", "gearhorn", "web", "--port", str(port),
                            "--redis-url", red.details["url"], "--gearman", gm.address,
                            "--log-level", "WARNING"], preexec_fn=die_with_parent)
    try:
        fill(redis.Redis.from_url(red.details["url"]), gm, topics)
        deadline = time.monotonic() + 60
        while not servers.is_listening("127.0.0.1", port):
            if time.monotonic() > deadline:
                raise SystemExit("gearhorn web did not start")
            time.sleep(0.1)
        url = f"http://127.0.0.1:{port}/metrics"
        size = len(urllib.request.urlopen(url, timeout=60).read())
        scrape = timed(lambda: urllib.request.urlopen(url, timeout=60).read())
        cpu_before, wall_before = cpu_seconds(web.pid), time.monotonic()
        time.sleep(30)  # the console's sampling alone, nobody scraping or watching
        busy = (cpu_seconds(web.pid) - cpu_before) / (time.monotonic() - wall_before)
        collector = Collector(Registry(redis.Redis.from_url(red.details["url"]), Keys()),
                              [(gm.host, gm.port)])
        sample = timed(collector.collect, rounds=5)
        status = timed(lambda: gearman.admin(gm.host, gm.port, "status", timeout=60))
        print(f"{topics:>8,} topics  /metrics {scrape[0]:7.1f} ms median, {scrape[1]:7.1f} max, "
              f"{size / 1024:5.1f} KiB; a fresh sample {sample[0]:6.1f} ms; gearhorn web "
              f"sampling {busy:4.0%} of a core | peer: gearmand's status text "
              f"{status[0]:6.1f} ms")
    finally:
        web.send_signal(signal.SIGTERM)
        web.wait(10)
        gm.stop()
        red.stop()


MODES = {  # name -> settings of the worker pool
    "on": {"GEARHORN_METRICS_ENABLED": "true", "GEARHORN_METRICS_WRITE_THROUGH": "false"},
    "write-through": {"GEARHORN_METRICS_ENABLED": "true",
                      "GEARHORN_METRICS_WRITE_THROUGH": "true"},
    "off": {"GEARHORN_METRICS_ENABLED": "false"},
}


def bench_cost(rounds: int, fanouts: int) -> None:
    """Each round runs every mode, in a rotated order (the order of runs on a
    gearmand that keeps every copy weighs about 15% otherwise)."""
    rates: dict[tuple[str, int], list[float]] = {}
    red = servers.start_redis()
    gm = servers.start_gearmand()
    url = red.details["url"]
    registry = Registry(redis.Redis.from_url(url), Keys())
    for width in (1, 10):
        subscribe_many(registry, f"bench{width}", width)
    names = list(MODES)
    try:
        for n in range(rounds):
            for mode in names[n % 3:] + names[:n % 3]:
                os.environ.update(MODES[mode])
                pool = start_pool(gm, url, 2)
                try:
                    for width in (1, 10):
                        gearhorn_rate(gm, f"bench{width}", fanouts // 10, width)  # warm-up
                        rate = gearhorn_rate(gm, f"bench{width}", fanouts, width) / width
                        rates.setdefault((mode, width), []).append(rate)
                finally:
                    pool.send_signal(signal.SIGTERM)
                    pool.wait(30)
    finally:
        gm.stop()
        red.stop()
    for width in (1, 10):
        off = statistics.median(rates[("off", width)])
        figures = ", ".join(f"{mode} {statistics.median(rates[(mode, width)]):6.0f} "
                            f"({statistics.median(rates[(mode, width)]) / off:.2f})"
                            for mode in names)
        print(f"fanouts/s to {width:>2} subscribers (median of {rounds}; ratio to off): "
              f"{figures}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=("scrape", "cost"), help="one half of the bench")
    args = parser.parse_args()
    print(f"bench/metrics.py on {os.cpu_count()} cores")
    if args.only != "cost":
        for topics in ((1_000, 10_000) if args.quick else (1_000, 100_000)):
            bench_scrape(topics)
    if args.only != "scrape":
        bench_cost(rounds=3 if args.quick else 6, fanouts=2_000 if args.quick else 10_000)


if __name__ == "__main__":
    main()
