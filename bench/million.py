"""What an idle gearhorn costs as its subscriptions grow (issue 49).

    python bench/million.py                       # 1,000 and 100,000
    python bench/million.py --counts 1000 1000000 # a million: ~10 minutes

For each count: a fresh Redis and gearmand, a pool of 2 ``gearhorn
worker`` processes with every default on (warden, janitor, metrics,
presence), and that many subscriptions (topics of 10). Then nothing is published for
``--seconds`` while the CPU time of the workers, gearmand and Redis is
read from /proc, and the warden's round counted in Redis's commands. The
peer is the smallest count of the same run: idle CPU is compared against
it (the target is within 2x at the largest).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import redis

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from gearhorn import servers  # noqa: E402
from gearhorn.messages import Subscription  # noqa: E402
from gearhorn.store import redisconn  # noqa: E402
from gearhorn.store.keys import Keys  # noqa: E402
from gearhorn.store.registry import Registry  # noqa: E402

WIDTH = 10  # subscribers per topic
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and its threads, in seconds."""
    with open(f"/proc/{pid}/stat") as fp:
        fields = fp.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def subscribe_all(url: str, count: int) -> None:
    """``count`` subscriptions over ``count / WIDTH`` topics, 8 at a time."""
    registry = Registry(redisconn.connect(url), Keys())

    def some(start: int) -> None:
        for n in range(start, min(start + 1000, count)):
            registry.subscribe(Subscription(f"idle.{n // WIDTH:06d}", f"c{n % WIDTH}"))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(some, range(0, count, 1000)))


def idle_cpu(url: str, gm: servers.Managed, red: servers.Managed, seconds: float,
             profile: str = "") -> dict:
    """CPU per second of each part while idle; ``profile``: py-spy each worker to it."""
    pool = subprocess.Popen(
        [sys.executable, "-m", "gearhorn", "worker", "--processes", "2", "--gearman",
         gm.address, "--redis-url", url, "--log-level", "WARNING"],
        env={**os.environ, "GEARHORN_PERSISTENCE": "none"}, preexec_fn=servers.die_with_parent)
    try:
        registry = Registry(redisconn.connect(url), Keys())
        deadline = time.monotonic() + 120
        while len(registry.live_workers()) < 2:
            if time.monotonic() > deadline or pool.poll() is not None:
                raise SystemExit("worker pool did not start")
            time.sleep(0.1)
        # The warden's one scan of a Redis it has not seen (warden.py _scan)
        # is start-up, not idling: measured after it.
        client, keys = redis.Redis.from_url(url), Keys()
        while not client.exists(keys.warden_scanned):
            if time.monotonic() > deadline + 600:
                raise SystemExit("the warden never finished its first scan")
            time.sleep(0.2)
        time.sleep(3)
        pids = {"workers": [pool.pid, *children(pool.pid)], "gearmand": [gm.process.pid],
                "redis": [red.process.pid]}
        calls = redis.Redis.from_url(url).info("commandstats")
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
        later = redis.Redis.from_url(url).info("commandstats")
        used = {name.removeprefix("cmdstat_"): e["calls"] - calls.get(name, {"calls": 0})["calls"]
                for name, e in later.items()}
        top = sorted(((n, c) for n, c in used.items() if c), key=lambda nc: -nc[1])[:4]
        return {**{k: (after[k] - before[k]) / seconds for k in pids},
                "redis_commands": sum(used.values()) / seconds,
                "top": ", ".join(f"{n} {c / seconds:,.0f}/s" for n, c in top)}
    finally:
        pool.send_signal(signal.SIGTERM)
        pool.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[1000, 100_000])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--profile", default="", help="py-spy each worker process to FILE.<pid>")
    args = parser.parse_args()
    print(f"idle gearhorn: 2 worker processes, every default on, topics of {WIDTH}, "
          f"{args.seconds:.0f} s idle", flush=True)
    results = {}
    for count in args.counts:
        red = servers.start_redis()
        gm = servers.start_gearmand()
        try:
            url = red.details["url"]
            started = time.monotonic()
            subscribe_all(url, count)
            print(f"  {count:>9,} subscriptions made in {time.monotonic() - started:5.1f} s",
                  flush=True)
            r = results[count] = idle_cpu(url, gm, red, args.seconds,
                                             f"{args.profile}.{count}" if args.profile else "")
            print(f"  {count:>9,} subscriptions idle: workers {r['workers']:.3f} cores, "
                  f"gearmand {r['gearmand']:.3f}, redis {r['redis']:.3f}, "
                  f"{r['redis_commands']:,.0f} Redis commands/s ({r['top']})", flush=True)
        finally:
            gm.stop()
            red.stop()
    low = min(results)
    for count, r in results.items():
        if count != low:
            base = max(results[low]["workers"], 0.001)
            print(f"  workers' idle CPU at {count:,} / at {low:,}: {r['workers'] / base:.1f}x")


if __name__ == "__main__":
    main()
