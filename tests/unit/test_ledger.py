import json
import os

import pytest

from gearhorn.rules.events import ROW_FIELDS, copy_key
from gearhorn.store import ledger as L
from gearhorn.store import ledgerentries as entries_mod
from gearhorn.store import ledgerexport as X
from gearhorn.store.keys import Keys
from tests.needs import require_module


@pytest.fixture
def book(fake_redis):
    return L.Ledger(fake_redis, Keys("t:"), maxlen=1000, source="w1")


def publish(book, fake_redis, message_id, copies, topic="news"):
    book.published(topic, message_id, copies)
    book.flush()


def test_a_published_entry_becomes_one_row_per_copy(book, fake_redis):
    publish(book, fake_redis, "m1", [("news_a", "m1:a"), ("news_b", "m1:b")])
    book.record("delivered", "news_a", "m1:a", redelivered=True)
    book.flush()
    entries = [(i.decode(), X._decode(f)) for i, f in fake_redis.xrange("{t:ledger:0}")]
    rows = list(entries_mod.rows_from_entries(entries))
    assert [(r["event"], r["subscriber"], r["unique"], r["count"]) for r in rows] == [
        ("published", None, None, 2), ("enqueued", "news_a", "m1:a", None),
        ("enqueued", "news_b", "m1:b", None), ("delivered", "news_a", "m1:a", None)]
    assert rows[0]["message_id"] == rows[1]["message_id"] == "m1"
    assert rows[3]["redelivered"] is True and rows[0]["source"] == "w1"
    assert set(rows[0]) == set(ROW_FIELDS)


def test_a_held_copys_answer_keeps_its_status_beside_the_bridges_events(book, fake_redis):
    book.record("answered", "news_a", "m1:a", reason="exception")
    book.record("acked", "news_b", "m1:b")  # a line without a reason, as before
    book.flush()
    entries = [(i.decode(), X._decode(f)) for i, f in fake_redis.xrange("{t:ledger:0}")]
    rows = [(r["event"], r["subscriber"], r["reason"], r["redelivered"])
            for r in entries_mod.rows_from_entries(entries)]
    assert rows == [("answered", "news_a", "exception", False), ("acked", "news_b", None, False)]


def test_a_held_copys_answer_keeps_its_generation_and_job_handle(book, fake_redis):
    book.record("answered", "news_a", "m1:a", reason="complete", generation=0,
                handle="H:gm:12")
    book.record("answered", "news_a", "m1:a", reason="complete", generation=37)
    book.record("answered", "news_b", "m1:b", reason="complete")  # written before it had one
    book.flush()
    entries = [(i.decode(), X._decode(f)) for i, f in fake_redis.xrange("{t:ledger:0}")]
    rows = [(r["subscriber"], r["reason"], r["count"], r["handle"])
            for r in entries_mod.rows_from_entries(entries)]
    assert rows == [("news_a", "complete", 0, "H:gm:12"), ("news_a", "complete", 37, None),
                    ("news_b", "complete", None, None)]


def test_disabled_ledger_writes_nothing(fake_redis):
    off = L.Ledger(fake_redis, Keys("t:"), enabled=False)
    off.published("t", "m", [("t_a", "u")])
    off.record("acked", "t_a", "u")
    off.flush()
    assert fake_redis.xlen("{t:ledger:0}") == 0


def read_jsonl(out):
    rows = []
    for folder, _, files in os.walk(out):
        for name in files:
            if name.endswith(".jsonl"):
                with open(os.path.join(folder, name)) as fp:
                    rows += [json.loads(line) for line in fp]
    return rows


def test_export_writes_each_event_once_across_exports(book, fake_redis, tmp_path):
    out = str(tmp_path / "ledger")
    publish(book, fake_redis, "m1", [("news_a", "m1:a")])
    first = X.export(fake_redis, Keys("t:"), out, "jsonl")
    assert first["rows"] == 2 and len(first["files"]) == 1
    assert X.export(fake_redis, Keys("t:"), out, "jsonl")["rows"] == 0
    publish(book, fake_redis, "m2", [("news_a", "m2:a")])
    book.record("acked", "news_a", "m1:a")
    book.flush()
    assert X.export(fake_redis, Keys("t:"), out, "jsonl")["rows"] == 3
    rows = read_jsonl(out)
    assert sorted((r["event"], r["message_id"] or r["unique"]) for r in rows) == [
        ("acked", "m1:a"), ("enqueued", "m1"), ("enqueued", "m2"),
        ("published", "m1"), ("published", "m2")]
    assert all(os.path.basename(os.path.dirname(f)).startswith("date=") for f in first["files"])


def test_export_merges_the_writers_streams_in_time_order(fake_redis, tmp_path):
    out = str(tmp_path / "ledger")
    writers = [L.Ledger(fake_redis, Keys("t:"), source=f"w{n}", shards=4) for n in range(8)]
    assert len({w.stream for w in writers}) > 1  # writers spread over the streams
    for round_ in range(3):
        for n, writer in enumerate(writers):
            writer.published("news", f"m{round_}-{n}", [])
            writer.flush()
    assert X.export(fake_redis, Keys("t:"), out, "jsonl", chunk=5, shards=4)["rows"] == 24
    ids = [r["stream_id"] for r in read_jsonl(out)]
    # In time order, and each of the 24 entries exported once.
    assert sorted(ids, key=X._id_key) == ids
    assert sorted(r["message_id"] for r in read_jsonl(out)) == sorted(
        f"m{round_}-{n}" for round_ in range(3) for n in range(8))
    writers[0].published("news", "late", [])
    writers[0].flush()
    again = X.export(fake_redis, Keys("t:"), out, "jsonl", shards=4)
    assert again["rows"] == 1  # each stream resumes from its own checkpoint
    last = list(entries_mod.rows_from_entries(X.entries(fake_redis, Keys("t:"), 4)))[-1]
    assert last["message_id"] == "late"


def test_export_redone_after_a_crash_replaces_its_files(book, fake_redis, tmp_path):
    out = str(tmp_path / "ledger")
    publish(book, fake_redis, "m1", [("news_a", "m1:a")])
    X.export(fake_redis, Keys("t:"), out, "jsonl")
    os.remove(os.path.join(out, X.CHECKPOINT))  # as if we died before the checkpoint
    X.export(fake_redis, Keys("t:"), out, "jsonl")
    assert len(read_jsonl(out)) == 2


def test_an_export_that_died_half_way_is_redone_to_the_same_ids_and_files(
        book, fake_redis, tmp_path, monkeypatch):
    """The ends are recorded before the files: events that arrive before the
    redo wait for the next export, so the redone files are the same ones."""
    out = str(tmp_path / "ledger")
    publish(book, fake_redis, "m1", [("news_a", "m1:a")])

    def die(self):
        raise OSError("disk full")

    monkeypatch.setattr(X._DayFiles, "finish", die)
    with pytest.raises(OSError):
        X.export(fake_redis, Keys("t:"), out, "jsonl")
    monkeypatch.undo()
    publish(book, fake_redis, "m2", [("news_a", "m2:a")])  # after the ends were fixed
    redone = X.export(fake_redis, Keys("t:"), out, "jsonl")
    assert redone["rows"] == 2 and not [n for n in os.listdir(os.path.dirname(
        redone["files"][0])) if n.endswith(".tmp")]
    assert X.export(fake_redis, Keys("t:"), out, "jsonl")["rows"] == 2  # m2's turn
    assert sorted(r["message_id"] for r in read_jsonl(out) if r["event"] == "published") == [
        "m1", "m2"]


def test_follow_exports_until_stopped_and_rides_out_a_redis_outage(book, fake_redis,
                                                                    tmp_path, monkeypatch):
    import threading

    import redis

    out, stop, results = str(tmp_path / "ledger"), threading.Event(), []
    real_export, calls = X.export, []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise redis.ConnectionError("away")
        result = real_export(*args, **kwargs)
        if len(calls) == 3:
            stop.set()
        return result

    monkeypatch.setattr(X, "export", flaky)
    publish(book, fake_redis, "m1", [("news_a", "m1:a")])
    X.follow(fake_redis, Keys("t:"), out, 0.0, stop, "jsonl", on_export=results.append)
    assert [r["rows"] for r in results] == [2, 0] and len(read_jsonl(out)) == 2


def test_export_parquet(book, fake_redis, tmp_path):
    pq = require_module("pyarrow.parquet")
    publish(book, fake_redis, "m1", [("news_a", "m1:a"), ("news_b", "m1:b")])
    result = X.export(fake_redis, Keys("t:"), str(tmp_path), "parquet")
    table = pq.read_table(result["files"][0])
    assert table.num_rows == 3
    assert table.column_names == list(ROW_FIELDS)


def test_trimmed_ledger_is_reported(fake_redis, tmp_path):
    small = L.Ledger(fake_redis, Keys("t:"), maxlen=1)
    small.published("t", "m0", [])
    small.flush()
    X.export(fake_redis, Keys("t:"), str(tmp_path), "jsonl")
    for _ in range(3):
        small.redis.xadd("{t:ledger:0}", {"e": "acked", "ts": "1"}, maxlen=1, approximate=False)
    assert X.export(fake_redis, Keys("t:"), str(tmp_path), "jsonl")["trimmed"] is True


def test_redis_errors_keep_events_for_the_next_flush_and_never_raise(book, fake_redis,
                                                                    monkeypatch):
    import redis

    def down(*args, **kwargs):
        raise redis.ConnectionError("down")

    book.record("acked", "q", "u1")
    working = book.redis.pipeline
    monkeypatch.setattr(book.redis, "pipeline", lambda **kw: type(
        "P", (), {"xadd": lambda *a, **k: None, "execute": down})())
    book.flush()
    book.record("acked", "q", "u2")
    book.flush()
    assert book.lost == 0 and book.buffered == 2
    monkeypatch.setattr(book.redis, "pipeline", working)
    book.flush()
    rows = list(entries_mod.rows_from_entries(X.entries(fake_redis, Keys("t:"), 1)))
    assert [r["unique"] for r in rows] == ["u1", "u2"] and book.buffered == 0


def test_an_outage_longer_than_the_buffer_loses_the_oldest_and_counts_them(
        book, monkeypatch):
    import redis

    def down(*args, **kwargs):
        raise redis.ConnectionError("down")

    monkeypatch.setattr(L, "MAX_UNWRITTEN", 3)
    monkeypatch.setattr(book.redis, "pipeline", lambda **kw: type(
        "P", (), {"xadd": lambda *a, **k: None, "execute": down})())
    for n in range(5):
        book.published("news", f"m{n}", [])
        book.flush()
    kept = entries_mod.rows_from_entries((str(n), entry) for n, entry in enumerate(book._unwritten))
    assert book.lost == 2 and [r["message_id"] for r in kept] == ["m2", "m3", "m4"]


def test_an_outage_is_logged_once_and_its_end_with_what_was_lost(book, monkeypatch, caplog):
    import redis
    from redis.exceptions import SlotNotCoveredError

    working = book.redis.pipeline
    failures = [redis.ConnectionError("refused"), SlotNotCoveredError("slot 7 not covered")]

    def pipeline(**kw):
        if not failures:
            return working(**kw)
        error = failures.pop(0)
        return type("P", (), {"xadd": lambda *a, **k: None,
                              "execute": lambda self: (_ for _ in ()).throw(error)})()
    monkeypatch.setattr(book.redis, "pipeline", pipeline)
    caplog.set_level("INFO", logger="gearhorn.store.ledger")
    for n in range(3):
        book.record("acked", "q", f"u{n}")
        book.flush()
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in lines] == ["WARNING", "INFO"], lines
    assert "refused" in lines[0][1] and "0 events lost since start" in lines[1][1]


def _written_within(fake_redis, seconds: float) -> bool:
    import time
    deadline = time.monotonic() + seconds
    while fake_redis.xlen("{t:ledger:0}") == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    return fake_redis.xlen("{t:ledger:0}") == 1


def test_a_poke_has_the_flusher_write_in_the_background(book, fake_redis):
    flusher = L.Flusher(book, interval=0.01, idle=3600)  # only the poke can wake it
    flusher.start()
    book.record("acked", "q", "u")
    flusher.poke()
    written = _written_within(fake_redis, 30)
    flusher.stop()
    assert written


def test_what_is_buffered_without_a_poke_is_written_after_idle(book, fake_redis):
    flusher = L.Flusher(book, interval=0.01, idle=0.05)
    flusher.start()
    book.record("acked", "q", "u")
    written = _written_within(fake_redis, 30)
    flusher.stop()
    assert written


def test_an_unpoked_flusher_sleeps(book, fake_redis, monkeypatch):
    flushes = []
    flusher = L.Flusher(book, interval=0.001, idle=3600)
    monkeypatch.setattr(flusher, "_flush", lambda everything=False: flushes.append(1))
    flusher.start()
    flusher.poke()
    import time
    deadline = time.monotonic() + 30
    while not flushes and time.monotonic() < deadline:
        time.sleep(0.01)
    assert flushes == [1]  # the poke's flush; then it waits for the next poke
    flusher.poked.wait(0.2)
    assert flushes == [1] and not flusher.poked.is_set()
    flusher.stop()
    assert flushes == [1, 1]  # the last flush, on stop


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_export_writes_chunk_by_chunk_with_the_same_rows(book, fake_redis, tmp_path, fmt):
    require_module("pyarrow.parquet")
    for i in range(25):
        publish(book, fake_redis, f"m{i}", [("news_a", f"m{i}:a")])
    small = X.export(fake_redis, Keys("t:"), str(tmp_path / "small"), fmt, chunk=4)
    whole = X.export(fake_redis, Keys("t:"), str(tmp_path / "whole"), fmt, chunk=10_000)
    assert small["rows"] == whole["rows"] == 50

    def rows(path):
        if fmt == "jsonl":
            with open(path) as fp:
                return [json.loads(line) for line in fp]
        import pyarrow.parquet as pq
        return pq.read_table(path).to_pylist()

    assert rows(small["files"][0]) == rows(whole["files"][0])
    if fmt == "parquet":  # one row group per chunk written: never all rows in memory
        import pyarrow.parquet as pq
        assert pq.ParquetFile(small["files"][0]).num_row_groups == 7
    assert not list(tmp_path.rglob("*.tmp"))


def test_messages_published_between_flushes_are_one_entry_and_a_row_each(book, fake_redis):
    book.published("news", "m1", [("news_a", "m1:a")])
    book.published("odd\ttopic\n", "m2", [], width=3)  # JSON keeps any text on its line
    book.failed("timeout", "news", "news_b", "m1:b")
    book.flush()
    entries = [(i.decode(), X._decode(f)) for i, f in fake_redis.xrange("{t:ledger:0}")]
    assert [f["e"] for _, f in entries] == [L.PUBLISHED_BATCH, "failed"]
    rows = list(entries_mod.rows_from_entries(entries))
    assert [(r["event"], r["message_id"], r["topic"], r["subscriber"], r["count"])
            for r in rows] == [
        ("published", "m1", "news", None, 1), ("enqueued", "m1", "news", "news_a", None),
        ("published", "m2", "odd\ttopic\n", None, 3), ("failed", None, "news", "news_b", None)]
    assert all(set(r) == set(ROW_FIELDS) for r in rows)
    assert rows[1]["copy_key"] == copy_key("news_a", "m1:a") and rows[0]["source"] == "w1"


def test_a_published_entry_of_an_older_ledger_still_exports(fake_redis):
    fake_redis.xadd("{t:ledger:0}", {"e": "published", "ts": "5", "mid": "m1", "topic": "news",
                                     "n": "1", "subs": "news_a\tm1:a", "src": "w0"})
    rows = list(entries_mod.rows_from_entries(X.entries(fake_redis, Keys("t:"), 1)))
    assert [(r["event"], r["message_id"], r["subscriber"], r["ts"]) for r in rows] == [
        ("published", "m1", None, 5), ("enqueued", "m1", "news_a", 5)]


def test_an_outage_keeps_the_newest_events_however_they_are_batched(book, monkeypatch):
    import redis

    def down(*args, **kwargs):
        raise redis.ConnectionError("down")

    monkeypatch.setattr(L, "MAX_UNWRITTEN", 4)
    monkeypatch.setattr(book.redis, "pipeline", lambda **kw: type(
        "P", (), {"xadd": lambda *a, **k: None, "execute": down})())
    for n in range(3):  # a batch of three, then one of three: 6 events, room for 4
        book.published("news", f"a{n}", [])
    book.flush()
    for n in range(3):
        book.published("news", f"b{n}", [])
    book.flush()
    kept = entries_mod.rows_from_entries((str(n), entry) for n, entry in enumerate(book._unwritten))
    assert book.lost == 3 and [r["message_id"] for r in kept] == ["b0", "b1", "b2"]


def test_the_audits_counts_go_at_most_once_a_second_beside_the_ledger_and_all_at_a_stop(
        book, fake_redis):
    counts_stream = Keys("t:").audit_counts(0)
    assert counts_stream.startswith(book.stream)  # its hash slot: one MULTI
    book.counts.enqueued("news_a", 7)
    book.flush()
    book.counts.enqueued("news_a", 7)
    book.record("answered", "news_a", "m1:a", reason="complete", generation=0)
    book.flush()  # the ledger's line now, the counts within the second
    entries = [fields for _, fields in fake_redis.xrange(counts_stream)]
    assert [e[b"lines"] for e in entries] == [b"e\t7\tnews_a\t1"]
    assert len(fake_redis.xrange(book.stream)) == 1
    book.flush(everything=True)
    assert [f[b"lines"] for _, f in fake_redis.xrange(counts_stream)][1:] == [b"e\t7\tnews_a\t1"]
