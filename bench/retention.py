"""Bounded queues: what the limits cost, and what a dead subscriber costs.

    python bench/retention.py             # both parts (about 15 minutes on 2 cores)
    python bench/retention.py --quick     # 2-minute memory run, fewer fanouts
    python bench/retention.py --part cost      # throughput only
    python bench/retention.py --part memory    # memory over time only

Starts its own Redis, gearmand and ``gearhorn worker`` pools on free
loopback ports (they stop with this process).

1. **Cost.** Copies/s of background fanouts to 10 and 100 subscribers,
   bounded queues on (the default: a tally entry per queue and group, the
   warden's rounds) against off (``retention_interval = 0``), in alternating
   turns on fresh servers. Target: on costs at most 10%.
2. **Memory.** gearmand and the registry's Redis holding the copies (held
   copies, as ``gearhorn up`` runs them), sampled every few seconds while a producer fans out
   1 KiB payloads at half the measured rate to 20 subscribers: 10 never
   read, 10 are read as fast as they come. Target: both flat once the dead
   queues reach their cap, and the live subscribers' rate within 10% of a
   run without the dead ones. Writes a PNG chart (``--chart``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import tempfile
import threading
import time

import redis

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from durable import rss_mib  # noqa: E402
from fanout import gearhorn_rate, start_pool, subscribe_many  # noqa: E402

from gearhorn import gearman  # noqa: E402
from gearhorn.store.keys import Keys  # noqa: E402
from gearhorn.store.registry import Registry  # noqa: E402
from gearhorn.supervision import servers

PAYLOAD = "x" * 1024


class Stack:
    """Registry Redis, gearmand (memory only), a pool; ``durable``: the
    copies held in that Redis, with AOF (as gearhorn up runs it)."""

    def __init__(self, processes: int, env: dict[str, str], durable: bool = False) -> None:
        self.tmp = tempfile.mkdtemp(prefix="bench-retention-")
        self.redis = (servers.start_redis(data_dir=os.path.join(self.tmp, "redis"),
                                          appendonly=True) if durable else servers.start_redis())
        if durable:
            env = {**env, "GEARHORN_COPIES": "held"}
        self.gearmand = servers.start_gearmand(data_dir=os.path.join(self.tmp, "gearmand"))
        self.url = self.redis.details["url"]
        self.registry = Registry(redis.Redis.from_url(self.url), Keys())
        self.pool = start_pool(self.gearmand, self.url, processes, env=env)

    def close(self) -> None:
        self.pool.send_signal(signal.SIGTERM)
        self.pool.wait(30)
        for server in (self.gearmand, self.redis):
            server.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)


OFF = {"GEARHORN_RETENTION_INTERVAL": "0"}
ON: dict[str, str] = {}  # the defaults


def bench_cost(processes: int, copies: int, turns: int) -> dict[int, list[float]]:
    """on/off ratios per width, one per turn (each turn: off then on, or on
    then off, on fresh servers), ``copies`` a measurement."""
    ratios: dict[int, list[float]] = {}
    for width in (10, 100):
        count = copies // width
        for turn in range(turns):
            rates = {}
            order = ("off", "on") if turn % 2 == 0 else ("on", "off")
            for mode in order:
                stack = Stack(processes, OFF if mode == "off" else ON)
                try:
                    subscribe_many(stack.registry, "bench", width)
                    gearhorn_rate(stack.gearmand, "bench", max(1, count // 10), width)  # warm-up
                    rates[mode] = gearhorn_rate(stack.gearmand, "bench", count, width)
                finally:
                    stack.close()
            ratios.setdefault(width, []).append(rates["on"] / rates["off"])
            print(f"x{width} turn {turn + 1}: off {rates['off']:,.0f} copies/s, "
                  f"on {rates['on']:,.0f} copies/s, on/off {rates['on'] / rates['off']:.3f}",
                  flush=True)
    return ratios


class Producer(threading.Thread):
    """Fans out ``rate`` copies/s (paced per 0.1 s) to ``topic``."""

    def __init__(self, gm: servers.Managed, topic: str, width: int, rate: float) -> None:
        super().__init__(daemon=True)
        self.client = gearman.Client([(gm.host, gm.port)])
        self.topic, self.width, self.rate = topic, width, rate
        self.stopping = threading.Event()
        self.sent = 0

    def run(self) -> None:
        import json

        start, tick = time.monotonic(), 0.1
        while not self.stopping.is_set():
            due = int((time.monotonic() - start) * self.rate / self.width) - self.sent
            if due > 0:
                jobs = [gearman.Copy("fanout", f"p:{self.sent + i}:{os.getpid()}",
                                     json.dumps({"topic": self.topic, "payload": PAYLOAD,
                                                 "background": True}).encode())
                        for i in range(due)]
                self.client.submit_foreground(jobs, timeout=120)
                self.sent += due
            self.stopping.wait(tick)


class Reader(threading.Thread):
    """Takes every copy of ``queues`` as it comes (one worker connection)."""

    def __init__(self, gm: servers.Managed, queues: list[str]) -> None:
        super().__init__(daemon=True)
        self.worker = gearman.WorkerConnection(gm.host, gm.port, queues, "bench-reader")
        self.worker.open()
        self.stopping = threading.Event()
        self.taken = 0

    def run(self) -> None:
        while not self.stopping.is_set():
            jobs = self.worker.grab(64)
            for job in jobs:
                self.worker.complete(job.handle)
            self.taken += len(jobs)
            if not jobs:
                self.worker.sleep(0.2)


def bench_memory(processes: int, seconds: float, dead: int, live: int,
                 rate: float | None) -> dict:
    """Samples (t, gearmand MiB, Redis MiB, live copies/s) with ``dead``
    never-read subscribers, then the live rate without them."""
    width = dead + live
    if rate is None:
        probe = Stack(processes, ON, durable=True)
        try:
            subscribe_many(probe.registry, "probe", width)
            rate = gearhorn_rate(probe.gearmand, "probe", 2000, width) / 2
        finally:
            probe.close()
        print(f"half load: {rate:,.0f} copies/s to {width} subscribers", flush=True)
    with_dead = _memory_run(processes, seconds, dead, live, rate)
    without = _memory_run(processes, min(seconds, 60.0), 0, live, rate * live / width)
    return {"rate": rate, "with_dead": with_dead, "without_dead": without}


def _memory_run(processes: int, seconds: float, dead: int, live: int, rate: float) -> dict:
    stack = Stack(processes, ON, durable=True)
    samples = []
    try:
        for i in range(dead):
            stack.registry.subscribe(_sub(f"dead{i}"))
        for i in range(live):
            stack.registry.subscribe(_sub(f"live{i}"))
        copies_redis = redis.Redis.from_url(stack.url)
        reader = Reader(stack.gearmand, [f"mem_live{i}" for i in range(live)])
        reader.start()
        producer = Producer(stack.gearmand, "mem", dead + live, rate)
        producer.start()
        start, last_taken, last_t = time.monotonic(), 0, 0.0
        while (t := time.monotonic() - start) < seconds:
            time.sleep(min(5.0, seconds / 24))
            t = time.monotonic() - start
            taken = reader.taken
            samples.append((round(t, 1), round(rss_mib(stack.gearmand.process.pid), 1),
                            round(copies_redis.info("memory")["used_memory"] / 1048576, 1),
                            round((taken - last_taken) / (t - last_t))))
            last_taken, last_t = taken, t
            print(f"  {'with' if dead else 'without'} dead: t={samples[-1][0]:>6}s gearmand "
                  f"{samples[-1][1]:>7} MiB, Redis {samples[-1][2]:>7} MiB, live "
                  f"{samples[-1][3]:>7,} copies/s", flush=True)
        producer.stopping.set()
        reader.stopping.set()
        producer.join(30)
        reader.join(30)
    finally:
        stack.close()
    return {"dead": dead, "live": live, "samples": samples}


def _sub(client_id: str):
    from gearhorn.rules.messages import Subscription

    return Subscription("mem", client_id)


def _tail_mean(samples: list, column: int, fraction: float = 0.5) -> float:
    tail = samples[int(len(samples) * (1 - fraction)):] or samples
    return sum(s[column] for s in tail) / len(tail)


def chart(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = result["with_dead"]["samples"]
    fig, ax = plt.subplots(figsize=(7, 3.2), dpi=100)
    ax.plot([s[0] for s in samples], [s[1] for s in samples], label="gearmand RSS")
    ax.plot([s[0] for s in samples], [s[2] for s in samples], label="Redis used (held copies)")
    ax.set_xlabel("seconds")
    ax.set_ylabel("MiB")
    ax.set_title(f"{result['with_dead']['dead']} subscribers never read, "
                 f"{result['with_dead']['live']} read; half load, 1 KiB payloads")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--part", choices=("cost", "memory", "both"), default="both")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--minutes", type=float, default=None)
    parser.add_argument("--rate", type=float, default=None,
                        help="copies/s of the memory run (default: half the measured rate)")
    parser.add_argument("--chart", default="docs/retention.png")
    args = parser.parse_args()
    minutes = args.minutes or (2.0 if args.quick else 10.0)
    if args.part in ("cost", "both"):
        ratios = bench_cost(args.processes, 100_000 if args.quick else 300_000,
                            2 if args.quick else 4)
        for width, values in ratios.items():
            print(f"limits on/off x{width}: {', '.join(f'{v:.3f}' for v in values)} "
                  f"(mean {sum(values) / len(values):.3f}; target >= 0.90)")
    if args.part in ("memory", "both"):
        result = bench_memory(args.processes, minutes * 60, 10, 10, args.rate)
        samples = result["with_dead"]["samples"]
        half = samples[len(samples) // 2:]
        print(f"gearmand RSS, second half: {min(s[1] for s in half):,.1f} to "
              f"{max(s[1] for s in half):,.1f} MiB; Redis: "
              f"{min(s[2] for s in half):,.1f} to {max(s[2] for s in half):,.1f} MiB")
        live_with = _tail_mean(samples, 3)
        live_without = _tail_mean(result["without_dead"]["samples"], 3)
        print(f"live subscribers' copies/s: {live_with:,.0f} with 10 dead ones, "
              f"{live_without:,.0f} without; ratio {live_with / live_without:.3f} "
              f"(target >= 0.90)")
        chart(result, args.chart)
        print(f"chart: {args.chart}")


if __name__ == "__main__":
    main()
