"""Delayed delivery: how late do 10,000 messages due over 10 seconds arrive?

    python bench/delayed.py              # 10,000 messages over 10 s
    python bench/delayed.py --count 2000 --spread 4   # a smoke run

Starts its own redis-server and gearmand on free loopback ports (they stop
with this process) and a ``gearhorn worker`` pool of two processes. One
subscriber; every message is a ``fanout`` with its own ``deliver_at``,
spread evenly over ``--spread`` seconds that start once all are scheduled.
A consumer polls the subscriber's queue (GRAB_JOB every 10 ms when empty)
and notes each copy's lateness: arrival minus ``deliver_at``.

The peer, in the same run: gearmand's own epoch jobs (SUBMIT_JOB_EPOCH,
whole seconds, so ``deliver_at`` is rounded up), consumed by the same
polling consumer. A worker that sleeps (PRE_SLEEP, as ``gearman -w`` and
gear.Worker do) never receives epoch jobs on time at all: gearmand does not
wake it when one falls due (docs/delayed.rst), so the peer has to poll.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

import redis

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from fanout import start_pool  # noqa: E402  (bench/fanout.py)

from gearhorn import gearman  # noqa: E402
from gearhorn.rules.messages import Subscription  # noqa: E402
from gearhorn.store.keys import Keys  # noqa: E402
from gearhorn.store.registry import Registry  # noqa: E402
from gearhorn.supervision import servers

SUBMIT_JOB_EPOCH = 36


def consume(gm: servers.Managed, function: str, count: int, timeout: float) -> list[float]:
    """Lateness (s) of ``count`` jobs whose payload is their due time."""
    worker = gearman.WorkerConnection(gm.host, gm.port, [function], "bench-consumer")
    worker.open()
    late: list[float] = []
    deadline = time.monotonic() + timeout
    while len(late) < count:
        jobs = worker.grab(64)
        now = time.time()
        for job in jobs:
            late.append(now - float(job.data))
            worker.complete(job.handle)
        if not jobs:
            if time.monotonic() > deadline:
                raise SystemExit(f"only {len(late)} of {count} arrived")
            time.sleep(0.01)
    worker.close()
    return late


def schedule_gearhorn(gm: servers.Managed, topic: str, dues: list[float]) -> None:
    jobs = [gearman.Copy("fanout", f"bench-delay:{i}", json.dumps({
        "topic": topic, "payload": f"{due:.6f}", "deliver_at": due}).encode())
        for i, due in enumerate(dues)]
    client = gearman.Client([(gm.host, gm.port)])
    outcomes = client.submit_foreground(jobs, timeout=120)
    client.close()
    bad = [o for o in outcomes if not o.ok or not json.loads(o.data).get("scheduled")]
    if bad:
        raise SystemExit(f"scheduling failed: {bad[0]}")


def schedule_epoch(gm: servers.Managed, function: str, dues: list[float]) -> None:
    conn = gearman.Connection(gm.host, gm.port)
    wire = b"".join(gearman.encode(SUBMIT_JOB_EPOCH, function.encode(), f"e{i}".encode(),
                                   str(math.ceil(due)).encode(), f"{due:.6f}".encode())
                    for i, due in enumerate(dues))
    conn.send(wire)
    for _ in dues:
        packet = conn.read()
        if packet.type != gearman.P.JOB_CREATED:
            raise SystemExit(f"gearmand refused an epoch job: {packet}")
    conn.close()


def figures(late: list[float]) -> str:
    ordered = sorted(late)

    def pct(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] * 1000

    early = sum(1 for x in late if x < 0)
    return (f"p50 {pct(50):7.1f} ms  p99 {pct(99):7.1f} ms  max {ordered[-1] * 1000:7.1f} ms"
            f"  mean {statistics.fmean(late) * 1000:7.1f} ms  early {early}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--spread", type=float, default=10.0, help="seconds")
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        rd = servers.start_redis(data_dir=os.path.join(tmp, "redis"))
        gm = servers.start_gearmand(data_dir=os.path.join(tmp, "gearmand"))
        pool = start_pool(gm, rd.details["url"], args.processes)
        try:
            Registry(redis.Redis.from_url(rd.details["url"]), Keys()).subscribe(
                Subscription("bench", "c"))
            # Scheduling 10,000 takes a few seconds: the window starts after it.
            start = time.time() + 3 + args.count / 2000
            dues = [start + args.spread * i / args.count for i in range(args.count)]
            t0 = time.perf_counter()
            schedule_gearhorn(gm, "bench", dues)
            took = time.perf_counter() - t0
            if time.time() > start:
                raise SystemExit("scheduling took longer than planned; use a smaller --count")
            gearhorn_late = consume(gm, "bench_c", args.count,
                                    start + args.spread + 60 - time.time())

            start = time.time() + 2
            dues = [start + args.spread * i / args.count for i in range(args.count)]
            schedule_epoch(gm, "bench_epoch", dues)
            epoch_late = consume(gm, "bench_epoch", args.count,
                                 start + args.spread + 60 - time.time())
        finally:
            pool.terminate()
            pool.wait()
            gm.stop()
            rd.stop()

    print(f"{args.count} messages due over {args.spread:g} s, {args.processes} worker processes"
          f" (scheduled in {took:.2f} s, {args.count / took:.0f}/s)")
    print(f"gearhorn (Redis shards, pool releases)   {figures(gearhorn_late)}")
    print(f"gearmand epoch jobs (polling consumer)   {figures(epoch_late)}")


if __name__ == "__main__":
    main()
