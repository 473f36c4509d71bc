"""Two or more gearhorn commits measured in turns, for a change whose effect
is smaller than this machine's noise.

    python bench/ab.py HEAD~1 .                         # latency at 100 and 1,000 msg/s
    python bench/ab.py 4810592 6f6cc76 . --turns 6 --stream
    python bench/ab.py HEAD~1 . --throughput x10 queue --turns 4

Turns of one rate on a loaded 2-core box differ by 2x and more, and so
do runs a few minutes apart, so two runs of bench/stomp_load.py one after
the other cannot tell a 20% change from the machine's mood. Here every
turn runs each commit in turn (``.`` is the working tree, uncommitted
changes and all; any other name is checked out into a temporary git
worktree), each with servers of its own, and the medians are printed
with every turn, so the spread can be read beside them. The order turns
round, turn by turn (A B, B A, ...): whichever ran first measured faster.
gearhorn only: RabbitMQ's figures are bench/stomp_load.py's business.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from bench.fanout_shape import describe, fanout_shape  # noqa: E402
from bench.stomp_bridge import Gearhorn  # noqa: E402
from bench.stomp_load import (  # noqa: E402
    client_options,
    pooled,
    queue_run,
    topic_run,
    use_client_options,
)

RUNS = {  # what --throughput names: a run of bench/stomp_load.py
    "x10": lambda broker: topic_run(broker, 10, 20_000),
    "x100": lambda broker: topic_run(broker, 100, 2_000),
    "queue": lambda broker: queue_run(broker, 20_000),
}


@contextlib.contextmanager
def checkouts(revisions: list[str]):
    """A directory per revision: the working tree for ``.``, else a worktree."""
    made, trees = [], {}
    try:
        for rev in revisions:
            if rev == ".":
                trees[rev] = ROOT
                continue
            tree = os.path.join(tempfile.mkdtemp(prefix="gearhorn-ab-"), "tree")
            subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-q", tree, rev],
                           check=True)
            made.append(tree)
            trees[rev] = tree
        yield trees
    finally:
        for tree in made:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", tree],
                           check=False)
            shutil.rmtree(os.path.dirname(tree), ignore_errors=True)  # mkdtemp's, left empty


def one_turn(tree: str, args) -> dict[str, dict]:
    """Every measurement of one turn on the gearhorn of ``tree``."""
    os.chdir(tree)  # the bridge and workers run `python -m gearhorn` from here
    results = {}
    with Gearhorn() as broker:
        topic_run(broker, 10, 2_000)  # warm up
        for rate in args.latency_at:
            results[f"{rate} msg/s"] = topic_run(broker, args.subscribers, rate * args.seconds,
                                                 rate=rate)
        for name in args.throughput:
            results[name] = RUNS[name](broker)
    return results


def figure(name: str, result: dict) -> str:
    if "p50_ms" in result:
        return (f"p50 {result['p50_ms']:5.2f}  p99 {result['p99_ms']:6.2f} ms  "
                f"bridge cpu {result['broker_cpu']:.3f}")
    return f"{result['rate']:9,.0f}/s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revisions", nargs="+", help="commits; . is the working tree")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--latency-at", type=int, nargs="*", default=None, metavar="MSG_PER_S",
                        help="topic x10 latency at these rates (100 1000 unless --throughput)")
    parser.add_argument("--seconds", type=int, default=5, help="of each latency run")
    parser.add_argument("--subscribers", type=int, default=10, help="of each latency run")
    parser.add_argument("--throughput", nargs="*", default=[], choices=sorted(RUNS))
    client_options(parser)
    args = parser.parse_args()
    use_client_options(args)
    if args.latency_at is None:
        args.latency_at = [] if args.throughput else [100, 1000]
    turns: dict[tuple[str, str], list[dict]] = {}
    with checkouts(args.revisions) as trees:
        revisions = list(trees)
        for turn in range(1, args.turns + 1):
            # The commit that runs first in a turn measured ~4% more x100
            # throughput (the same commit both ways, docs/benchmarks.rst):
            # each turn starts one further along.
            first = (turn - 1) % len(revisions)
            for rev in revisions[first:] + revisions[:first]:
                for name, result in one_turn(trees[rev], args).items():
                    turns.setdefault((rev, name), []).append(result)
                    print(f"  turn {turn}  {rev:12} {name:12} {figure(name, result)}", flush=True)
    for (rev, name), results in turns.items():
        keys = ("p50_ms", "p99_ms", "broker_cpu") if "p50_ms" in results[0] else ("rate",)
        median = {key: statistics.median(r[key] for r in results) for key in keys}
        print(f"  median of {len(results)}  {rev:12} {name:12} {figure(name, median)}",
              flush=True)
        if "p50_ms" in results[0]:
            print(f"  pooled       {rev:12} {name:12} {pooled(results)}", flush=True)
            shape = fanout_shape(a for r in results for a in r["arrivals"])
            print(f"  fan-out      {rev:12} {name:12} {describe(shape)}", flush=True)


if __name__ == "__main__":
    main()
