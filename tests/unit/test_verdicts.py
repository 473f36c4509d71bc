"""The live audit's judgement, without Spark (gearhorn/pipeline/verdicts.py)."""

from gearhorn.pipeline import verdicts as V
from gearhorn.pipeline.verdicts import AuditState, Presence, Unsettled

S = 1000  # a second in ms


def state(**kwargs):
    return AuditState(deadline_ms=60 * S, started_ms=0, **kwargs)


def copy(subscriber="news_a", at=100 * S, message="m1"):
    return Unsettled(subscriber, "news", message, f"{message}:a", at)


def test_a_copy_passed_over_for_a_later_one_is_lost_naming_message_and_subscriber():
    book = state()
    book.settle([Presence("news_a", newest_enqueued_ts=101 * S, newest_settled_ts=102 * S,
                          copies=5)])
    finding = book.judge(copy())
    assert (finding.kind, finding.subscriber, finding.message_id) == (V.LOST, "news_a", "m1")
    assert "m1" in finding.line() and "news_a" in finding.line()
    assert book.settled == 5


def test_a_subscriber_that_took_only_older_copies_is_behind_not_losing():
    book = state()
    book.settle([Presence("news_a", newest_enqueued_ts=90 * S, newest_settled_ts=130 * S,
                          copies=1)])
    assert book.judge(copy()).kind == V.OVERDUE


def test_a_subscriber_away_is_not_counted_however_late_its_copies():
    book = state()
    book.settle([Presence("news_a", newest_enqueued_ts=50 * S, newest_settled_ts=60 * S,
                          copies=1)])
    assert book.judge(copy()) is None and book.judge(copy("news_b")) is None
    assert book.away == 2 and not book.totals


def test_presence_only_grows_and_is_forgotten_past_twice_the_deadline():
    book = state()
    book.settle([Presence("news_a", 200 * S, 210 * S, 1)])
    book.settle([Presence("news_a", 150 * S, 160 * S, 1)])  # an older batch's late rows
    assert book.subscribers["news_a"] == [200 * S, 210 * S]
    book.clock_ms = 210 * S + 2 * 60 * S
    book.forget_settled()
    assert "news_a" in book.subscribers
    book.clock_ms += 1
    book.forget_settled()
    assert not book.subscribers


def test_a_duplicate_is_reported_once_per_copy():
    book = state()
    finding = V.Finding(V.DUPLICATE, "news", "news_a", None, "m1:a", 5, "twice")
    assert book.duplicate("42", finding) == finding
    assert book.duplicate("42", finding) is None  # a third delivery: another pair


def test_stream_runs_are_checked_as_the_report_checks_them():
    book = state()
    assert book.streamed("news_+s1", ["e1:0-9", "e1:10-19"]) == []
    gap, again = book.streamed("news_+s1", ["e1:25-30", "e1:28-40"])
    assert (gap.kind, gap.detail) == ("stream_gap", "offsets 20-24 never given")
    assert (again.kind, again.detail) == ("stream_duplicate", "offsets 28-30 given again")
    assert gap.topic == "news"
    # A gap the client was told of is not a finding; another epoch starts anew.
    assert book.streamed("news_+s1", ["e1:50-60:unrecovered", "e2:0-3"]) == []


def test_stream_runs_of_one_micro_batch_are_checked_in_offset_order():
    """A micro-batch's rows come in no promised order: runs given 0-9 then
    10-19 are no duplicate however they arrive, and a gap is found as well."""
    book = state()
    assert book.streamed("news_+s1", ["e1:10-19", "e1:0-9"]) == []
    (gap,) = book.streamed("news_+s1", ["e1:30-35", "e1:20-24"])
    assert gap.detail == "offsets 25-29 never given"


def test_counts_and_the_console_line():
    book = state()
    book.lags_ms.extend([1000, 2000, 3000])
    assert book.summary_line(30 * S, 300 * S) == (
        "audit: nothing lost in the 30 s since it started (0 copies settled, "
        "2.0 s behind the ledger)")
    assert book.summary_line(301 * S, 300 * S).startswith("audit: nothing lost in the last 5 min")
    book.count([V.Finding(V.LOST, "news", "news_a", "m1", "m1:a", 1, "lost")], 302 * S)
    assert book.kind_totals()[V.LOST] == 1 and book.totals == {"news": {V.LOST: 1}}
    assert "FINDINGS" in book.summary_line(303 * S, 300 * S)
    assert "nothing lost in the last 5 min" in book.summary_line(603 * S, 300 * S)


def test_the_state_saved_is_the_state_loaded(tmp_path):
    path = str(tmp_path / "state.json")
    book = state(batch=7)
    book.settle([Presence("news_a", 1, 2, 3)])
    book.streamed("news_+s", ["e:0-4"])
    book.count([V.Finding(V.LOST, "news", "news_a", "m1", "m1:a", 1, "lost")], 5)
    book.lags_ms.append(1500)
    V.save(path, book)
    again = V.load(path, 30 * S, now_ms=99)
    assert again.batch == 7 and again.deadline_ms == 30 * S  # the setting now
    assert again.subscribers == book.subscribers and again.streams == book.streams
    assert again.totals == book.totals and list(again.recent) == list(book.recent)
    assert list(again.lags_ms) == [1500]
    assert V.load(str(tmp_path / "none.json"), S, now_ms=99).started_ms == 99
