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

Then the same with 1 gearmand on a 3-master Redis Cluster (commands summed
over the nodes; the peer is the 1-Redis run), and the memory one
subscription takes on the cluster: 100,000 subscriptions over 10,000 topics
(``used_memory`` summed over the nodes, before and after).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

import redis

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from fanout import start_pool, subscribe_many  # noqa: E402

from gearhorn import gearman  # noqa: E402
from gearhorn.rules.messages import Subscription  # noqa: E402
from gearhorn.store import redisconn
from gearhorn.store.keys import Keys  # noqa: E402
from gearhorn.store.registry import Registry  # noqa: E402
from gearhorn.supervision import (
    redisclusters,  # noqa: E402
    servers,
)

WIDTH = 100


def commands(nodes: list[servers.Managed]) -> dict[str, int]:
    """Calls per command, summed over ``nodes``."""
    total: dict[str, int] = {}
    for node in nodes:
        stats = redis.Redis.from_url(node.details["url"]).info("commandstats")
        for name, entry in stats.items():
            total[name] = total.get(name, 0) + entry["calls"]
    return total


def start_redis(cluster: bool) -> tuple[str, list[servers.Managed], object]:
    """(url, nodes, what to stop): one Redis, or a 3-master cluster."""
    if cluster:
        started = redisclusters.start_redis_cluster(masters=3)
        return started.url, started.nodes, started
    red = servers.start_redis()
    return red.details["url"], [red], red


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


def run(gearmands: int, fanouts: int, cluster: bool = False) -> tuple[float, dict[str, int]]:
    url, nodes, red = start_redis(cluster)
    gms = [servers.start_gearmand() for _ in range(gearmands)]
    registry = Registry(redisconn.connect(url), Keys())
    subscribe_many(registry, "scale", WIDTH)
    pools = [start_pool(gm, url, 2) for gm in gms]
    try:
        for gm in gms:  # warm-up
            fan_out(gm, "scale", 0, 20)
        before = commands(nodes)
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
        after = commands(nodes)
        used = {k: after[k] - before.get(k, 0) for k in after if after[k] > before.get(k, 0)}
        return share * gearmands * WIDTH / elapsed, used
    finally:
        for pool in pools:
            pool.send_signal(signal.SIGTERM)
            pool.wait(30)
        for gm in gms:
            gm.stop()
        red.stop()


def bytes_per_subscription(subscriptions: int, topics: int = 10_000) -> float:
    """Memory of ``subscriptions`` over ``topics`` on a 3-master cluster."""
    cluster = redisclusters.start_redis_cluster(masters=3)
    try:
        registry = Registry(redisconn.connect(cluster.url), Keys())
        used = sum(redis.Redis.from_url(n.details["url"]).info("memory")["used_memory"]
                   for n in cluster.nodes)
        for n in range(subscriptions):
            registry.subscribe(Subscription(f"topic.{n % topics:05d}", f"client-{n:07d}"))
        after = sum(redis.Redis.from_url(n.details["url"]).info("memory")["used_memory"]
                    for n in cluster.nodes)
        return (after - used) / subscriptions
    finally:
        cluster.stop()


def version_checks_per_second() -> tuple[float, float]:
    """How fast one Redis node answers the cache check every fanout makes
    on the prefixes' hash slot (``prefix_members.lua``, "unchanged"), and a
    plain GET on the same node (the peer), by redis-benchmark: 50 clients,
    16 commands pipelined. That slot is the one every fanout touches."""
    red = servers.start_redis()
    try:
        client = redis.Redis.from_url(red.details["url"])
        registry = Registry(client, Keys())
        registry.subscribe(Subscription("news.*", "carol"))
        sha = registry._prefix_members.sha
        client.script_load(registry._prefix_members.script)
        version = client.get(Keys().prefix_version).decode()

        def rate(*command: str) -> float:
            out = subprocess.run([servers.find_binary("redis-benchmark"), "-h", red.host,
                                  "-p", str(red.port), "-n", "400000", "-c", "50", "-P", "16",
                                  "--csv", *command], capture_output=True, text=True,
                                 check=True).stdout
            return float(out.strip().splitlines()[-1].split(",")[1].strip('"'))
        return (rate("EVALSHA", sha, "1", Keys().prefix_version, version, version),
                rate("GET", Keys().prefix_version))
    finally:
        red.stop()


def report(label: str, rate: float, used: dict[str, int], fanouts: int) -> None:
    total = sum(used.values())
    top = ", ".join(f"{k.removeprefix('cmdstat_')} {v / fanouts:.2f}"
                    for k, v in sorted(used.items(), key=lambda kv: -kv[1])[:5])
    print(f"{label}: {rate:9,.0f} copies/s; Redis commands per fanout "
          f"{total / fanouts:.2f}, per copy {total / (fanouts * WIDTH):.4f} ({top})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    fanouts = 1_000 if args.quick else 5_000
    print(f"bench/scale.py on {os.cpu_count()} cores: 1 topic x {WIDTH} subscribers, "
          f"{fanouts:,} background fanouts")
    rates = {}
    for count in (1, 2):
        rates[count], used = run(count, fanouts)
        report(f"{count} gearmand (a pool of 2 workers each), 1 Redis", rates[count], used,
               fanouts)
    print(f"2 gearmand / 1 gearmand: {rates[2] / rates[1]:.2f}")
    clustered, used = run(1, fanouts, cluster=True)
    report("1 gearmand (a pool of 2 workers), 3-master Redis Cluster", clustered, used, fanouts)
    print(f"Redis Cluster / 1 Redis: {clustered / rates[1]:.2f}")
    checks, gets = version_checks_per_second()
    print(f"one Redis node: {checks:,.0f} prefix version checks/s (the slot every fanout "
          f"reads), {gets:,.0f} GET/s; ratio {checks / gets:.2f}")
    subscriptions = 20_000 if args.quick else 100_000
    print(f"{subscriptions:,} subscriptions over 10,000 topics on the cluster: "
          f"{bytes_per_subscription(subscriptions):.0f} bytes per subscription")


if __name__ == "__main__":
    main()
