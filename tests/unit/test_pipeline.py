"""Each transform on small hand-made DataFrames with known answers."""

import os

import pytest

from tests.needs import IN_CI

try:
    from gearhorn.pipeline import transforms as T
except ImportError:  # pragma: no cover - tools/run-tests installs pyspark
    if IN_CI:
        raise
    pytest.skip("pyspark is not installed", allow_module_level=True)

pytestmark = pytest.mark.timeout(300)

H = 3_600_000  # one hour in ms


def ev(event, ts, message_id=None, topic=None, subscriber=None, unique=None, count=None,
       reason=None, redelivered=False, handle=None):
    return (event, ts, message_id, topic, subscriber, unique, count, reason, redelivered,
            "test", None, None, None, handle)  # keys: filled in by T.with_keys (old exports)


def published(mid, topic, ts, subs):
    rows = [ev("published", ts, mid, topic, count=len(subs))]
    rows += [ev("enqueued", ts, mid, topic, f"{topic}_{s}", f"{mid}:{s}") for s in subs]
    return rows


def frame(spark, rows):
    return spark.createDataFrame(rows, T.EVENT_SCHEMA)


def good_ledger():
    """m1 to a and b, both delivered and acked; m2 to a only, one hour later."""
    rows = [ev("attached", 0, subscriber="news_a"), ev("attached", 0, subscriber="news_b")]
    rows += published("m1", "news", 1000, ["a", "b"])
    rows += published("m2", "news", H + 1000, ["a"])
    rows += published("w1", "weather", 2000, ["a", "b", "c"])
    for mid, sub, delay in (("m1", "a", 10), ("m1", "b", 30), ("m2", "a", 50)):
        base = 1000 if mid == "m1" else H + 1000
        rows.append(ev("delivered", base + delay, subscriber=f"news_{sub}", unique=f"{mid}:{sub}"))
        rows.append(ev("acked", base + delay + 5, subscriber=f"news_{sub}",
                       unique=f"{mid}:{sub}"))
    return rows


def test_volume_per_topic_and_hour(spark):
    out = {(r.topic, r.hour.hour, r.messages, r.copies)
           for r in T.volume_per_topic_hour(frame(spark, good_ledger())).collect()}
    assert out == {("news", 0, 1, 2), ("news", 1, 1, 1), ("weather", 0, 1, 3)}


def test_fanout_width_distribution(spark):
    out = [(r.width, r.messages) for r in T.fanout_width(frame(spark, good_ledger())).collect()]
    assert out == [(1, 1), (2, 1), (3, 1)]


def test_latency_percentiles_per_topic(spark):
    events = T.with_keys(frame(spark, good_ledger()))
    latency = T.latency_per_topic(T.copies(events), events).collect()
    assert [r.topic for r in latency] == ["news", "weather"]
    (news,) = [r for r in latency if r.topic == "news"]
    assert (news.delivered, news.acked) == (3, 3)
    assert news.delivery_p50_ms == 30 and news.delivery_p99_ms == 50
    assert news.ack_p50_ms == 35


def reconcile(events):
    from gearhorn.pipeline.job import reconcile as job_reconcile

    return job_reconcile(events)


def test_reconciliation_is_empty_when_nothing_was_lost(spark):
    events = frame(spark, good_ledger())
    assert reconcile(T.with_keys(events)).collect() == []


def test_reconciliation_finds_a_missing_a_duplicate_and_a_width_mismatch(spark):
    rows = good_ledger()
    rows += published("m3", "news", 5000, ["a", "b"])  # b never gets m3: missing
    rows.append(ev("delivered", 5010, subscriber="news_a", unique="m3:a"))
    rows.append(ev("delivered", 5020, subscriber="news_a", unique="m3:a"))  # duplicate
    rows.append(ev("delivered", 5030, subscriber="news_a", unique="m3:a",
                   redelivered=True))  # flagged: expected, not a duplicate
    rows.append(ev("published", 6000, "m4", "news", count=3))  # says 3 ...
    rows += [ev("enqueued", 6000, "m4", "news", "news_a", "m4:a"),
             ev("delivered", 6001, subscriber="news_a", unique="m4:a")]  # ... but 1 copy
    events = frame(spark, rows)
    found = sorted((r.kind, r.message_id, r.subscriber) for r in
                   reconcile(T.with_keys(events)).collect())
    assert found == [("duplicate", "m3", "news_a"), ("never_delivered", "m3", "news_b"),
                     ("width_mismatch", "m4", None)]


def test_a_fanout_that_ran_again_is_no_width_mismatch_but_a_lost_copy_is(spark):
    rows = good_ledger()
    rows += published("m5", "news", 7000, ["a", "b"])
    rows += published("m5", "news", 7100, ["a", "b"])  # its worker died: it ran again
    rows += published("m6", "news", 7200, ["a", "b"])
    rows += published("m6", "news", 7300, ["a"])  # ran again: 3 rows, 2 copies
    rows.append(ev("published", 7400, "m7", "news", count=2))  # no copy at all
    rows += [ev("delivered", 8000 + i, subscriber=f"news_{s}", unique=f"{m}:{s}")
             for i, (m, s) in enumerate([("m5", "a"), ("m5", "b"), ("m6", "a"), ("m6", "b")])]
    events = T.with_keys(frame(spark, rows))
    found = sorted((r.kind, r.message_id, r.detail) for r in reconcile(events).collect())
    assert found == [("width_mismatch", "m7", "published to 2 subscribers, 0 copies enqueued")]
    suspects = {r.message_key for r in T.width_suspects(events).collect()}
    assert len(suspects) == 3  # m5, m6 and m7: counted again by copy key


def planted_problems():
    rows = good_ledger()
    rows += published("m3", "news", 5000, ["a", "b"])  # b never gets m3
    rows += [ev("delivered", 5010 + i, subscriber="news_a", unique="m3:a") for i in range(2)]
    rows += published("m4", "news", 6000, ["a"])
    rows[-2] = ev("published", 6000, "m4", "news", count=3)  # says 3, makes 1
    rows.append(ev("delivered", 6001, subscriber="news_a", unique="m4:a"))
    return rows


EXPECTED = [("duplicate", "m3", "news", "news_a", "m3:a", "delivered 2 times"),
            ("never_delivered", "m3", "news", "news_b", "m3:b", "enqueued, no delivery recorded"),
            ("width_mismatch", "m4", "news", None, None,
             "published to 3 subscribers, 1 copies enqueued")]


@pytest.mark.parametrize("broadcast", [True, False])
def test_problem_names_are_the_same_broadcast_or_shuffled(spark, broadcast):
    events = T.with_keys(frame(spark, planted_problems()))
    table = T.name_problems(events, T.copy_problems(events), T.width_problems(events),
                            broadcast=broadcast)
    assert sorted(tuple(r) for r in table.collect()) == EXPECTED


def test_the_jobs_reconcile_finds_the_planted_problems(spark):
    from gearhorn.pipeline.job import reconcile

    table = reconcile(T.with_keys(frame(spark, planted_problems())))
    assert sorted(tuple(r) for r in table.collect()) == EXPECTED


def test_exported_keys_are_sparks_xxhash64(spark):
    """Rows exported with keys and rows without (older exports, hand-written
    JSON Lines) must group together: both keys are the same function."""
    from gearhorn.rules.events import copy_key, message_key

    pairs = [("news_a", "m1:a"), ("t\u00e9st_b", "@" + "f" * 32 + ":b"), ("x_y", "u" * 200)]
    rows = [ev("enqueued", 1, f"m{i}", "t", sub, unique) for i, (sub, unique) in enumerate(pairs)]
    keyed = T.with_keys(frame(spark, rows)).collect()
    assert [(r.copy_key, r.message_key) for r in keyed] == [
        (copy_key(r.subscriber, r.unique), message_key(r.message_id)) for r in keyed]
    assert copy_key("news_a", None) is None and message_key(None) is None


def test_a_copy_with_an_exported_key_meets_its_delivery_without_one(spark):
    from gearhorn.rules.events import copy_key, message_key

    enqueued = list(ev("enqueued", 1, "m1", "news", "news_a", "m1:a"))
    enqueued[-3:-1] = [copy_key("news_a", "m1:a"), message_key("m1")]
    published_row = list(ev("published", 1, "m1", "news", count=1))
    published_row[-2] = message_key("m1")
    rows = [tuple(published_row), tuple(enqueued),
            ev("delivered", 5, subscriber="news_a", unique="m1:a")]
    assert reconcile(T.with_keys(frame(spark, rows))).collect() == []


def test_untracked_subscribers_are_not_reported_as_losses(spark):
    rows = published("g1", "jobs", 1000, ["gearmanworker"])  # a plain Gearman consumer
    events = T.with_keys(frame(spark, rows))
    assert reconcile(T.with_keys(events)).collect() == []
    (sub,) = T.subscriber_backlog(T.copies(events), events, 10_000, 1000).collect()
    assert (sub.tracked, sub.backlog, sub.stale) == (False, 1, False)


def test_backlog_and_stale_subscribers(spark):
    rows = good_ledger() + published("m5", "news", 10_000, ["a", "b"])
    rows.append(ev("delivered", 10_010, subscriber="news_a", unique="m5:a"))
    rows.append(ev("acked", 10_020, subscriber="news_a", unique="m5:a"))
    events = T.with_keys(frame(spark, rows))
    now = 10_000 + 60_000
    subs = {r.subscriber: r for r in
            T.subscriber_backlog(T.copies(events), events, now, stale_after_ms=30_000).collect()}
    assert (subs["news_a"].backlog, subs["news_a"].stale) == (0, False)
    assert (subs["news_b"].enqueued, subs["news_b"].acked, subs["news_b"].backlog) == (2, 1, 1)
    assert subs["news_b"].stale  # m5 waits and b's last ack was long ago
    assert not subs["weather_c"].tracked


def test_failures_are_counted_by_reason(spark):
    events = frame(spark, [ev("failed", 1, reason="fanout: job is not JSON"),
                           ev("failed", 2, reason="fanout: job is not JSON"),
                           ev("failed", 3, reason="timeout: no answer", topic="news")])
    out = [(r.reason, r.failures) for r in T.failures(events).collect()]
    assert out[0] == ("fanout: job is not JSON", 2)


def test_job_counts_malformed_rows_and_writes_the_report(spark, tmp_path):
    from gearhorn.pipeline.job import Options, load_events, run

    ledger = tmp_path / "ledger" / "date=1970-01-01"
    ledger.mkdir(parents=True)
    import json

    good = [dict(zip(T.EVENT_SCHEMA.names, row, strict=True)) for row in good_ledger()]
    lines = [json.dumps(row) for row in good]
    lines += ["{not json", '{"event": "bogus", "ts": 1}', '{"event": "acked"}']
    (ledger / "part-1.jsonl").write_text("\n".join(lines) + "\n")
    options = Options(str(tmp_path / "ledger"), str(tmp_path / "out"), quiet=True)
    events, malformed = load_events(spark, options)
    assert (events.count(), malformed) == (len(good), 3)
    summary = run(options)
    assert summary["reconciliation"] == {} and summary["malformed"] == 3
    # weather's subscribers are plain Gearman consumers: without a snapshot of
    # gearmand their copies cannot be checked, and the report does not call
    # that clean.
    weather = {"weather_a": 1, "weather_b": 1, "weather_c": 1}
    assert summary["unaccounted"] == weather
    assert "3 copies of 3 untracked Gearman subscribers are unaccounted" in \
        (tmp_path / "out" / "report.html").read_text()
    from gearhorn.store.ledgerexport import write_queue_snapshot

    write_queue_snapshot(str(tmp_path / "ledger"), weather)  # all still queued
    summary = run(options)
    assert summary["unaccounted"] == {}
    assert "Nothing lost" in (tmp_path / "out" / "report.html").read_text()
    assert os.path.exists(tmp_path / "out" / "volume.png")
    recon = spark.read.parquet(str(tmp_path / "out" / "tables" / "reconciliation"))
    assert recon.count() == 0


def test_a_ledger_of_old_and_new_exports_reconciles_as_one(spark, tmp_path):
    """An export older than the key columns and a new one, in one folder: the
    job computes the missing keys, so a copy enqueued in one and delivered in
    the other is matched."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gearhorn.pipeline.job import Options, load_events, reconcile, split_by_keys
    from gearhorn.store.ledgerentries import rows_from_entries
    from gearhorn.store.ledgerexport import _write_parquet

    day = tmp_path / "ledger" / "date=2026-11-22"
    day.mkdir(parents=True)
    from gearhorn.rules.events import FIELDS

    # The columns an export had before the keys, typed as the export typed them.
    types = {"string": pa.string(), "int64": pa.int64(), "bool": pa.bool_()}
    before_keys = pa.schema([(name, types[kind]) for name, kind in FIELDS[:11]])
    old = [dict(zip(before_keys.names, row[:11], strict=True))
           for row in published("m1", "news", 1000, ["a", "b"])]
    pq.write_table(pa.Table.from_pylist(old, schema=before_keys), day / "part-old.parquet")
    entries = [("2-0", {"e": "batch", "events": "attached\t1\tnews_a\n"
                        "delivered\t2000\tnews_a\tm1:a\t\nattached\t1\tnews_b"})]
    _write_parquet(str(day / "part-new.parquet"), list(rows_from_entries(entries)))
    keyed, unkeyed = split_by_keys(sorted(str(p) for p in day.iterdir()))
    assert [p.split("/")[-1] for p in keyed + unkeyed] == ["part-new.parquet",
                                                          "part-old.parquet"]
    events, malformed = load_events(spark, Options(str(tmp_path / "ledger"), ""))
    found = [(r.kind, r.subscriber) for r in reconcile(events).collect()]
    assert (found, malformed) == ([("never_delivered", "news_b")], 0)


def snapshot(spark, queued):
    return spark.createDataFrame(list(queued.items()), "subscriber string, queued long")


def untracked_rows(spark, rows, queued):
    events = T.with_keys(frame(spark, rows))
    table = T.untracked(T.copies(events), events,
                        None if queued is None else snapshot(spark, queued))
    return [tuple(r) for r in table.collect()]


def test_an_untracked_subscriber_is_checked_against_what_gearmand_still_holds(spark):
    rows = (published("g1", "jobs", 1000, ["worker", "other"])
            + published("g2", "jobs", 2000, ["worker", "other"]))
    # Both copies of "worker" still queued: accounted; "other" had one taken
    # by a consumer that records nothing (or lost): unaccounted.
    assert untracked_rows(spark, rows, {"jobs_worker": 2, "jobs_other": 1}) == [
        ("jobs_other", 2, 0, 1, 1), ("jobs_worker", 2, 0, 2, 0)]
    # Copies that came after the export are no negative count.
    assert untracked_rows(spark, rows, {"jobs_worker": 5, "jobs_other": 2}) == [
        ("jobs_other", 2, 0, 2, 0), ("jobs_worker", 2, 0, 5, 0)]
    # Without a snapshot, nothing can be checked: every copy is unaccounted.
    assert untracked_rows(spark, rows, None) == [("jobs_other", 2, 0, None, 2),
                                                 ("jobs_worker", 2, 0, None, 2)]


def test_a_tracked_subscriber_is_not_in_the_untracked_table(spark):
    assert untracked_rows(spark, good_ledger(), {"weather_a": 1}) == [
        ("weather_b", 1, 0, 0, 1), ("weather_c", 1, 0, 0, 1), ("weather_a", 1, 0, 1, 0)]


def test_a_copy_resolved_but_never_made_is_a_width_mismatch(spark):
    rows = published("m9", "news", 1000, ["a"])
    rows[0] = ev("published", 1000, "m9", "news", count=2)  # two resolved, one copy made
    found = [(r.kind, r.message_id) for r in reconcile(T.with_keys(frame(spark, rows))).collect()]
    assert ("width_mismatch", "m9") in found


def delivered(subscriber, unique, ts):
    return ev("delivered", ts, subscriber=subscriber, unique=unique)


def test_policy_drops_are_not_losses_and_a_real_loss_beside_them_is_still_found(spark):
    """A STOMP subscriber (tracked) whose queue dropped m1 (maxlen) and
    expired m2, and never got m3: only m3 is a problem. A reject-publish
    subscriber that got no copy of m4 (full) is no width mismatch."""
    rows = []
    for i in (1, 2, 3, 4):
        rows += published(f"m{i}", "news", 1000 + i, ["stomp"])
    # m4 resolved two subscribers; "full" got no copy, by reject-publish.
    rows[6] = ev("published", 1004, "m4", "news", count=2)
    rows += [delivered("news_stomp", "m4:stomp", 2000),
             ev("dropped", 3001, None, "news", "news_stomp", "m1:stomp", reason="maxlen"),
             ev("dropped", 3002, None, "news", "news_stomp", "m2:stomp", reason="expired"),
             ev("dropped", 1004, "m4", "news", "news_full", "m4:full", reason="full")]
    events = T.with_keys(frame(spark, rows))
    found = sorted((r.kind, r.message_id, r.subscriber) for r in reconcile(events).collect())
    assert found == [("never_delivered", "m3", "news_stomp")]
    policy = sorted(tuple(r) for r in T.policy_drops(events).collect())
    assert policy == [("news", "expired", 1), ("news", "full", 1), ("news", "maxlen", 1)]


def test_policy_drops_of_an_untracked_subscriber_are_accounted(spark):
    rows = published("g1", "jobs", 1000, ["w"]) + published("g2", "jobs", 2000, ["w"])
    rows.append(ev("dropped", 3000, None, "jobs", "jobs_w", "g1:w", reason="maxlen"))
    # One dropped, one still queued: nothing unaccounted; without the drop row
    # the dropped copy would be unaccounted.
    assert untracked_rows(spark, rows, {"jobs_w": 1}) == [("jobs_w", 2, 1, 1, 0)]
    assert untracked_rows(spark, rows[:-1], {"jobs_w": 1}) == [("jobs_w", 2, 0, 1, 1)]


def streamed(subscriber, *spans):
    return [ev("streamed", 5000 + i, subscriber=subscriber, unique=span)
            for i, span in enumerate(spans)]


def test_stream_subscriptions_reconcile_by_their_runs_of_offsets(spark):
    """Runs in any order and across a declared gap are clean; a skipped
    offset and one given twice are found, with the subscriber's topic."""
    from gearhorn.pipeline.job import reconcile

    rows = good_ledger()
    rows += streamed("news_+a", "e1:5-9", "e1:1-4", "e1:10-10", "e1:20-30:unrecovered",
                     "e2:1-3")  # a new epoch starts again from 1
    rows += streamed("news_+b", "e1:1-4", "e1:6-9", "e1:8-12")  # 5 skipped, 8-9 twice
    rows += streamed("chat.x_+c", "e1:1-1", "bogus")  # a bad run is not read
    problems = reconcile(T.with_keys(frame(spark, rows))).collect()
    found = sorted((r.kind, r.topic, r.subscriber, r.unique, r.detail) for r in problems)
    assert found == [
        ("stream_duplicate", "news", "news_+b", "e1:8-12", "offsets 8-9 given again"),
        ("stream_gap", "news", "news_+b", "e1:6-9", "offsets 5-5 never given"),
    ]


def test_a_held_copys_answer_tracks_a_plain_gearman_subscriber_and_counts_as_delivered(spark):
    """copies = held: the answer a plain Gearman consumer gave a copy is in
    the ledger, so its subscriber is tracked: an answered copy reconciles,
    one never answered is reported, and the bridge's own delivery of a copy
    it also answered is no duplicate."""
    rows = published("h1", "jobs", 1000, ["worker", "php", "stomp"])
    rows += [ev("answered", 1010, subscriber="jobs_worker", unique="h1:worker",
                reason="complete"),
             ev("delivered", 1011, subscriber="jobs_stomp", unique="h1:stomp"),
             ev("answered", 1012, subscriber="jobs_stomp", unique="h1:stomp",
                reason="complete")]
    rows += published("h2", "jobs", 2000, ["worker", "php"])
    rows += [ev("answered", 2010, subscriber="jobs_worker", unique="h2:worker",
                reason="failed"),  # taken, and its receiver failed: delivered, not acked
             ev("answered", 2011, subscriber="jobs_worker", unique="h2:worker",
                reason="complete"),  # handed again after a crash: at least once
             ev("answered", 2020, subscriber="jobs_php", unique="h2:php", reason="complete")]
    events = T.with_keys(frame(spark, rows))
    found = sorted((r.kind, r.message_id, r.subscriber) for r in reconcile(events).collect())
    assert found == [("never_delivered", "h1", "jobs_php")]
    subs = {r.subscriber: r for r in T.subscriber_backlog(T.copies(events), events, 10_000,
                                                          60_000).collect()}
    assert all(subs[s].tracked for s in ("jobs_worker", "jobs_php", "jobs_stomp"))
    assert (subs["jobs_worker"].acked, subs["jobs_worker"].backlog) == (2, 0)
    assert (subs["jobs_php"].acked, subs["jobs_php"].backlog) == (1, 1)


def test_a_held_copy_completed_in_two_runs_is_a_duplicate(spark):
    """A copy handed again after its holder was taken for dead, and
    completed by its receiver both times, is a duplicate: in two
    generations, or in one under two of gearmand's job handles (made again
    at a taker's attach, just after it was answered). Two holders that heard
    the one job of one generation end (a taker attached to it) are not, nor
    is a failed try before a complete one."""
    rows = published("d1", "jobs", 1000, ["worker", "php", "pause", "again"])
    rows += [ev("answered", 1010, subscriber="jobs_worker", unique="d1:worker",
                reason="complete", count=0),
             ev("answered", 1900, subscriber="jobs_worker", unique="d1:worker",
                reason="complete", count=1),  # handed again: run twice
             ev("answered", 1020, subscriber="jobs_php", unique="d1:php", reason="failed",
                count=0),
             ev("answered", 1030, subscriber="jobs_php", unique="d1:php", reason="complete",
                count=1),
             ev("answered", 1040, subscriber="jobs_pause", unique="d1:pause",
                reason="complete", count=2, handle="H:g:7"),
             ev("answered", 1041, subscriber="jobs_pause", unique="d1:pause",
                reason="complete", count=2, handle="H:g:7"),  # the paused holder and its taker
             ev("answered", 1050, subscriber="jobs_again", unique="d1:again",
                reason="complete", count=0, handle="H:g:8"),
             ev("answered", 1090, subscriber="jobs_again", unique="d1:again",
                reason="complete", count=0, handle="H:g:12")]  # made again: run twice
    events = T.with_keys(frame(spark, rows))
    found = sorted((r.kind, r.message_id, r.subscriber, r.detail)
                   for r in reconcile(events).collect())
    twice = ("completed by its receiver twice, handed again after its holder was taken for "
             "dead (two generations, or two jobs)")
    assert found == [("duplicate", "d1", "jobs_again", twice),
                     ("duplicate", "d1", "jobs_worker", twice)]
