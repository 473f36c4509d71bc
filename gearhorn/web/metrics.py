"""A snapshot (gearhorn/web/snapshot.py) as Prometheus metric families.

prometheus_client writes the exposition; this module only says what each
metric is. Labelled metrics carry at most ``metrics_top`` label values
(topics by copies, queues by depth), so a scrape stays small with 100,000
topics; the ``gearhorn_all_*`` totals are exact over everything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector


def families(snap: dict) -> Iterator[Metric]:
    yield _gauge("gearhorn_redis_up", "1 if Redis answered this scrape",
                 1 if snap["redis"]["up"] else 0)
    up = GaugeMetricFamily("gearhorn_gearmand_up", "1 if the gearmand answered its status",
                           labels=["server"])
    for server in snap["gearmand"]:
        up.add_metric([server["server"]], 1 if server["up"] else 0)
    yield up
    yield from _queues(snap)
    if snap["redis"]["up"]:
        yield from _registry(snap)


def _queues(snap: dict) -> Iterator[Metric]:
    depth = GaugeMetricFamily("gearhorn_queue_depth", "jobs queued per Gearman function, "
                              "summed over every gearmand (top N by depth)", labels=["queue"])
    for queue in snap["queues"]:
        depth.add_metric([queue["queue"]], queue["queued"])
    yield depth
    yield _gauge("gearhorn_queued_jobs", "jobs queued in every function of every gearmand",
                 snap["queued_total"])


def _registry(snap: dict) -> Iterator[Metric]:
    topics = snap["topics"]
    yield _labelled(CounterMetricFamily, "gearhorn_copies", "copies made per topic (top N "
                    "topics by copies)", "topic", topics, lambda t: (t["topic"], t["copies"]))
    yield _labelled(CounterMetricFamily, "gearhorn_fanouts", "messages fanned out per topic "
                    "(top N topics by copies)", "topic", topics,
                    lambda t: (t["topic"], t["fanouts"]))
    yield _labelled(GaugeMetricFamily, "gearhorn_subscribers", "subscribers per topic or "
                    "prefix pattern (top N)", "topic", topics,
                    lambda t: (t["topic"], t["subscribers"]))
    totals = snap["totals"]
    yield CounterMetricFamily("gearhorn_all_copies", "copies made, every topic",
                              value=totals["copies"])
    yield CounterMetricFamily("gearhorn_all_fanouts", "messages fanned out, every topic",
                              value=totals["fanouts"])
    yield CounterMetricFamily("gearhorn_all_dead_letters", "messages dead-lettered, every queue",
                              value=totals["dead_letters"])
    yield _labelled(CounterMetricFamily, "gearhorn_dead_letters", "messages dead-lettered per "
                    "queue (top N)", "queue", snap["dead_letter_totals"].items(), tuple)
    yield from _retention(snap)
    yield from _audit(snap.get("audit"), snap["at"])
    yield _gauge("gearhorn_topics", "topics with a direct subscriber", snap["topic_count"])
    yield _gauge("gearhorn_prefix_subscriptions", "prefix patterns with a subscriber",
                 snap["pattern_count"])
    yield _gauge("gearhorn_delayed_messages", "delayed messages waiting in Redis",
                 snap["delayed"])
    yield _gauge("gearhorn_workers", "live worker processes", len(snap["workers"]))
    yield _gauge("gearhorn_bridges", "live STOMP bridge processes", len(snap["bridges"]))
    yield _gauge("gearhorn_stomp_connections", "STOMP connections over every bridge",
                 sum(int(b.get("connections", 0)) for b in snap["bridges"]))
    latency = snap["latency"]
    yield HistogramMetricFamily(
        "gearhorn_fanout_latency_seconds", "from a fanout job's arrival at a worker to "
        "gearmand accepting its copies", buckets=[list(b) for b in latency["buckets"]],
        sum_value=latency["sum"])


def _retention(snap: dict) -> Iterator[Metric]:
    """Bounded queues (gearhorn/worker/warden.py): what was not kept, and the backlogs."""
    dropped = CounterMetricFamily("gearhorn_copies_dropped", "copies not kept by their "
                                  "queue's limits, per topic and reason (maxlen, maxbytes, "
                                  "expired, removed, full)", labels=["topic", "reason"])
    for row in snap.get("dropped", []):
        dropped.add_metric([row["topic"], row["reason"]], row["copies"])
    yield dropped
    backlogs = snap.get("backlogs", [])
    for name, doc, value in (
            ("gearhorn_subscriber_backlog", "copies queued per subscriber queue (largest)",
             lambda b: b["depth"]),
            ("gearhorn_subscriber_oldest_age_seconds", "age of the oldest queued copy "
             "per subscriber queue (largest backlogs)", lambda b: b["oldest_age"] or 0.0),
            ("gearhorn_subscriber_without_consumer", "1 for a subscriber queue with a "
             "backlog and no consumer (largest backlogs)", lambda b: 0 if b["consumers"] else 1)):
        yield _labelled(GaugeMetricFamily, name, doc, "queue", backlogs,
                        lambda b, value=value: (b["queue"], value(b)))
    store = snap.get("store", {})
    yield _gauge("gearhorn_queue_store_used_bytes", "memory used by the Redis holding the copies",
                 float(store.get("used") or 0))
    yield _gauge("gearhorn_queue_store_guard_bytes", "above this the workers refuse fanouts "
                 "(0: no maxmemory, no guard)", float(store.get("guard") or 0))
    yield _gauge("gearhorn_queue_store_over_guard", "1 while fanouts are refused: the queue "
                 "store is over its guard", 1 if store.get("over") else 0)


# The live audit's finding kinds as metric names (gearhorn/pipeline/verdicts.py).
_AUDIT_KINDS = (("never_delivered", "gearhorn_audit_copies_lost",
                 "copies not delivered within the deadline while later ones were"),
                ("overdue", "gearhorn_audit_copies_overdue",
                 "copies not delivered within the deadline by a subscriber taking older ones"),
                ("duplicate", "gearhorn_audit_copies_duplicated",
                 "copies delivered more than once as new"),
                ("stream_gap", "gearhorn_audit_stream_gaps",
                 "runs of history offsets a stream subscription skipped"),
                ("stream_duplicate", "gearhorn_audit_stream_duplicates",
                 "runs of history offsets a stream subscription was given again"))


def _audit(verdict: dict | None, now: float) -> Iterator[Metric]:
    """The live audit's findings (gearhorn audit), when it runs."""
    if not verdict:
        return
    topics = verdict.get("topics", {})
    for kind, name, doc in _AUDIT_KINDS:
        family = CounterMetricFamily(name, f"live audit: {doc}, per topic (top N)",
                                     labels=["topic"])
        for topic, kinds in topics.items():
            family.add_metric([topic], kinds.get(kind, 0))
        yield family
        yield CounterMetricFamily(f"gearhorn_audit_all_{name.removeprefix('gearhorn_audit_')}",
                                  f"live audit: {doc}, every topic",
                                  value=verdict.get("totals", {}).get(kind, 0))
    yield CounterMetricFamily("gearhorn_audit_copies_settled", "live audit: copies seen "
                              "delivered, answered or dropped in time", value=verdict["settled"])
    yield _gauge("gearhorn_audit_state_rows", "live audit: rows of state it keeps (counting "
                 "first: open queue buckets; on Spark: its join's rows)",
                 verdict.get("state_rows", 0))
    lag = verdict.get("lag") or {}
    if lag.get("p50_s") is not None:
        family = GaugeMetricFamily("gearhorn_audit_lag_seconds", "live audit: how far its "
                                   "micro-batches run behind the ledger", labels=["quantile"])
        family.add_metric(["0.5"], lag["p50_s"])
        family.add_metric(["0.99"], lag["p99_s"])
        yield family
    yield _gauge("gearhorn_audit_age_seconds", "live audit: seconds since its last micro-batch "
                 "(it stopped if this grows)", max(0.0, now - verdict["updated_ms"] / 1000))


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _labelled(kind: type, name: str, doc: str, label: str, rows,
              pick: Callable[[object], tuple[str, float]]) -> Metric:
    family = kind(name, doc, labels=[label])
    for row in rows:
        value, number = pick(row)
        family.add_metric([value], number)
    return family


class SnapshotCollector(Collector):
    """Registered in a prometheus_client registry: each scrape collects afresh."""

    def __init__(self, snapshot: Callable[[], dict]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        return families(self.snapshot())
