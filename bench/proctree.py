"""What a process and every process under it have used (benchmarks)."""

from __future__ import annotations

import os


def tree_cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of ``pid`` and every process under it."""
    tick = os.sysconf("SC_CLK_TCK")
    parents, times = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fp:
                fields = fp.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    tree, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == parent and p not in tree]
        tree.update(kids)
        frontier += kids
    return sum(times.get(p, 0.0) for p in tree)
