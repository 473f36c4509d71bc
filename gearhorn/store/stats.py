"""Counters that every process adds to and any process reads: in Redis.

Why it is shaped so: docs/design/notes.rst, "gearhorn/store/stats.py".
"""

from __future__ import annotations

import bisect
import logging
from collections import Counter, deque
from dataclasses import dataclass, field

import redis

from gearhorn.runtime.background import Outage
from gearhorn.store.keys import Keys
from gearhorn.store.redisconn import REDIS_ERRORS
from gearhorn.store.redisutil import text

# Seconds from a fanout job's arrival at a worker to gearmand accepting its
# copies (foreground: to the last receiver's answer).
log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                   5.0, 10.0, 30.0)
INF = "+Inf"


def bucket_of(seconds: float) -> str:
    """The field of the smallest bucket holding ``seconds``."""
    i = bisect.bisect_left(LATENCY_BUCKETS, seconds)
    return f"le:{LATENCY_BUCKETS[i]}" if i < len(LATENCY_BUCKETS) else f"le:{INF}"


# Fanouts whose counts a worker keeps while Redis is away.
MAX_PENDING = 100_000


class Stats:
    """The write side. Buffered (``buffered=True``): ``fanout`` only appends
    to a deque and ``flush`` (the worker's flusher thread, every 0.1 s, and
    at a clean stop) writes the sums in one round trip; a worker killed with
    -9 loses its last 0.1 s of counts, as it does of its ledger. Unbuffered,
    every fanout writes before it is answered (exact through kill -9, at one
    more Redis round trip per fanout). Disabled: nothing is written."""

    def __init__(self, client: redis.Redis, keys: Keys, enabled: bool = True,
                 buffered: bool = False) -> None:
        self.redis = client
        self.keys = keys
        self.enabled = enabled
        self.buffered = buffered
        self._pending: deque[tuple[str, int, int, float | None]] = deque()  # lock-free
        self.lost = 0  # fanouts whose counts were dropped: Redis away too long
        self._outage = Outage(log, "redis (metrics)")

    def fanout(self, topic: str, messages: int, copies: int,
               seconds: float | None = None) -> None:
        """``messages`` of ``topic`` made ``copies``; ``seconds`` since the job came."""
        if not self.enabled:
            return
        if self.buffered:
            self._pending.append((topic, messages, copies, seconds))
            return
        self._write([(topic, messages, copies, seconds)])

    def flush(self) -> None:
        """Write what is buffered, all or nothing; on a Redis error the
        counts wait for the next flush (up to MAX_PENDING fanouts' worth)."""
        taken = [self._pending.popleft() for _ in range(len(self._pending))]
        if not taken:
            return
        try:
            self._write(taken)
        except REDIS_ERRORS as exc:
            kept = taken[-MAX_PENDING:]
            self.lost += len(taken) - len(kept)
            self._pending.extend(kept)
            self._outage.failed(exc, f"; counts of {len(kept)} fanouts wait")
        else:
            if self._outage.down:
                self._outage.succeeded(f"; counts written; those of {self.lost} fanouts "
                                       f"lost since start")

    def _write(self, fanouts: list[tuple[str, int, int, float | None]]) -> None:
        copies: Counter[str] = Counter()
        messages: Counter[str] = Counter()
        totals: Counter[str] = Counter()
        latency_sum = 0.0
        for topic, count, made, seconds in fanouts:
            copies[topic] += made
            messages[topic] += count
            totals["copies"] += made
            totals["fanouts"] += count
            if seconds is not None:
                totals[bucket_of(seconds)] += 1
                totals["latency_count"] += 1
                latency_sum += seconds
        # One MULTI (the stats keys share a hash slot): a failed flush wrote
        # nothing, so writing it again later cannot count twice.
        pipe = self.redis.pipeline(transaction=True)
        for topic in copies:
            pipe.zincrby(self.keys.stats("copies"), copies[topic], topic)
            pipe.zincrby(self.keys.stats("fanouts"), messages[topic], topic)
        for name, value in totals.items():
            pipe.hincrby(self.keys.stats("totals"), name, value)
        if totals["latency_count"]:
            pipe.hincrbyfloat(self.keys.stats("totals"), "latency_sum", latency_sum)
        pipe.execute()

    def dead_letter(self, queue: str, pipe: redis.client.Pipeline | None = None) -> None:
        if not self.enabled:
            return
        target = pipe or self.redis.pipeline(transaction=False)
        target.zincrby(self.keys.stats("dead-letters"), 1, queue)
        target.hincrby(self.keys.stats("totals"), "dead_letters", 1)
        if pipe is None:
            target.execute()

    def dropped(self, topic: str, reason: str, count: int) -> None:
        """``count`` copies of ``topic`` not kept by their queue's limits."""
        if not self.enabled or not count:
            return
        pipe = self.redis.pipeline(transaction=True)
        pipe.zincrby(self.keys.stats("dropped"), count, f"{topic}\t{reason}")
        pipe.hincrby(self.keys.stats("totals"), f"dropped:{reason}", count)
        pipe.execute()


@dataclass
class Counters:
    """What the counters say now (the top ``top`` topics and queues)."""

    copies: dict[str, float] = field(default_factory=dict)  # topic -> copies
    fanouts: dict[str, float] = field(default_factory=dict)
    dead_letters: dict[str, float] = field(default_factory=dict)  # queue -> count
    dropped: dict[tuple[str, str], float] = field(default_factory=dict)  # (topic, reason)
    totals: dict[str, float] = field(default_factory=dict)
    # (upper bound, cumulative count) per bucket, +Inf last; and the sum
    buckets: list[tuple[str, float]] = field(default_factory=list)
    latency_sum: float = 0.0

    @property
    def latency_count(self) -> float:
        return self.buckets[-1][1] if self.buckets else 0.0


def read(client: redis.Redis, keys: Keys, top: int) -> Counters:
    """The counters in one round trip, bounded by ``top`` labels per metric."""
    pipe = client.pipeline(transaction=False)
    pipe.zrevrange(keys.stats("copies"), 0, top - 1, withscores=True)
    pipe.zrevrange(keys.stats("dead-letters"), 0, top - 1, withscores=True)
    pipe.hgetall(keys.stats("totals"))
    pipe.zrevrange(keys.stats("dropped"), 0, top - 1, withscores=True)
    copies, dead, totals, dropped = pipe.execute()
    counters = Counters(copies={text(t): n for t, n in copies},
                        dead_letters={text(q): n for q, n in dead},
                        dropped={tuple(text(m).split("\t", 1)): n for m, n in dropped})
    if counters.copies:
        names = list(counters.copies)
        scores = client.zmscore(keys.stats("fanouts"), names)
        counters.fanouts = {t: s or 0.0 for t, s in zip(names, scores, strict=True)}
    raw = {text(k): float(v) for k, v in totals.items()}
    counters.totals = {k: raw.get(k, 0.0) for k in ("copies", "fanouts", "dead_letters")}
    counters.totals.update({k: v for k, v in raw.items() if k.startswith("dropped:")})
    counters.latency_sum = raw.get("latency_sum", 0.0)
    running = 0.0
    for bound in (*map(str, LATENCY_BUCKETS), INF):
        running += raw.get(f"le:{bound}", 0.0)
        counters.buckets.append((bound, running))
    return counters
