"""The shape of a topic's fan-out, from what its subscribers recorded.

A topic x10 p99 says how late the latest deliveries were, not why. Each
subscriber process of bench/stomp_load.py records, for every MESSAGE, when
it was sent, which of its sockets read it, when it read it and when it woke
up to read it. Grouped by message, that shows:

- *first* and *last*: the earliest and latest of a message's deliveries
  (a broker that writes one subscriber after another has an early first and
  a wide gap to its last; one that writes them in parallel, a later first
  and a narrow gap);
- *wake-ups*: how many times subscriber processes woke up to read one
  message. Four processes read ten subscriptions here, so at least four;
  deliveries spread out in time wake a process once per socket instead of
  once for all of them, and each wake-up is CPU on the same two cores.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

# One delivery: (sent, process, socket, read latency s, latency at wake-up s)
Arrival = tuple[float, int, int, float, float]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


def fanout_shape(arrivals: Iterable[Arrival]) -> dict[str, float]:
    """First and last delivery of each message (ms, p50 and p99) and the
    subscriber wake-ups per message.

    >>> shape = fanout_shape([(1.0, 0, 0, 0.001, 0.001), (1.0, 0, 1, 0.002, 0.001),
    ...                       (1.0, 1, 0, 0.004, 0.003), (2.0, 0, 0, 0.001, 0.001)])
    >>> shape["last_p50_ms"], shape["wakeups_per_message"]
    (4.0, 1.5)
    """
    by_message: dict[float, list[float]] = defaultdict(list)
    wakes: dict[float, set[tuple[int, float]]] = defaultdict(set)
    for sent, process, _, read, woke in arrivals:
        by_message[sent].append(read * 1000)
        wakes[sent].add((process, woke))  # one wake-up reads all its sockets ready
    firsts = [min(lats) for lats in by_message.values()]
    lasts = [max(lats) for lats in by_message.values()]
    return {"first_p50_ms": percentile(firsts, 0.5), "first_p99_ms": percentile(firsts, 0.99),
            "last_p50_ms": percentile(lasts, 0.5), "last_p99_ms": percentile(lasts, 0.99),
            "wakeups_per_message": sum(map(len, wakes.values())) / len(by_message)}


def describe(shape: dict[str, float]) -> str:
    return (f"first p50 {shape['first_p50_ms']:.2f} p99 {shape['first_p99_ms']:.2f}  "
            f"last p50 {shape['last_p50_ms']:.2f} p99 {shape['last_p99_ms']:.2f} ms  "
            f"wake-ups {shape['wakeups_per_message']:.2f} a message")
