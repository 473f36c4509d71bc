"""The ledger and the metrics hear of every step through one observer."""

import json

import pytest

from gearhorn import gearman
from gearhorn.config import Config
from gearhorn.store import ledger as L
from gearhorn.store import ledgerentries as entries_mod
from gearhorn.store import ledgerexport as X
from gearhorn.store.observers import FailedCopy, LedgerObserver, Observer, Observers
from gearhorn.store.subscribers import SubscriberCache
from gearhorn.worker.wiring import build_service
from tests.fakes import RecordingClient

pytestmark = pytest.mark.timeout(10)


class Heard(Observer):
    def __init__(self, name, log):
        self.name, self.log = name, log

    def fanned_out(self, topic, per_message, width, failed=(), seconds=None):
        self.log.append((self.name, "fanned_out", topic, per_message, width, list(failed)))

    def refused(self, function, reason):
        self.log.append((self.name, "refused", function, reason))

    def acked(self, queue, unique):
        self.log.append((self.name, "acked", queue, unique))


def rows(fake_redis, keys):
    entries = [(i.decode(), X._decode(f)) for i, f in fake_redis.xrange(keys.ledger(0))]
    return [(r["event"], r["subscriber"], r["unique"], r["count"], r["reason"])
            for r in entries_mod.rows_from_entries(entries)]


def test_observers_tell_each_in_order_and_unheard_hooks_do_nothing():
    log = []
    both = Observers(Heard("a", log), Heard("b", log))
    both.acked("news_a", "u1")
    both.refused("fanout", "bad json")
    both.dropped("maxlen", "news", "news_a", ["u1"])  # nobody overrides it
    assert log == [("a", "acked", "news_a", "u1"), ("b", "acked", "news_a", "u1"),
                   ("a", "refused", "fanout", "bad json"), ("b", "refused", "fanout", "bad json")]


class Broken(Observer):
    def acked(self, queue, unique):
        raise RuntimeError("ledger bug")

    def flush(self):
        raise ConnectionError("redis went away")


def test_a_failing_observer_is_logged_and_the_others_still_hear(caplog):
    log = []
    both = Observers(Broken(), Heard("b", log))
    both.acked("news_a", "u1")  # no exception reaches the fanout or the delivery
    assert log == [("b", "acked", "news_a", "u1")]
    assert "observer Broken failed in acked" in caplog.text


def test_a_failed_flush_is_raised_after_every_observer_flushed():
    flushed = []

    class Counting(Observer):
        def flush(self):
            flushed.append(True)

    with pytest.raises(ConnectionError, match="redis went away"):
        Observers(Broken(), Counting()).flush()
    assert flushed == [True]  # an answer waiting on the flush is not given as written


def test_a_fanout_is_heard_once_with_its_copies_width_and_failures(registry):
    log = []
    client = RecordingClient({"news_bob": gearman.Outcome("failed", reason="bad input")})
    svc = build_service(Config(max_deliveries=1), registry, SubscriberCache(registry), client,
                        observer=Heard("o", log))
    for who in ("alice", "bob"):
        svc.handle("subscribe_fanout", json.dumps({"topic": "news", "client_id": who}).encode())
    svc.handle("fanout", json.dumps({"topic": "news", "payload": "hi"}).encode(), "", 0.0)
    ((_, hook, topic, per_message, width, failed),) = log
    (message_id, copies), = per_message
    assert (hook, topic, width) == ("fanned_out", "news", 2)
    assert sorted(queue for queue, _ in copies) == ["news_alice", "news_bob"]
    bob = dict(copies)["news_bob"]
    assert failed == [FailedCopy("news_bob", bob, "failed: bad input")]
    svc.record_rejection("fanout", "no topic")
    assert log[-1] == ("o", "refused", "fanout", "no topic")


def test_the_ledger_observer_writes_each_hook_as_ledger_rows(fake_redis, registry):
    keys = registry.keys
    recorded = []
    observer = LedgerObserver(L.Ledger(fake_redis, keys, source="w1"),
                              recorded=lambda: recorded.append(1))
    observer.fanned_out("news", [("m1", [("news_a", "m1:a"), ("news_b", "m1:b")])], 3,
                        [FailedCopy("news_b", "m1:b", "timeout: late")])
    observer.not_made("full", "news", [("m1", "news_c", "m1:c")])
    observer.dropped("expired", "news", "news_a", ["m1:a"])
    observer.refused("fanout", "bad json")
    observer.dead_lettered("jobs", "s:9", "rejected")
    observer.attached("news_a")
    observer.delivered("news_a", "m1:a", True)
    observer.acked("news_a", "m1:a")
    observer.flush()
    assert rows(fake_redis, keys) == [
        ("published", None, None, 3, None),
        ("enqueued", "news_a", "m1:a", None, None),
        ("enqueued", "news_b", "m1:b", None, None),
        ("failed", "news_b", "m1:b", None, "timeout: late"),
        ("dropped", "news_c", "m1:c", None, "full"),
        ("dropped", "news_a", "m1:a", None, "expired"),
        ("failed", None, None, None, "fanout: bad json"),
        ("failed", "jobs", "s:9", None, "dead-lettered: rejected"),
        ("attached", "news_a", None, None, None),
        ("delivered", "news_a", "m1:a", None, None),
        ("acked", "news_a", "m1:a", None, None)]
    assert len(recorded) == 3  # the bridge's events, each heard by its flusher
