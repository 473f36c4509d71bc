"""Scaling out over gearmand servers, and what a fanout costs Redis.

    python bench/scale.py            # about 2 minutes on 2 cores
    python bench/scale.py --quick

For 1 and then 2 gearmand (no persistence: the servers are what is
measured), each with its own pool of 2 ``gearhorn worker`` processes, and
one Redis: a topic with 100 subscribers gets background fanouts, all in
flight at once, spread evenly over the servers; the rate is copies accepted
by gearmand per second. The peer is the same run on 1 server. Redis's
``INFO commandstats`` before and after each run gives the commands per
fanout and per copy (heartbeats and ledger included: everything Redis did
meanwhile).

Not measured yet: Redis Cluster (gearhorn runs on one Redis or Sentinel
today; issue 13).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time

import redis

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from fanout import start_pool, subscribe_many  # noqa: E402

from gearhorn import gearman, servers  # noqa: E402
from gearhorn.keys import Keys  # noqa: E402
from gearhorn.registry import Registry  # noqa: E402

WIDTH = 100


def commands(client: redis.Redis) -> dict[str, int]:
    return {name: stats["calls"] for name, stats in client.info("commandstats").items()}


def fan_out(gm: servers.Managed, topic: str, first: int, count: int) -> None:
    client = gearman.Client([(gm.host, gm.port)])
    jobs = [gearman.Copy("fanout", f"scale:{topic}:{first + i}",
                         json.dumps({"topic": topic, "payload": f"m{i}",
                                     "background": True}).encode()) for i in range(count)]
    outcomes = client.submit_foreground(jobs, timeout=600)
    client.close()
    bad = [o for o in outcomes if not o.ok or json.loads(o.data)["copies"] != WIDTH]
    if bad:
        raise SystemExit(f"fanout failed: {bad[0]}")


def run(gearmands: int, fanouts: int) -> tuple[float, dict[str, int]]:
    red = servers.start_redis()
    url = red.details["url"]
    gms = [servers.start_gearmand() for _ in range(gearmands)]
    registry = Registry(redis.Redis.from_url(url), Keys())
    subscribe_many(registry, "scale", WIDTH)
    pools = [start_pool(gm, url, 2) for gm in gms]
    try:
        for gm in gms:  # warm-up
            fan_out(gm, "scale", 0, 20)
        before = commands(registry.redis)
        share = fanouts // gearmands
        threads = [threading.Thread(target=fan_out, args=(gm, "scale", 1_000_000 * (n + 1),
                                                          share))
                   for n, gm in enumerate(gms)]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - start
        after = commands(registry.redis)
        used = {k: after[k] - before.get(k, 0) for k in after if after[k] > before.get(k, 0)}
        return share * gearmands * WIDTH / elapsed, used
    finally:
        for pool in pools:
            pool.send_signal(signal.SIGTERM)
            pool.wait(30)
        for gm in gms:
            gm.stop()
        red.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    fanouts = 1_000 if args.quick else 5_000
    print(f"bench/scale.py on {os.cpu_count()} cores: 1 topic x {WIDTH} subscribers, "
          f"{fanouts:,} background fanouts")
    rates = {}
    for count in (1, 2):
        rate, used = run(count, fanouts)
        rates[count] = rate
        total = sum(used.values())
        top = ", ".join(f"{k.removeprefix('cmdstat_')} {v / fanouts:.2f}"
                        for k, v in sorted(used.items(), key=lambda kv: -kv[1])[:5])
        print(f"{count} gearmand (a pool of 2 workers each): {rate:9,.0f} copies/s; Redis "
              f"commands per fanout {total / fanouts:.2f}, per copy "
              f"{total / (fanouts * WIDTH):.4f} ({top})")
    print(f"2 gearmand / 1 gearmand: {rates[2] / rates[1]:.2f}")


if __name__ == "__main__":
    main()
