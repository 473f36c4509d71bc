"""Who has the CPU while a topic's subscribers wait for one.

One topic x10 run at ``--rate`` msg/s per broker (gearhorn, then RabbitMQ
when installed), with ``perf sched record -a`` for a few seconds in the
middle of it. From ``perf sched timehist``: how long the subscribers'
processes waited for a CPU after being woken (their MESSAGEs had arrived),
how often more than ``--over`` ms, and which tasks ran on the cores
during those waits. Needs ``perf`` (Debian: linux-perf) and root (tracefs
is mounted if it is not). docs/benchmarks.rst, issue 27::

    .venv/bin/python bench/sched_waits.py --websocket
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from bench import stomp_load  # noqa: E402
from bench.fanout_shape import percentile  # noqa: E402
from bench.stomp_bridge import Gearhorn, RabbitMQ, children  # noqa: E402

# perf sched timehist: time [cpu] comm[tid/pid] wait-time sch-delay run-time (ms)
_ROW = re.compile(r"\s*([\d.]+)\s+\[(\d+)\]\s+(.+?)\[(\d+)(?:/(\d+))?\]\s+([\d.]+)\s+([\d.]+)"
                  r"\s+([\d.]+)")


def record(broker_cls, args, data: str) -> tuple[dict[int, str], dict]:
    """A topic run with perf recording in its middle; the run's client
    processes (pid -> "subscriber" / "producer") and its result."""
    with broker_cls() as broker:
        stomp_load.topic_run(broker, 10, 2000)  # warm up
        servers = set(children(os.getpid()))
        clients: dict[int, str] = {}

        def perf() -> None:
            time.sleep(args.after)  # subscribers connected, the producer sending
            started = {}
            for pid in set(children(os.getpid())) - servers:
                with open(f"/proc/{pid}/stat") as stat:
                    started[pid] = int(stat.read().rsplit(")", 1)[1].split()[19])
            producer = max(started, key=started.get)  # started after the subscribers
            clients.update(dict.fromkeys(started, "subscriber"))
            clients[producer] = "producer"
            subprocess.run(["perf", "sched", "record", "-a", "-o", data, "--", "sleep",
                            str(args.seconds)], capture_output=True, check=True)

        recorder = threading.Thread(target=perf)
        recorder.start()
        result = stomp_load.topic_run(broker, 10, int(args.rate * (args.after + args.seconds + 2)),
                                      rate=args.rate)
        recorder.join()
        bridge = getattr(broker, "bridge", None)
        if bridge is not None:
            clients[bridge.pid] = "bridge"
        for pid in subprocess.run(["pgrep", "-f", "beam.smp"], capture_output=True,
                                  text=True).stdout.split():
            clients[int(pid)] = "RabbitMQ"
    return clients, result


def waits(data: str, labels: dict[int, str], over_ms: float) -> dict:
    """Subscribers' waits for a CPU, and who ran meanwhile (ms of CPU)."""
    out = subprocess.run(["perf", "sched", "timehist", "-i", data], capture_output=True,
                         text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        if m := _ROW.match(line):
            end, cpu, comm, tid, pid, _, delay, run = m.groups()
            rows.append((float(end), int(cpu), comm.strip(), int(pid or tid), float(delay),
                         float(run)))
    ran = defaultdict(list)  # cpu -> (start, end, label)
    for end, cpu, comm, pid, _, run in rows:
        ran[cpu].append((end - run / 1000, end, labels.get(pid, comm)))
    delays, meanwhile, used = [], Counter(), Counter()
    for end, _, comm, pid, delay, run in rows:
        used[labels.get(pid, comm)] += run
        if labels.get(pid) != "subscriber":
            continue
        delays.append(delay)
        if delay < over_ms:
            continue
        began = end - run / 1000
        for spans in ran.values():
            for start, stop, label in spans:
                overlap = min(stop, began) - max(start, began - delay / 1000)
                if overlap > 0:
                    meanwhile[label] += overlap * 1000
    return {"delays": delays, "meanwhile": meanwhile, "used": used}


def show(name: str, found: dict, over_ms: float) -> None:
    delays = found["delays"]
    print(f"  {name:9} subscribers' waits for a CPU: p50 {percentile(delays, 0.5):.3f}  "
          f"p90 {percentile(delays, 0.9):.3f}  p99 {percentile(delays, 0.99):.3f} ms; "
          f"{sum(d >= over_ms for d in delays):,} over {over_ms} ms", flush=True)
    top = ", ".join(f"{label} {ms:.0f}" for label, ms in found["meanwhile"].most_common(5))
    print(f"  {name:9} CPU ms meanwhile: {top}", flush=True)
    top = ", ".join(f"{label} {ms:.0f}" for label, ms in found["used"].most_common(5))
    print(f"  {name:9} CPU ms while recorded: {top}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=3.0, help="recorded (3)")
    parser.add_argument("--after", type=float, default=4.0, help="into the run (4)")
    parser.add_argument("--over", type=float, default=0.2, help="a long wait, ms (0.2)")
    parser.add_argument("--websocket", action="store_true")
    args = parser.parse_args()
    if not shutil.which("perf") or os.geteuid() != 0:
        raise SystemExit("needs perf (apt-get install linux-perf) and root")
    if not os.path.exists("/sys/kernel/tracing/events"):
        subprocess.run(["mount", "-t", "tracefs", "nodev", "/sys/kernel/tracing"], check=False)
    stomp_load.live_subscriptions()
    if args.websocket:
        os.environ["STOMP_LOAD_WEBSOCKET"] = "1"
    brokers = [Gearhorn] + ([RabbitMQ] if RabbitMQ.installed() else [])
    with tempfile.TemporaryDirectory() as tmp:
        for broker_cls in brokers:
            data = os.path.join(tmp, f"{broker_cls.name}.data")
            labels, result = record(broker_cls, args, data)
            print(f"  {broker_cls.name:9} topic x10 at {args.rate:,} msg/s: p50 "
                  f"{result['p50_ms']:.2f} ms  p99 {result['p99_ms']:.2f} ms", flush=True)
            show(broker_cls.name, waits(data, labels, args.over), args.over)


if __name__ == "__main__":
    main()
