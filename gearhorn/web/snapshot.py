"""What Redis and every gearmand say now: one JSON-ready dict.

The metrics, the console, readiness and ``gearhorn status`` all read this. Its cost is bounded
whatever the number of topics and queues: ``top`` topics (by copies, then
any others up to ``top``), ``top`` queues by depth, ``top`` dead-letter
queues; totals are exact (gearhorn/store/stats.py). An unreachable server is
reported in the snapshot, never raised.
"""

from __future__ import annotations

import heapq
import json
import time
from collections.abc import Sequence

import redis

from gearhorn import gearman
from gearhorn.rules.messages import PREFIX_WILDCARD
from gearhorn.rules.naming import dead_letter_queue
from gearhorn.store import stats
from gearhorn.store.delayed import Scheduler
from gearhorn.store.keys import Keys
from gearhorn.store.liveness import of_bridges
from gearhorn.store.redisconn import REDIS_ERRORS
from gearhorn.store.redisutil import text
from gearhorn.store.registry import Registry

DLQ_SUFFIX = dead_letter_queue("")


class Collector:
    def __init__(self, registry: Registry, servers: Sequence[tuple[str, int]],
                 top: int = 100, tls: gearman.TlsFiles | None = None) -> None:
        self.registry = registry
        self.redis: redis.Redis = registry.redis
        self.keys: Keys = registry.keys
        self.servers = tuple(servers)
        self.top = top
        self.tls = tls

    def collect(self) -> dict:
        snap: dict = {"at": time.time(), "redis": {"up": True}}
        snap.update(self._gearmand())
        try:
            snap.update(self._registry())
        except REDIS_ERRORS as exc:
            snap["redis"] = {"up": False, "error": str(exc)}
        snap["dead_letters"] = _dead_letter_queues(snap)
        return snap

    def readiness(self) -> dict:
        """Ready: Redis and every gearmand answer, and a worker lives; the
        reasons when not. Cheaper than :meth:`collect` (probes run often)."""
        reasons, workers = [], 0
        try:
            self.redis.ping()
            workers = len(self.registry.workers.alive())
            if not workers:
                reasons.append("no live worker")
        except REDIS_ERRORS as exc:
            reasons.append(f"redis unreachable: {exc}")
        try:
            over = text(self.redis.hget(self.keys.store, "over") or b"")
            if over:
                reasons.append(over)
        except REDIS_ERRORS:
            pass  # said above
        for host, port in self.servers:
            try:
                gearman.admin(host, port, "version", tls=self.tls)
            except OSError as exc:
                reasons.append(f"gearmand {host}:{port} unreachable: {exc}")
        return {"ready": not reasons, "reasons": reasons, "workers": workers}

    def _registry(self) -> dict:
        counters = stats.read(self.redis, self.keys, self.top)
        return {
            "topics": self._topics(counters),
            "topic_count": self.redis.scard(self.keys.topics),
            "pattern_count": self.redis.scard(self.keys.prefixes),
            "totals": counters.totals,
            "latency": {"buckets": counters.buckets, "sum": counters.latency_sum},
            "dead_letter_totals": counters.dead_letters,
            "dropped": [{"topic": t, "reason": r, "copies": n}
                        for (t, r), n in counters.dropped.items()],
            **retention(self.redis, self.keys),
            "workers": self._workers(),
            "bridges": self._bridges(),
            "delayed": Scheduler(self.redis, self.keys).pending(),
            "report": _json_or_none(self.redis.get(self.keys.last_report)),
            "audit": _json_or_none(self.redis.get(self.keys.audit)),
        }

    def _topics(self, counters: stats.Counters) -> list[dict]:
        """The top topics by copies; while fewer than ``top`` have any, the
        others with subscribers too (a topic nobody published to yet)."""
        names = list(counters.copies)
        for key in (self.keys.topics, self.keys.prefixes):
            for member in self.redis.sscan_iter(key, count=1000):
                if len(names) >= self.top:
                    break
                if (name := text(member)) not in counters.copies:
                    names.append(name)
        pipe = self.redis.pipeline(transaction=False)
        for name in names:
            pipe.scard(self.keys.prefix_set(name) if name.endswith(PREFIX_WILDCARD)
                       else self.keys.topic(name))
        return [{"topic": name, "subscribers": subscribers,
                 "copies": counters.copies.get(name, 0.0),
                 "fanouts": counters.fanouts.get(name, 0.0)}
                for name, subscribers in zip(names, pipe.execute(), strict=True)]

    def _workers(self) -> list[dict]:
        return [{"id": wid, **info} for wid, info in sorted(self.registry.live_workers().items())]

    def _bridges(self) -> list[dict]:
        live = of_bridges(self.redis, self.keys).alive_with_info()
        return [{"id": bridge_id, **info} for bridge_id, info in live.items()]

    def _gearmand(self) -> dict:
        """Every server's status; queue depths summed over servers."""
        servers, depth = [], {}
        for host, port in self.servers:
            entry: dict = {"server": f"{host}:{port}", "up": True}
            try:
                rows = gearman.status_rows(host, port, tls=self.tls)
            except OSError as exc:  # GearmanError is one
                entry = {**entry, "up": False, "error": str(exc)}
                rows = []
            for name, queued, running, workers in rows:
                if (row := depth.get(name)) is None:
                    depth[name] = [queued, running, workers]
                else:
                    row[0], row[1], row[2] = row[0] + queued, row[1] + running, row[2] + workers
            entry["functions"] = self._deepest((name, row) for name, *row in rows)
            servers.append(entry)
        return {"gearmand": servers,
                "queues": self._deepest(depth.items()),
                "queue_count": len(depth), "queued_total": sum(q for q, _, _ in depth.values()),
                "dlq_depths": {name[:-len(DLQ_SUFFIX)]: row[0] for name, row in depth.items()
                               if name.endswith(DLQ_SUFFIX)}}


    def _deepest(self, depths) -> list[dict]:
        """The ``top`` queues by jobs queued, from (name, [queued, running, workers])."""
        top = heapq.nsmallest(self.top, depths, key=lambda kv: (-kv[1][0], kv[0]))
        return [{"queue": name, "queued": q, "running": r, "workers": w}
                for name, (q, r, w) in top]


def _dead_letter_queues(snap: dict) -> list[dict]:
    """Queues with dead letters now or ever: queued in ``<queue>.dlq`` (gearmand)
    and dead-lettered in all (the counter)."""
    queued, totals = snap.pop("dlq_depths", {}), snap.get("dead_letter_totals", {})
    names = sorted(set(queued) | set(totals))
    return [{"queue": q, "queued": queued.get(q, 0), "total": totals.get(q, 0.0)}
            for q in names]


def retention(client, keys: Keys) -> dict:
    """The warden's last round: the largest backlogs (queue, depth, bytes,
    oldest_age, consumers, limits) and the queue store against its guard."""
    backlogs = _json_or_none(client.get(keys.backlogs)) or {"queues": []}
    store = {text(k): text(v) for k, v in client.hgetall(keys.store).items()}
    return {"backlogs": backlogs["queues"], "store": store}


def _json_or_none(raw: bytes | None) -> dict | None:
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return None
