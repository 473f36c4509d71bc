"""The live audit's transforms on hand-made ledgers (gearhorn/pipeline/live.py),
and its streaming query with its judge over a folder of files, across a restart."""

import os
import time

import pytest

from tests.needs import IN_CI

try:
    from gearhorn.pipeline import audit, live, verdicts
    from gearhorn.pipeline import transforms as T
except ImportError:  # pragma: no cover - tools/run-tests installs pyspark
    if IN_CI:
        raise
    pytest.skip("pyspark is not installed", allow_module_level=True)

from gearhorn.rules.events import FIELDS, copy_key
from gearhorn.store import ledgerexport

pytestmark = pytest.mark.timeout(300)

S = 1000
BASE = 1_800_000_000_000  # ms
DEADLINE, LATENESS = 3 * S, 1 * S


def ev(event, ts, subscriber=None, unique=None, message_id=None, redelivered=False,
       stream_id=None):
    row = dict.fromkeys((name for name, _ in FIELDS), None)
    row.update(event=event, ts=ts, subscriber=subscriber, unique=unique, topic="news",
               message_id=message_id, redelivered=redelivered, source="test",
               stream_id=stream_id or f"{ts}-0", copy_key=copy_key(subscriber, unique))
    return row


def enqueued(name, ts, subscriber="news_a"):
    return ev("enqueued", ts, subscriber, f"{name}:x", name)


def settled(event, name, ts, subscriber="news_a", redelivered=False, seq=0):
    return ev(event, ts, subscriber, f"{name}:x", redelivered=redelivered,
              stream_id=f"{ts}-{seq}")


def outcomes(spark, rows, transform):
    frame = spark.createDataFrame([tuple(r[n] for n, _ in FIELDS) for r in rows], T.EVENT_SCHEMA)
    result = transform(live.with_event_time(frame, LATENESS))
    return sorted((r.outcome, r.unique, r.first) for r in result.collect())


def test_each_copy_is_settled_within_the_deadline_or_not(spark):
    rows = [enqueued("delivered", BASE), settled("delivered", "delivered", BASE + S),
            enqueued("answered", BASE), settled("answered", "answered", BASE + 2 * S),
            enqueued("dropped", BASE), settled("dropped", "dropped", BASE + S),
            enqueued("late", BASE), settled("delivered", "late", BASE + DEADLINE + 1),
            enqueued("never", BASE),
            settled("delivered", "early", BASE - 500), enqueued("early", BASE)]
    assert outcomes(spark, rows, lambda f: live.copy_outcomes(f, DEADLINE, LATENESS)) == [
        ("settled", "answered:x", False), ("settled", "delivered:x", True),
        ("settled", "dropped:x", False), ("settled", "early:x", True),
        ("unsettled", "late:x", None), ("unsettled", "never:x", None)]


def test_two_first_deliveries_of_a_copy_are_a_duplicate_and_a_redelivery_is_not(spark):
    rows = [settled("delivered", "twice", BASE, seq=1), settled("delivered", "twice", BASE + S,
                                                                 seq=2),
            settled("delivered", "again", BASE, seq=1),
            settled("delivered", "again", BASE + S, redelivered=True, seq=2),
            settled("answered", "held", BASE, seq=1), settled("answered", "held", BASE, seq=2),
            settled("delivered", "far", BASE), settled("delivered", "far", BASE + 10 * DEADLINE)]
    assert outcomes(spark, rows, lambda f: live.duplicate_deliveries(f, DEADLINE)) == [
        ("duplicate", "twice:x", True)]


def answer(name, ts, generation, reason="complete", seq=0, handle=None):
    row = settled("answered", name, ts, seq=seq)
    row.update(reason=reason, count=generation, handle=handle)
    return row


def test_a_held_copy_completed_in_two_runs_is_a_duplicate(spark):
    """Two generations, or one generation under two job handles (made again
    at a taker's attach); not one job two holders heard end."""
    rows = [answer("again", BASE, 0, seq=1), answer("again", BASE + S, 1, seq=2),
            answer("tried", BASE, 0, reason="failed", seq=1), answer("tried", BASE + S, 1, seq=2),
            answer("attached", BASE, 3, seq=1, handle="H:g:1"),
            answer("attached", BASE, 3, seq=2, handle="H:g:1"),
            answer("remade", BASE, 0, seq=1, handle="H:g:2"),
            answer("remade", BASE + S, 0, seq=2, handle="H:g:5"),
            settled("delivered", "bridge", BASE, seq=1), answer("bridge", BASE + S, 0, seq=2)]
    assert outcomes(spark, rows, lambda f: live.duplicate_deliveries(f, DEADLINE)) == [
        ("duplicate", "again:x", True), ("duplicate", "remade:x", True)]


def test_stream_runs_and_ticks_pass_through(spark):
    rows = [ev("streamed", BASE, "news_+s", "e:0-4"), ev("tick", BASE + S),
            ev("acked", BASE, "news_a", "m:x")]
    assert outcomes(spark, rows, live.passed_through) == [
        ("streamed", "e:0-4", None), ("tick", None, None)]


def test_the_export_waits_for_a_redis_away_at_the_first_start(tmp_path, monkeypatch,
                                                                fake_redis):
    """Redis refusing the first look at the ledger's ends is waited out; the
    export then starts at those ends and follows the ledger."""
    import threading

    import redis

    from gearhorn.store.keys import Keys

    settings = audit.AuditSettings(str(tmp_path / "audit"), DEADLINE, LATENESS, 0.0)
    calls, stop = [], threading.Event()
    real = ledgerexport.start_at_heads

    def away_once(*args):
        calls.append("start")
        if len(calls) == 1:
            raise redis.ConnectionError("away")
        return real(*args)

    monkeypatch.setattr(ledgerexport, "start_at_heads", away_once)
    monkeypatch.setattr(ledgerexport, "follow", lambda *args, **kwargs: calls.append("follow"))
    audit.follow_ledger(fake_redis, Keys("t:"), settings, stop)
    assert calls == ["start", "start", "follow"]
    assert os.path.exists(os.path.join(settings.inbox, ledgerexport.CHECKPOINT))


# -- the query and its judge, streaming over a folder -------------------------------


class Audit:
    """The audit's query and judge on a folder, as gearhorn audit runs them."""

    def __init__(self, spark, folder):
        self.settings = audit.AuditSettings(str(folder), DEADLINE, LATENESS, 0.5)
        self.spark = spark
        self.found = []

    def start(self):
        state = verdicts.load(self.settings.state, DEADLINE, BASE)
        self.judge = audit.Judge(self.settings, state, lambda _, f: self.found.extend(f))
        self.query = audit.start_query(self.spark, self.settings, self.judge)
        return self

    def write(self, name, rows):
        path = os.path.join(self.settings.inbox, f"{name}.parquet")
        ledgerexport._write_parquet(path + ".tmp", rows)
        os.replace(path + ".tmp", path)

    def until(self, predicate, timeout=120):
        deadline = time.monotonic() + timeout
        while not predicate():
            assert self.query.isActive, self.query.exception()
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.1)

    def ticks_to(self, ts):
        """Ticks until the judge has seen the clock reach ``ts``."""
        ledgerexport.write_tick(self.settings.inbox, ts)
        self.until(lambda: self.judge.state.clock_ms >= ts)

    def stop(self):
        self.query.stop()


def test_the_query_finds_a_loss_once_across_a_restart_and_no_away_copy(spark, tmp_path):
    folder = tmp_path / "audit"
    os.makedirs(folder / "inbox")
    first = Audit(spark, folder).start()
    first.write("a", [enqueued("lost", BASE), enqueued("later", BASE + 100),
                      enqueued("waits", BASE, "news_away"),
                      enqueued("dropped", BASE, "news_b"), ev("tick", BASE)])
    first.write("b", [settled("answered", "later", BASE + 500),
                      settled("dropped", "dropped", BASE + 600, "news_b")])
    first.ticks_to(BASE + DEADLINE + LATENESS + S)
    first.until(lambda: first.found)
    assert [(f.kind, f.message_id, f.subscriber) for f in first.found] == [
        (verdicts.LOST, "lost", "news_a")]
    assert first.judge.state.away == 1  # news_away took nothing: it is away
    first.stop()

    # Started again on the same folder: what was judged is not judged again,
    # and a loss after the restart is found once.
    again = Audit(spark, folder).start()
    assert again.judge.state.kind_totals()[verdicts.LOST] == 1
    again.write("c", [enqueued("lost2", BASE + 10 * S), enqueued("later2", BASE + 10 * S + 1)])
    again.write("d", [settled("delivered", "later2", BASE + 11 * S)])
    again.ticks_to(BASE + 10 * S + DEADLINE + LATENESS + S)
    again.until(lambda: again.found)
    again.ticks_to(BASE + 20 * S)
    assert [f.message_id for f in again.found] == ["lost2"]
    assert again.judge.state.kind_totals()[verdicts.LOST] == 2
    findings = spark.read.parquet(str(folder / "findings")).collect()
    assert sorted(r.message_id for r in findings) == ["lost", "lost2"]
    # Spark deleted what it read: the inbox keeps the export's checkpoint alone.
    again.until(lambda: not [n for n in os.listdir(folder / "inbox") if n.endswith(".parquet")])
    again.stop()


def test_a_micro_batch_judged_before_a_restart_still_runs_through_spark(spark, tmp_path):
    """A restart that stopped after the judge saved a micro-batch and before
    Spark committed it runs that micro-batch again: the judge must not judge
    it twice, and Spark's state stores must still commit it (a judge that
    returned at once failed the query on Spark 4: STATE_STORE_COMMIT_VALIDATION_FAILED)."""
    folder = tmp_path / "audit"
    os.makedirs(folder / "inbox")
    state = verdicts.AuditState(DEADLINE, batch=5, started_ms=BASE)  # ahead of Spark
    verdicts.save(str(folder / "state.json"), state)
    replayed = Audit(spark, folder).start()
    replayed.write("a", [enqueued("m1", BASE), ev("tick", BASE)])
    replayed.until(lambda: replayed.query.lastProgress is not None
                   and replayed.query.lastProgress["batchId"] >= 2)
    assert replayed.query.isActive, replayed.query.exception()
    assert replayed.judge.state.batch == 5 and not replayed.found  # nothing judged twice
    replayed.stop()


def test_the_report_shows_the_live_audits_findings_beside_its_reconciliation(spark, tmp_path):
    from gearhorn.pipeline import job

    day = tmp_path / "ledger" / "date=2027-01-15"
    day.mkdir(parents=True)
    rows = [enqueued("m1", BASE), settled("delivered", "m1", BASE + S)]
    ledgerexport._write_parquet(str(day / "part-1.parquet"), rows)
    found = verdicts.Finding(verdicts.LOST, "news", "news_a", "m9", "m9:a", BASE,
                             "not delivered within 60 s while copies enqueued after it were")
    audit.write_findings(str(tmp_path / "findings"), 3, [found], BASE + 70 * S)
    from gearhorn.pipeline import countaudit  # the count-first audit's, JSON Lines

    late = verdicts.Finding(verdicts.OVERDUE, "news", "news_b", "m8", "m8:b", BASE,
                            "not delivered within 60 s; its subscriber took only older")
    countaudit.write_findings(str(tmp_path / "findings"), 4, [late], BASE + 71 * S)
    options = job.Options(str(tmp_path / "ledger"), str(tmp_path / "out"), quiet=True,
                          findings=str(tmp_path / "findings"))
    summary = job.run(options)
    assert summary["audit_findings"] == {"never_delivered": 1, "overdue": 1}
    assert summary["reconciliation"] == {}  # the ledger given is clean: two views, one word
    html = (tmp_path / "out" / "report.html").read_text()
    assert "Live audit findings" in html and "m9" in html
    table = spark.read.parquet(str(tmp_path / "out" / "tables" / "audit_findings")).collect()
    assert sorted((r.kind, r.message_id, r.batch) for r in table) == [
        ("never_delivered", "m9", 3), ("overdue", "m8", 4)]
    empty = job.run(job.Options(str(tmp_path / "ledger"), str(tmp_path / "out2"), quiet=True,
                                findings=str(tmp_path / "none")))
    assert empty["audit_findings"] == {}
