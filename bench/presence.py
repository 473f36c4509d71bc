"""What ``topic_presence`` costs as a topic grows.

    python bench/presence.py            # about 2 minutes on 2 cores
    python bench/presence.py --quick    # up to 10,000 subscribers

On a fresh Redis and gearmand (no persistence) with one worker process:
topics of 100, 10,000 and 100,000 subscribers. For each, the latency of a
``topic_presence`` call through gearmand (the count and the first page of
1,000 clients with where each is), p50 and p99 over 200 calls; the peer,
in the same run, is reading the whole set (SMEMBERS, what a naive presence
would do, and no record of each client yet). Then the time to page through
every subscriber with pages of 10,000.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from fanout import start_pool  # noqa: E402

from gearhorn import gearman  # noqa: E402
from gearhorn.rules.messages import Subscription  # noqa: E402
from gearhorn.store import redisconn  # noqa: E402
from gearhorn.store.keys import Keys  # noqa: E402
from gearhorn.store.registry import Registry  # noqa: E402
from gearhorn.supervision import servers

CALLS = 200


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1000, ordered[int(len(ordered) * 0.99) - 1] * 1000


def presence_call(client: gearman.Client, topic: str, limit: int, cursor: int = 0) -> dict:
    outcome = client.call("topic_presence", json.dumps(
        {"topic": topic, "limit": limit, "cursor": cursor}).encode(), 60)
    if not outcome.ok:
        raise SystemExit(f"topic_presence failed: {outcome.reason}")
    return json.loads(outcome.data)


def measure(client: gearman.Client, registry: Registry, topic: str, width: int) -> dict:
    samples, whole = [], []
    for _ in range(CALLS):
        start = time.perf_counter()
        found = presence_call(client, topic, 1000)
        samples.append(time.perf_counter() - start)
        assert found["subscribers"] == width, found["subscribers"]
        start = time.perf_counter()
        members = registry.redis.smembers(registry.keys.topic(topic))
        whole.append(time.perf_counter() - start)
        assert len(members) == width
    start, seen, cursor = time.perf_counter(), 0, 0
    while True:
        page = presence_call(client, topic, 10_000, cursor)
        seen += len(page["clients"])
        cursor = page["cursor"]
        if not cursor:
            break
    every = time.perf_counter() - start
    assert seen == width, (seen, width)
    p50, p99 = percentiles(samples)
    w50, w99 = percentiles(whole)
    return {"width": width, "p50": p50, "p99": p99, "smembers_p50": w50,
            "smembers_p99": w99, "all_pages_s": every}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    widths = (100, 10_000) if args.quick else (100, 10_000, 100_000)
    red = servers.start_redis()
    gm = servers.start_gearmand()
    url = red.details["url"]
    registry = Registry(redisconn.connect(url), Keys())
    # Every subscription before the pool starts: its workers would otherwise
    # still be reading 110,000 matchmaking announcements while measured.
    for width in widths:
        for i in range(width):
            registry.subscribe(Subscription(f"presence{width}", f"c{i}",
                                            bridge="b1" if i % 2 else ""))
    # The warden off: it reads every subscription each second, and with
    # 110,000 of them its rounds, not presence, would be what is measured
    # (docs/benchmarks.rst says how much).
    pool = start_pool(gm, url, 1, ledger=False, env={"GEARHORN_RETENTION_INTERVAL": "0"})
    client = gearman.Client([(gm.host, gm.port)])
    try:
        for width in widths:
            r = measure(client, registry, f"presence{width}", width)
            print(f"{r['width']:>7,} subscribers: topic_presence p50 {r['p50']:6.2f} ms "
                  f"p99 {r['p99']:6.2f} ms | peer SMEMBERS p50 {r['smembers_p50']:6.2f} ms "
                  f"p99 {r['smembers_p99']:6.2f} ms | every page {r['all_pages_s']:5.2f} s",
                  flush=True)
    finally:
        client.close()
        pool.terminate()
        pool.wait()
        gm.stop()
        red.stop()


if __name__ == "__main__":
    main()
