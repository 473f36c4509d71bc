"""What topic history costs: fanout throughput with it on and off, and the
Redis memory of one retained message.

    python bench/history.py            # about 3 minutes on 2 cores
    python bench/history.py --quick

Fresh servers for each mode, in turns (off, on, off, on): a pool of 2
worker processes, one gearmand (no persistence) and one Redis; background
fanouts of 100-byte payloads, all in flight at once, to 1 topic with 10
and with 100 subscribers; the figure is copies accepted by gearmand per
second, and the peer is the same run with history off. Then 100 topics
get 1,000 messages each with history_size 1,000: Redis's used_memory
before and after, per retained message.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import redis

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from fanout import start_pool, subscribe_many  # noqa: E402

from gearhorn import gearman, servers  # noqa: E402
from gearhorn.store import redisconn  # noqa: E402
from gearhorn.store.keys import Keys  # noqa: E402
from gearhorn.store.registry import Registry  # noqa: E402

PAYLOAD = "x" * 100


def rate(gm: servers.Managed, topic: str, fanouts: int, width: int) -> float:
    client = gearman.Client([(gm.host, gm.port)])
    run = os.urandom(4).hex()
    jobs = [gearman.Copy("fanout", f"h:{run}:{i}", json.dumps(
        {"topic": topic, "payload": PAYLOAD, "background": True}).encode())
        for i in range(fanouts)]
    start = time.perf_counter()
    outcomes = client.submit_foreground(jobs, timeout=600)
    elapsed = time.perf_counter() - start
    client.close()
    if any(not o.ok or json.loads(o.data)["copies"] != width for o in outcomes):
        raise SystemExit(f"fanout failed: {next(o for o in outcomes if not o.ok)}")
    return fanouts * width / elapsed


def one_mode(history_size: int, widths: tuple[int, ...], budget: int) -> dict[int, float]:
    red, gm = servers.start_redis(), servers.start_gearmand()
    url = red.details["url"]
    pool = start_pool(gm, url, 2, ledger=False, env={
        "GEARHORN_HISTORY_SIZE": str(history_size), "GEARHORN_QUEUE_MAX_LENGTH": "0",
        "GEARHORN_QUEUE_MAX_BYTES": "0"})
    registry = Registry(redisconn.connect(url), Keys())
    try:
        found = {}
        for width in widths:
            topic = f"hist{width}"
            subscribe_many(registry, topic, width)
            fanouts = max(1, budget // width)
            rate(gm, topic, max(1, fanouts // 10), width)  # warm up
            found[width] = rate(gm, topic, fanouts, width)
        return found
    finally:
        pool.terminate()
        pool.wait()
        gm.stop()
        red.stop()


def memory_per_message(messages: int = 1000, topics: int = 100) -> float:
    red, gm = servers.start_redis(), servers.start_gearmand()
    url = red.details["url"]
    pool = start_pool(gm, url, 2, ledger=False, env={"GEARHORN_HISTORY_SIZE": str(messages)})
    client = redis.Redis.from_url(url)
    try:
        before = client.info("memory")["used_memory"]
        for t in range(topics):
            rate(gm, f"mem{t}", messages, 0)
        retained = sum(client.xlen(Keys().history(f"mem{t}")) for t in range(topics))
        return (client.info("memory")["used_memory"] - before) / retained
    finally:
        pool.terminate()
        pool.wait()
        gm.stop()
        red.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    budget = 20_000 if args.quick else 100_000
    widths = (10, 100)
    runs: dict[str, list[dict[int, float]]] = {"off": [], "on": []}
    for turn in range(1 if args.quick else 2):
        for mode, size in (("off", 0), ("on", 1000)):
            runs[mode].append(one_mode(size, widths, budget))
            print(f"turn {turn + 1}, history {mode}: " + "  ".join(
                f"x{w} {r:,.0f} copies/s" for w, r in runs[mode][-1].items()), flush=True)
    for width in widths:
        ratios = [on[width] / off[width] for on, off in zip(runs["on"], runs["off"],
                                                              strict=True)]
        print(f"x{width}: history on / off = " + ", ".join(f"{r:.3f}" for r in ratios))
    print(f"Redis memory per retained {len(PAYLOAD)}-byte message: "
          f"{memory_per_message(200 if args.quick else 1000):,.0f} bytes")


if __name__ == "__main__":
    main()
