"""The pure parts of gearhorn web and the counters behind it, without sockets
(fakeredis for the counters)."""

from __future__ import annotations

import base64
import json

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gearhorn.rules import auth
from gearhorn.rules.messages import Subscription
from gearhorn.store import stats
from gearhorn.store.keys import Keys
from gearhorn.store.registry import Registry
from gearhorn.web import access
from gearhorn.web.history import RateHistory
from gearhorn.web.metrics import SnapshotCollector
from gearhorn.web.snapshot import Collector

pytestmark = pytest.mark.timeout(30)
KEYS = Keys("t:", "chan")


def test_latency_goes_to_the_smallest_bucket_that_holds_it():
    assert stats.bucket_of(0.0) == "le:0.001"
    assert stats.bucket_of(0.001) == "le:0.001"
    assert stats.bucket_of(0.0011) == "le:0.0025"
    assert stats.bucket_of(31) == "le:+Inf"


def test_counters_add_up_over_writers_and_read_back_bounded(fake_redis):
    one, two = stats.Stats(fake_redis, KEYS), stats.Stats(fake_redis, KEYS)
    one.fanout("news", 1, 3, 0.002)
    two.fanout("news", 2, 6, 0.2)
    two.fanout("sport", 1, 1)  # a delayed release: no latency
    one.dead_letter("jobs")
    counters = stats.read(fake_redis, KEYS, top=1)
    assert counters.copies == {"news": 9.0}  # the top 1 only
    assert counters.fanouts == {"news": 3.0}
    assert counters.totals == {"copies": 10.0, "fanouts": 4.0, "dead_letters": 1.0}
    assert counters.dead_letters == {"jobs": 1.0}
    cumulative = dict(counters.buckets)
    assert (cumulative["0.001"], cumulative["0.0025"], cumulative["0.25"]) == (0, 1, 2)
    assert counters.latency_count == 2 and counters.latency_sum == pytest.approx(0.202)


def test_buffered_counts_are_summed_and_written_at_flush(fake_redis, monkeypatch):
    counts = stats.Stats(fake_redis, KEYS, buffered=True)
    for _ in range(3):
        counts.fanout("news", 1, 2, 0.003)
    assert fake_redis.keys("*") == []  # nothing before the flush
    counts.flush()
    read = stats.read(fake_redis, KEYS, top=5)
    assert (read.copies, read.fanouts, read.latency_count) == ({"news": 6.0}, {"news": 3.0}, 3)
    counts.fanout("news", 1, 2)
    working = fake_redis.pipeline
    monkeypatch.setattr(fake_redis, "pipeline", lambda **kw: (_ for _ in ()).throw(
        stats.redis.ConnectionError("down")))
    counts.flush()  # logged, never raised; the counts wait
    counts.fanout("news", 1, 2)
    counts.flush()
    assert counts.lost == 0
    monkeypatch.setattr(fake_redis, "pipeline", working)
    counts.flush()
    assert stats.read(fake_redis, KEYS, top=5).copies == {"news": 10.0}
    monkeypatch.setattr(stats, "MAX_PENDING", 1)
    monkeypatch.setattr(fake_redis, "pipeline", lambda **kw: (_ for _ in ()).throw(
        stats.redis.ConnectionError("down")))
    counts.fanout("news", 1, 2)
    counts.fanout("news", 1, 2)
    counts.flush()
    assert counts.lost == 1  # beyond MAX_PENDING the oldest go, counted


def test_the_flusher_writes_what_is_left_when_stopped(fake_redis):
    from gearhorn.store.ledger import Flusher

    counts = stats.Stats(fake_redis, KEYS, buffered=True)
    flusher = Flusher(counts, interval=60)
    flusher.start()
    counts.fanout("news", 1, 4)
    flusher.stop()
    assert stats.read(fake_redis, KEYS, top=5).copies == {"news": 4.0}


def test_disabled_stats_write_nothing(fake_redis):
    stats.Stats(fake_redis, KEYS, enabled=False).fanout("news", 1, 3, 0.1)
    assert fake_redis.keys("*") == []


def snapshot(collector):
    snap = collector.collect()
    snap["gearmand"] = [{"server": "127.0.0.1:4730", "up": False, "error": "refused"}]
    return snap


def test_the_snapshot_lists_top_topics_then_subscribed_ones(fake_redis, registry):
    registry.redis = fake_redis
    for topic, who in (("news", "a"), ("news", "b"), ("quiet", "a"), ("news.*", "c")):
        registry.subscribe(Subscription(topic, who))
    stats.Stats(fake_redis, registry.keys).fanout("news", 1, 2, 0.01)
    snap = Collector(registry, servers=(), top=10).collect()
    topics = {t["topic"]: (t["subscribers"], t["copies"]) for t in snap["topics"]}
    assert topics == {"news": (2, 2.0), "quiet": (1, 0.0), "news.*": (1, 0.0)}
    assert next(iter(topics)) == "news"  # by copies first
    assert (snap["topic_count"], snap["pattern_count"]) == (2, 1)
    assert Collector(registry, servers=(), top=1).collect()["topics"] == [
        {"topic": "news", "subscribers": 2, "copies": 2.0, "fanouts": 1.0}]


def test_metrics_are_written_by_prometheus_client_and_parse_back(fake_redis):
    stats.Stats(fake_redis, KEYS).fanout("news", 1, 3, 0.004)
    collector = Collector(Registry(fake_redis, KEYS), servers=(), top=10)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: snapshot(collector)))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(generate_latest(registry).decode())
               for s in f.samples}
    assert samples[("gearhorn_copies_total", (("topic", "news"),))] == 3
    assert samples[("gearhorn_fanout_latency_seconds_bucket", (("le", "0.005"),))] == 1
    assert samples[("gearhorn_fanout_latency_seconds_bucket", (("le", "0.0025"),))] == 0
    assert samples[("gearhorn_fanout_latency_seconds_count", ())] == 1
    assert samples[("gearhorn_gearmand_up", (("server", "127.0.0.1:4730"),))] == 0
    assert samples[("gearhorn_workers", ())] == 0


def test_without_redis_the_scrape_says_so_and_still_answers(fake_redis):
    fake_redis.connection_pool.connection_kwargs["server"].connected = False
    snap = Collector(Registry(fake_redis, KEYS), servers=(), top=10).collect()
    assert snap["redis"]["up"] is False
    names = {f.name for f in SnapshotCollector(lambda: snap).collect()}
    assert "gearhorn_redis_up" in names and "gearhorn_copies" not in names


def test_readiness_gives_reasons(fake_redis):
    ready = Collector(Registry(fake_redis, KEYS), servers=()).readiness()
    assert ready == {"ready": False, "reasons": ["no live worker"], "workers": 0}


def test_rates_come_from_consecutive_samples_and_survive_a_reset():
    history = RateHistory(window_seconds=10)
    for at, count in ((0, 0), (1, 5), (3, 9), (4, 2)):  # Redis emptied before t=4
        history.add(at, {"news": count})
    assert history.rates("news") == [(1, 5.0), (3, 2.0), (4, 2.0)]
    history.add(20, {"news": 2})
    assert history.rates("news") == []  # older samples left the window
    assert history.all_rates(["news", "other"]) == {"news": [], "other": []}


def basic(login, passcode):
    return "Basic " + base64.b64encode(f"{login}:{passcode}".encode()).decode()


def credentials(anonymous=""):
    return auth.parse(f"""
[user boss]
passcode = {auth.hash_passcode("pw", iterations=1000)}
admin = yes
[user viewer]
passcode = {auth.hash_passcode("pw", iterations=1000)}
{anonymous}""")


def test_basic_logins_map_to_the_bridge_users():
    users = credentials()
    assert access.principal(users, basic("boss", "pw")).admin is True
    assert access.principal(users, basic("viewer", "pw")).admin is False
    assert access.principal(users, basic("viewer", "nope")) is None
    assert access.principal(users, None) is None  # no [anonymous] section
    assert access.principal(users, "Basic !!!") is None
    assert access.principal(users, "Bearer abc") is None
    assert access.principal(users, "Basic " + base64.b64encode(b"no-colon").decode()) is None
    assert access.principal(credentials("[anonymous]\nread = *"), None).name == "anonymous"
    assert access.principal(auth.Credentials.open(), None).admin is True  # an open bridge


def test_admin_must_be_a_boolean():
    with pytest.raises(auth.CredentialsError, match="admin must be true or false"):
        auth.parse("[anonymous]\nadmin = sometimes\n")


def test_the_grafana_dashboard_and_alerts_use_only_metrics_that_exist(fake_redis):
    """etc/grafana-gearhorn.json and etc/prometheus.yml name real series."""
    import json
    import os
    import re

    stats.Stats(fake_redis, KEYS).fanout("news", 1, 3, 0.01)
    stats.Stats(fake_redis, KEYS).dead_letter("jobs")
    stats.Stats(fake_redis, KEYS).dropped("news", "maxlen", 2)
    fake_redis.set(KEYS.backlogs, json.dumps({"at": 1.0, "queues": [
        {"queue": "news_a", "topic": "news", "client_id": "a", "depth": 3, "bytes": 30,
         "oldest_age": 5.0, "consumers": 0, "limits": "max_length=100 drop-head"}]}))
    fake_redis.hset(KEYS.store, mapping={"used": 10, "max": 100, "guard": 90, "over": ""})
    fake_redis.sadd(KEYS.topics, "news")
    fake_redis.sadd(KEYS.topic("news"), "a")
    fake_redis.set(KEYS.audit, json.dumps(AUDIT_VERDICT))
    collector = Collector(Registry(fake_redis, KEYS), servers=(), top=10)

    def with_a_queue():
        snap = snapshot(collector)
        snap["queues"] = [{"queue": "news_a", "queued": 3, "running": 0, "workers": 0}]
        return snap
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(with_a_queue))
    exposed = {s.name for f in text_string_to_metric_families(generate_latest(registry).decode())
               for s in f.samples}
    root = os.path.join(os.path.dirname(__file__), "..", "..", "etc")
    with open(os.path.join(root, "grafana-gearhorn.json")) as fp:
        exprs = [t["expr"] for p in json.load(fp)["panels"] for t in p["targets"]]
    for rules in ("prometheus.yml", "gearhorn-alerts.yml"):
        with open(os.path.join(root, rules)) as fp:
            exprs.append(fp.read())
    used = {name for expr in exprs for name in re.findall(r"gearhorn_[a-z_]+", expr)}
    assert len(used) >= 20
    assert used - exposed == set()


AUDIT_VERDICT = {"updated_ms": 1_000_000, "settled": 40, "lag": {"p50_s": 1.5, "p99_s": 4.0},
                 "totals": {"never_delivered": 1, "overdue": 2, "duplicate": 0},
                 "topics": {"news": {"never_delivered": 1, "overdue": 2}},
                 "line": "audit: FINDINGS", "recent": []}


def test_the_live_audits_verdict_is_served_as_metrics(fake_redis):
    import json

    fake_redis.set(KEYS.audit, json.dumps(AUDIT_VERDICT))
    collector = Collector(Registry(fake_redis, KEYS), servers=(), top=10)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: {**snapshot(collector), "at": 1_010.0}))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(generate_latest(registry).decode())
               for s in f.samples}
    assert samples[("gearhorn_audit_copies_lost_total", (("topic", "news"),))] == 1
    assert samples[("gearhorn_audit_copies_overdue_total", (("topic", "news"),))] == 2
    assert samples[("gearhorn_audit_all_copies_lost_total", ())] == 1
    assert samples[("gearhorn_audit_all_copies_duplicated_total", ())] == 0
    assert samples[("gearhorn_audit_copies_settled_total", ())] == 40
    assert samples[("gearhorn_audit_lag_seconds", (("quantile", "0.99"),))] == 4.0
    assert samples[("gearhorn_audit_age_seconds", ())] == 10.0
    fake_redis.delete(KEYS.audit)  # not running: no audit series at all
    assert not [f for f in SnapshotCollector(lambda: snapshot(collector)).collect()
                if f.name.startswith("gearhorn_audit")]


def test_readyz_and_status_say_when_the_queue_store_is_over_its_guard(fake_redis):
    from gearhorn.cli.status import render

    collector = Collector(Registry(fake_redis, KEYS), servers=(), top=10)
    fake_redis.hset(KEYS.store, mapping={"used": 95, "max": 100, "guard": 90, "over": ""})
    assert "queue store full" not in " ".join(collector.readiness()["reasons"])
    over = "queue store full: 95 MiB of 100 MiB used; largest backlogs: news_a (3 copies)"
    fake_redis.hset(KEYS.store, "over", over)
    ready = collector.readiness()
    assert not ready["ready"] and over in ready["reasons"]
    fake_redis.set(KEYS.backlogs, json.dumps({"at": 1.0, "queues": [
        {"queue": "news_a", "topic": "news", "client_id": "a", "depth": 3, "bytes": 30,
         "oldest_age": 61.0, "consumers": 0, "limits": "max_length=100 drop-head"}]}))
    text = render(collector.collect())
    assert f"REFUSING FANOUTS: {over}" in text
    assert "! news_a" in text and "61s" in text and "max_length=100 drop-head" in text


def test_status_renders_the_consoles_snapshot(fake_redis):
    from gearhorn.cli.status import render

    fake_redis.sadd(KEYS.topics, "news")
    fake_redis.sadd(KEYS.topic("news"), "alice", "bob")
    snap = Collector(Registry(fake_redis, KEYS), servers=(), top=10).collect()
    snap["redis"]["url"] = "redis://here"
    snap["gearmand"] = [
        {"server": "a:1", "up": True, "functions": [
            {"queue": "news_alice", "queued": 3, "running": 0, "workers": 1}]},
        {"server": "b:2", "up": False, "error": "refused"}]
    snap["queues"] = [{"queue": "news_alice", "queued": 3, "running": 0, "workers": 1}]
    lines = render(snap).splitlines()
    assert lines[0] == "redis redis://here"
    assert any(line.split() == ["news", "2", "subscribers"] for line in lines)
    assert "queues over all 2 gearmand:" in lines
    assert lines[-2:] == ["gearmand b:2:", "  unreachable: refused"]
    assert sum(line.split()[:2] == ["news_alice", "3"] for line in lines) == 2


def test_status_names_the_audits_findings_by_topic_and_by_message(fake_redis):
    from gearhorn.cli.status import render

    found = {"kind": "never_delivered", "topic": "news", "subscriber": "news_a",
             "message_id": "m7", "unique": "m7:a", "enqueued_ts": 1, "found_ms": 2,
             "detail": "not delivered within 30 s while copies enqueued after it were"}
    fake_redis.set(KEYS.audit, json.dumps({**AUDIT_VERDICT, "recent": [found]}))
    text = render(Collector(Registry(fake_redis, KEYS), servers=(), top=10).collect())
    assert "audit: FINDINGS" in text
    assert "news                                     never_delivered 1, overdue 2" in text
    assert ("never_delivered: message m7 for news_a (topic news): not delivered within "
            "30 s") in text
