"""A holder's death and a holder's pause: how long until its copies are
another's, and what either costs in copies delivered twice (issue 77).

    python bench/takeover.py --commits bb3a0ee . --turns 3   # before and after, in turns
    python bench/takeover.py                                 # the working tree alone

Each turn, on fresh servers on free loopback ports: the registry's Redis with
AOF (``appendfsync always``), a plain gearmand, two ``gearhorn worker
--processes 1`` pools on their defaults (a 2 s heartbeat, a 6 s lease), three
subscribers, 300 background fanouts held. Then one pool's worker is

- killed (-9): seconds from the kill until every copy it held is another's
  (the records say who holds each), and the copies received twice when all
  queues are drained;
- paused (SIGSTOP) until its copies are another's, then resumed: the same.

Nothing is consumed during the fault. The two commits' pools run in turns
on the same machine, so their figures stand side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)

from bench.ab import checkouts  # noqa: E402
from gearhorn import gearman  # noqa: E402
from gearhorn.client import Producer  # noqa: E402
from gearhorn.store import redisconn  # noqa: E402
from gearhorn.store.keys import Keys  # noqa: E402
from gearhorn.supervision import servers  # noqa: E402

SUBSCRIBERS = ("alice", "bob", "carol")
FANOUTS = 300
SETTINGS = {"GEARHORN_QUEUE_MAX_LENGTH": "0", "GEARHORN_QUEUE_MAX_BYTES": "0"}


def pool(tree: str, redis_url: str, gearmand, log: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gearhorn", "worker", "--processes", "1",
                             "--redis-url", redis_url, "--gearman", gearmand.address],
                            cwd=tree, env={**os.environ, **SETTINGS},
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT)


def children(parent: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fp:
                ppid = int(fp.read().rpartition(")")[2].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as fp:
                spawned = b"spawn_main" in fp.read()
        except (OSError, ValueError):
            continue
        if ppid == parent and spawned:
            found.append(int(entry))
    return found


def wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def holders_of(client, topic: str) -> Counter:
    """Records per holder (an incarnation's name, up to its ``@``)."""
    found = Counter()
    for who in SUBSCRIBERS:
        for _, record in client.hscan_iter(Keys().copies(f"{topic}_{who}"), count=1000):
            found[record.split(b"\0", 1)[0].decode().partition("@")[0]] += 1
    return found


def worker_id(client, pid: int) -> str:
    for key in client.scan_iter(match=Keys().worker("*")):
        if client.hget(key, "pid") == str(pid).encode():
            return key.decode().removeprefix(Keys().worker(""))
    raise RuntimeError(f"no worker with pid {pid}")


def drain(gearmand, topic: str, client) -> int:
    """Every queue taken until nothing is held; copies received twice."""
    twice = 0
    for who in SUBSCRIBERS:
        queue = f"{topic}_{who}"
        worker = gearman.WorkerConnection(gearmand.host, gearmand.port, [queue], "bench")
        worker.open()
        got: Counter = Counter()
        quiet_since = None
        while True:
            jobs = worker.grab(64)
            for job in jobs:
                got[job.data] += 1
                worker.complete(job.handle)
            if jobs or client.hlen(Keys().copies(queue)):
                quiet_since = None
            elif quiet_since is None:
                quiet_since = time.monotonic()
            elif time.monotonic() - quiet_since > 2:
                break
            if not jobs:
                time.sleep(0.05)
        worker.close()
        twice += sum(n - 1 for n in got.values() if n > 1)
    return twice


def one_turn(tree: str, fault: str) -> dict:
    data = tempfile.mkdtemp(prefix="gearhorn-takeover-")
    redis = servers.start_redis(data_dir=os.path.join(data, "redis"), appendonly=True,
                                barrier=False, extra=["--appendfsync", "always"])
    gearmand = servers.start_gearmand(data_dir=os.path.join(data, "gearmand"))
    url, client = redis.details["url"], redisconn.connect(redis.details["url"])
    pools = [pool(tree, url, gearmand, os.path.join(data, f"pool{n}.log")) for n in (1, 2)]
    try:
        wait(lambda: all(len(children(p.pid)) == 1 for p in pools)
             and {f.name: f.workers for f in gearman.status(gearmand.host, gearmand.port)
                  }.get("fanout") == 2, 60, "both pools")
        topic = f"take{int(time.time() * 1000) % 10**8}"
        with Producer([(gearmand.host, gearmand.port)], timeout=30) as producer:
            for who in SUBSCRIBERS:
                producer.subscribe(topic, who)
            for n in range(FANOUTS):
                producer.publish(topic, f"m{n}", background=True)
        wait(lambda: sum(holders_of(client, topic).values()) == FANOUTS * len(SUBSCRIBERS)
             and all(_depth(gearmand, f"{topic}_{w}") == FANOUTS for w in SUBSCRIBERS),
             60, "every copy held and handed")
        (victim,) = children(pools[0].pid)
        vid = worker_id(client, victim)
        held = holders_of(client, topic)[vid]
        struck = time.monotonic()
        os.kill(victim, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
        wait(lambda: holders_of(client, topic)[vid] == 0, 120, "the copies taken over")
        taken_after = time.monotonic() - struck
        if fault == "pause":
            os.kill(victim, signal.SIGCONT)
        time.sleep(3)  # let a resumed worker learn it was fenced before the drain
        twice = drain(gearmand, topic, client)
        return {"held": held, "taken_after_s": round(taken_after, 2), "twice": twice}
    finally:
        for p in pools:
            p.terminate()
        for p in pools:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        gearmand.stop()
        redis.stop()


def _depth(gearmand, queue: str) -> int:
    return next((f.queued for f in gearman.status(gearmand.host, gearmand.port)
                 if f.name == queue), 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", nargs="+", default=["."], metavar="REV")
    parser.add_argument("--turns", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict = {rev: {"kill": [], "pause": []} for rev in args.commits}
    with checkouts(args.commits) as trees:
        for turn in range(args.turns):
            for rev in args.commits:
                for fault in ("kill", "pause"):
                    found = one_turn(trees[rev], fault)
                    results[rev][fault].append(found)
                    print(f"turn {turn + 1} {rev} {fault}: {found}", flush=True)
    print()
    for rev, faults in results.items():
        for fault, runs in faults.items():
            taken = [r["taken_after_s"] for r in runs]
            print(f"{rev:>10} {fault:5}: taken over after {statistics.median(taken):.1f} s "
                  f"(median of {len(runs)}; {min(taken):.1f}-{max(taken):.1f}), received "
                  f"twice {[r['twice'] for r in runs]} of {[r['held'] for r in runs]} held")
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
