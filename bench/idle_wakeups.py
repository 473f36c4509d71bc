"""How often an idle gearhorn wakes up: every process's context switches and
Redis's commands over a quiet spell, nobody connected.

    python bench/idle_wakeups.py                 # 20 s
    python bench/idle_wakeups.py --seconds 60

Starts what bench/stomp_bridge.py starts (redis-server, gearmand, a pool of
two workers, the bridge) on loopback, waits for the pool and the bridge,
lets them settle, then reads each process's context switches (all its
threads, /proc) and Redis's ``total_commands_processed`` before and after.
Every wake-up of an idle process takes a core, for a few microseconds and
a cache's worth, from whoever needed it: on a 2-core machine, from the
bridge's subscribers (docs/benchmarks.rst, issue 27).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import redis

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench.stomp_bridge import Gearhorn, children  # noqa: E402


def switches(pid: int) -> int:
    """Context switches, voluntary and not, of every thread of ``pid``."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as status:
                for line in status:
                    if "ctxt_switches:" in line:  # voluntary and nonvoluntary
                        total += int(line.split()[1])
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
    return total


def processes(broker: Gearhorn) -> dict[str, list[int]]:
    workers = children(broker.pool.pid)
    return {"pool supervisor": [broker.pool.pid],
            "worker processes": workers,
            "bridge": [broker.bridge.pid, *children(broker.bridge.pid)],
            "redis-server": [broker.redis.process.pid],
            "gearmand": [broker.gearmand.process.pid]}


def measure(seconds: float, settle: float) -> dict[str, float]:
    with Gearhorn() as broker:
        time.sleep(settle)  # start-up's own work (subscriptions, leases) done
        client = redis.Redis.from_url(broker.redis.details["url"])
        groups = processes(broker)
        before = {name: sum(switches(p) for p in pids) for name, pids in groups.items()}
        commands = client.info("stats")["total_commands_processed"]
        time.sleep(seconds)  # the quiet spell measured, not a wait for a condition
        rates = {name: (sum(switches(p) for p in pids) - before[name]) / seconds
                 for name, pids in groups.items()}
        # Less the INFO call itself.
        rates["redis commands"] = (client.info("stats")["total_commands_processed"]
                                   - commands - 1) / seconds
        rates["workers"] = len(groups["worker processes"])
        return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--settle", type=float, default=5.0)
    args = parser.parse_args()
    rates = measure(args.seconds, args.settle)
    print(f"idle for {args.seconds:.0f} s, {rates.pop('workers'):.0f} worker processes:")
    for name, rate in rates.items():
        unit = "commands/s" if name == "redis commands" else "wake-ups/s"
        print(f"  {name:18} {rate:8.1f} {unit}")


if __name__ == "__main__":
    main()
