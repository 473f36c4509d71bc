import json
import time

import pytest
import redis

from gearhorn import gearman
from gearhorn.config import Config
from gearhorn.errors import BadRequest
from gearhorn.store.subscribers import SubscriberCache
from gearhorn.worker.jobs import ServiceUnavailable
from gearhorn.worker.wiring import build_service
from tests.fakes import RecordingClient


@pytest.fixture
def service(registry):
    client = RecordingClient()
    svc = build_service(Config(max_payload_bytes=1000), registry,
                        SubscriberCache(registry), client)
    return svc, client


def call(svc, function, **job):
    return json.loads(svc.handle(function, json.dumps(job).encode()))


def test_subscribe_then_background_fanout_copies_to_each_queue(service):
    svc, client = service
    assert call(svc, "subscribe_fanout", topic="news", client_id="alice")["subscribers"] == 1
    assert call(svc, "register_fanout_subscriber", topic="news", client_id="bob") == {
        "topic": "news", "client_id": "bob", "subscribers": 2}
    result = call(svc, "fanout", topic="news", payload="hi", background=True)
    assert result["copies"] == 2 and result["background"] is True
    assert sorted(c.function for c in client.background) == ["news_alice", "news_bob"]
    assert {c.data for c in client.background} == {b"hi"}
    mid = result["message_id"]
    assert sorted(c.unique for c in client.background) == [f"{mid}:alice", f"{mid}:bob"]


def test_unique_key_of_the_request_is_the_base_of_every_copy(service):
    svc, client = service
    call(svc, "subscribe_fanout", topic="news", client_id="alice")
    call(svc, "fanout", topic="news", payload={"x": 1}, unique="order-7", background=True)
    assert [(c.unique, c.data) for c in client.background] == [("order-7:alice", b'{"x":1}')]


def test_payloads_reach_every_subscriber_in_order(service):
    svc, client = service
    for who in ("alice", "bob"):
        call(svc, "subscribe_fanout", topic="news", client_id=who)
    result = call(svc, "fanout", topic="news", payloads=["1", "2", "3"], background=True)
    assert result["copies"] == 6 and len(result["message_ids"]) == 3
    for who in ("alice", "bob"):
        assert [c.data for c in client.background if c.function == f"news_{who}"] == [
            b"1", b"2", b"3"]
    assert len({c.unique for c in client.background}) == 6


@pytest.mark.parametrize(("status", "reason"), [
    ("timeout", "no answer"),
    ("refused", "gearmand refused it: queue full"),  # a held copy, handed again later
])
def test_foreground_fanout_reports_failures_per_subscriber(registry, status, reason):
    client = RecordingClient({"news_bob": gearman.Outcome(status, reason=reason)})
    svc = build_service(Config(), registry, SubscriberCache(registry), client)
    call(svc, "subscribe_fanout", topic="news", client_id="alice")
    call(svc, "subscribe_fanout", topic="news", client_id="bob")
    result = call(svc, "fanout", topic="news", payload="hi")
    assert result["copies"] == 2 and result["completed"] == 1
    assert result["failed"] == [{"client_id": "bob", "queue": "news_bob", "status": status,
                                 "reason": reason, "attempts": 1, "queued": True}]


def test_unsubscribed_client_gets_nothing(service):
    svc, client = service
    call(svc, "subscribe_fanout", topic="news", client_id="alice")
    call(svc, "subscribe_fanout", topic="news", client_id="bob")
    assert call(svc, "unsubscribe_fanout", topic="news", client_id="alice")["subscribers"] == 1
    call(svc, "fanout", topic="news", payload="hi", background=True)
    assert [c.function for c in client.background] == ["news_bob"]


def test_fanout_without_subscribers_makes_no_copies(service):
    svc, client = service
    assert call(svc, "fanout", topic="empty", payload="hi", background=True)["copies"] == 0
    assert client.background == []


def test_bad_input_raises_bad_request_and_nothing_is_sent(service):
    svc, client = service
    call(svc, "subscribe_fanout", topic="news", client_id="alice")
    for data in (b"nope", b'{"topic": "news", "payload": "' + b"x" * 1001 + b'"}'):
        with pytest.raises(BadRequest):
            svc.handle("fanout", data)
    with pytest.raises(BadRequest, match="unknown function"):
        svc.handle("other", b"{}")
    assert client.background == client.foreground == []


def test_a_key_error_inside_a_handler_is_a_bug_not_an_unknown_function(service, monkeypatch):
    svc, _ = service

    def broken(data):
        return {}["missing"]

    monkeypatch.setitem(svc._queries, "subscribe_fanout", broken)
    with pytest.raises(KeyError, match="missing"):
        svc.handle("subscribe_fanout", b"{}")


def test_redis_down_is_reported_as_unavailable(registry, monkeypatch):
    svc = build_service(Config(), registry, SubscriberCache(registry), RecordingClient())

    def down(*args, **kwargs):
        raise redis.ConnectionError("Connection refused")

    monkeypatch.setattr(registry, "members_with", down)
    with pytest.raises(ServiceUnavailable, match="registry unavailable"):
        svc.handle("fanout", b'{"topic": "t", "payload": 1}')


@pytest.mark.parametrize("priority", ["high", "normal", "low"])
def test_every_copy_goes_out_at_the_requested_priority(service, priority):
    svc, client = service
    call(svc, "subscribe_fanout", topic="news", client_id="alice")
    call(svc, "fanout", topic="news", payload="hi", priority=priority, background=True)
    call(svc, "fanout", topic="news", payload="hi", priority=priority)
    assert client.precedences == [priority, priority]


def test_headers_are_stored_once_and_every_copy_points_at_them(service, fake_redis):
    svc, client = service
    for who in ("alice", "bob"):
        call(svc, "subscribe_fanout", topic="news", client_id=who)
    result = call(svc, "fanout", topic="news", payload="hi", background=True,
                  headers={"correlation-id": "c-1", "x-team": "ops"})
    mid = result["message_id"]
    assert sorted(c.unique for c in client.background) == [f"@{mid}:alice", f"@{mid}:bob"]
    found = svc.fanouts.stores.headers.for_uniques(c.unique for c in client.background)
    assert found == {c.unique: {"correlation-id": "c-1", "x-team": "ops",
                                "destination": "/topic/news"} for c in client.background}
    assert 0 < fake_redis.ttl(f"t:headers:{mid}") <= Config().headers_ttl


def test_a_receivers_failure_is_its_answer_unless_the_fanout_asks_for_more_attempts(registry):
    """Gearman's way: a WORK_FAIL or WORK_EXCEPTION reaches the producer at
    once; "attempts" asks for retries, with a growing pause."""
    failed = gearman.Outcome("failed", reason="receiver crashed")
    client = RecordingClient({"news_bob": [failed]})
    pauses = []
    svc = build_service(Config(retry_backoff=0.01), registry, SubscriberCache(registry), client,
                        sleep=pauses.append)
    call(svc, "subscribe_fanout", topic="news", client_id="alice")
    call(svc, "subscribe_fanout", topic="news", client_id="bob")
    once = call(svc, "fanout", topic="news", payload="hi")
    assert once["failed"] == [{"client_id": "bob", "queue": "news_bob", "status": "failed",
                               "reason": "receiver crashed", "attempts": 1}]
    client.foreground.clear()
    client.answers["news_bob"] = [failed, failed, gearman.Outcome("complete")]
    result = call(svc, "fanout", topic="news", payload="hi", attempts=5)
    assert result["completed"] == 2 and result["failed"] == []
    assert sorted(c.function for c in client.foreground) == [
        "news_alice", "news_bob", "news_bob", "news_bob"]  # bob's tried 3 times
    assert pauses == [0.01, 0.02]


def test_a_copy_that_keeps_failing_is_reported_after_its_attempts(registry):
    client = RecordingClient({"news_bob": gearman.Outcome("exception", reason="bad input")})
    svc = build_service(Config(fanout_attempts=3, retry_backoff=0.01), registry,
                        SubscriberCache(registry), client, sleep=lambda s: None)
    call(svc, "subscribe_fanout", topic="news", client_id="bob")
    result = call(svc, "fanout", topic="news", payload="hi")
    assert result["failed"] == [{"client_id": "bob", "queue": "news_bob", "status": "exception",
                                 "reason": "bad input", "attempts": 3}]
    assert len(client.foreground) == 3


def test_a_late_copy_is_not_retried(registry):
    client = RecordingClient({"news_bob": gearman.Outcome("timeout", reason="late")})
    svc = build_service(Config(fanout_attempts=5), registry, SubscriberCache(registry), client,
                        sleep=lambda s: None)
    call(svc, "subscribe_fanout", topic="news", client_id="bob")
    call(svc, "fanout", topic="news", payload="hi")
    assert len(client.foreground) == 1  # it is still queued: a retry would duplicate it


def test_a_delayed_fanout_is_kept_then_released_with_its_ids(service):
    svc, client = service
    call(svc, "subscribe_fanout", topic="news", client_id="alice")
    due = time.time() + 1
    result = call(svc, "fanout", topic="news", payload="later", deliver_at=due,
                  priority="low", headers={"k": "v"})
    assert result["scheduled"] is True and result["copies"] == 0
    assert client.background == [] and svc.fanouts.stores.scheduler.pending() == 1
    taken = []
    while not taken:  # polls Redis (bounded by the test timeout)
        taken = svc.fanouts.stores.scheduler.take()
    assert time.time() >= due - 0.01  # never before its time
    assert svc.fanouts.stores.scheduler.take() == []  # leased to one taker
    svc.fanouts.release(taken[0][1])
    svc.fanouts.stores.scheduler.done(taken)
    mid = result["message_id"]
    assert [(c.function, c.unique, c.data) for c in client.background] == [
        ("news_alice", f"@{mid}:alice", b"later")]
    assert client.precedences == ["low"] and svc.fanouts.stores.scheduler.pending() == 0


def test_a_fanout_due_already_goes_out_now(service):
    svc, client = service
    call(svc, "subscribe_fanout", topic="news", client_id="alice")
    result = call(svc, "fanout", topic="news", payload="now", deliver_at=1, background=True)
    assert result["copies"] == 1 and "scheduled" not in result


def test_a_fanout_job_run_again_makes_the_same_copies(service):
    svc, client = service
    call(svc, "subscribe_fanout", topic="news", client_id="alice")
    job = json.dumps({"topic": "news", "payload": "hi", "background": True}).encode()
    first = json.loads(svc.handle("fanout", job, job_unique="job-7"))
    again = json.loads(svc.handle("fanout", job, job_unique="job-7"))
    other = json.loads(svc.handle("fanout", job, job_unique="job-8"))
    assert first["message_id"] == again["message_id"] != other["message_id"]
    assert client.background[0].unique == client.background[1].unique  # gearmand coalesces
    no_unique = [json.loads(svc.handle("fanout", job))["message_id"] for _ in range(2)]
    assert no_unique[0] != no_unique[1]


def test_prefix_subscribers_learn_the_topic_a_message_was_published_to(service):
    svc, client = service
    call(svc, "subscribe_fanout", topic="news.*", client_id="carol")
    call(svc, "subscribe_fanout", topic="news.eu", client_id="dave")
    result = call(svc, "fanout", topic="news.eu", payload="hi", background=True)
    mid = result["message_id"]
    assert all(c.unique.startswith(f"@{mid}:") for c in client.background)
    found = svc.fanouts.stores.headers.for_uniques(c.unique for c in client.background)
    assert {h["destination"] for h in found.values()} == {"/topic/news.eu"}
    client.background.clear()
    call(svc, "fanout", topic="other", payload="x", background=True)  # no prefix: no headers
    call(svc, "subscribe_fanout", topic="plain", client_id="erin")
    call(svc, "fanout", topic="plain", payload="x", background=True)
    assert [c.unique for c in client.background][0].startswith("@") is False


def test_fanouts_are_counted_with_their_copies_and_latency(registry):
    from gearhorn.store.observers import StatsObserver
    from gearhorn.store.stats import Stats, read

    counts = Stats(registry.redis, registry.keys)  # write-through
    svc = build_service(Config(), registry, SubscriberCache(registry), RecordingClient(),
                        observer=StatsObserver(counts))
    for who in ("a", "b", "c"):
        call(svc, "subscribe_fanout", topic="news", client_id=who)
    svc.handle("fanout", json.dumps({"topic": "news", "payloads": ["1", "2"],
                                     "background": True}).encode(), "", time.monotonic())
    with pytest.raises(BadRequest):
        call(svc, "fanout", topic="news")  # rejected: not counted
    counters = read(registry.redis, registry.keys, top=10)
    assert (counters.copies, counters.fanouts) == ({"news": 6.0}, {"news": 2.0})
    assert counters.latency_count == 1


def test_gather_returns_every_receivers_answer_by_client_id(registry):
    client = RecordingClient({
        "news_alice": gearman.Outcome("complete", b"cache: 12 entries", partial=b"warming",
                                      progress=(1, 1)),
        "news_bob": gearman.Outcome("exception", b"boom", reason="boom"),
        "news_carol": gearman.Outcome("complete", b"\xff\x00"),
    })
    svc = build_service(Config(), registry, SubscriberCache(registry), client)
    for who in ("alice", "bob", "carol"):
        call(svc, "subscribe_fanout", topic="news", client_id=who)
    result = call(svc, "fanout", topic="news", payload="size?", gather=True)
    assert result["answers"] == {
        "alice": {"status": "complete", "attempts": 1, "data": "cache: 12 entries",
                  "partial": "warming", "progress": [1, 1]},
        "bob": {"status": "exception", "attempts": 1, "reason": "boom"},
        "carol": {"status": "complete", "attempts": 1, "data_base64": "/wA="},
    }
    assert [f["client_id"] for f in result["failed"]] == ["bob"]


def test_gathered_answers_beyond_the_bound_come_without_their_data(registry):
    client = RecordingClient({"news_a": gearman.Outcome("complete", b"x" * 60),
                              "news_b": gearman.Outcome("complete", b"y" * 60)})
    svc = build_service(Config(gather_max_bytes=100), registry, SubscriberCache(registry),
                        client)
    for who in ("a", "b"):
        call(svc, "subscribe_fanout", topic="news", client_id=who)
    result = call(svc, "fanout", topic="news", payload="?", gather=True)
    (cut,) = result["answers_truncated"]  # whichever came second
    (kept,) = {"a", "b"} - {cut}
    assert result["answers"][kept]["data"] == {"a": "x", "b": "y"}[kept] * 60
    assert result["answers"][cut] == {"status": "complete", "attempts": 1, "truncated": True}


@pytest.mark.parametrize("options, reason", [
    ({"gather": True, "background": True}, "gather is for a foreground fanout"),
    ({"attempts": 3, "background": True}, "attempts is for a foreground fanout"),
    ({"gather": "yes"}, "gather must be true or false"),
    ({"attempts": 0}, "attempts must be a whole number from 1 to 10"),
    ({"attempts": 2.5}, "attempts must be a whole number"),
    ({"gather": True, "payloads": ["a", "b"], "payload": None}, "gather takes one message"),
])
def test_answer_options_that_cannot_be_kept_are_refused(service, options, reason):
    svc, client = service
    job = {"topic": "news", "payload": "hi", **options}
    job = {k: v for k, v in job.items() if v is not None}
    with pytest.raises(BadRequest, match=reason):
        svc.handle("fanout", json.dumps(job).encode())
    assert client.background == client.foreground == []


def test_the_same_unique_again_is_the_same_message_and_says_it_was_coalesced(service):
    svc, client = service
    call(svc, "subscribe_fanout", topic="news", client_id="alice")
    first = call(svc, "fanout", topic="news", payload="hi", unique="order-7", background=True)
    again = call(svc, "fanout", topic="news", payload="hi", unique="order-7", background=True)
    assert "coalesced" not in first and again["coalesced"] is True
    assert again["message_id"] == first["message_id"]
    assert {c.unique for c in client.background} == {"order-7:alice"}  # gearmand merges them


def test_a_reject_publish_subscriber_is_bounded_from_its_first_copy(registry):
    """The worker read the warden's pressure before the subscription (and its
    clock says not to read again): the look-up finds a member it did not
    have, so it reads again and claims room (issue 49: a burst right after
    the subscription took all its copies, past the limit)."""
    from gearhorn.store.pressure import Pressure

    client = RecordingClient()
    frozen = Pressure(registry.redis, registry.keys, refresh=3600, clock=lambda: 0.0)
    svc = build_service(Config(), registry, SubscriberCache(registry), client,
                        pressure=frozen)
    call(svc, "subscribe_fanout", topic="news", client_id="other")
    call(svc, "fanout", topic="news", payload="before", background=True)  # pressure read
    call(svc, "subscribe_fanout", topic="news", client_id="capped", max_length=5,
         overflow="reject-publish")
    results = [call(svc, "fanout", topic="news", payloads=[f"{n}-{i}" for i in range(100)],
                    background=True) for n in range(3)]
    capped = [c.data for c in client.background if c.function == "news_capped"]
    assert capped == [f"0-{i}".encode() for i in range(5)]
    assert [r.get("full") for r in results] == [["capped"]] * 3


@pytest.mark.parametrize("extra, by_client_id", [
    ({}, True),  # direct subscribers only: the ledger names them by client id
    ({"payloads": ["1", "2", "3"]}, True),  # several messages sharing them
    ({"long_id": True}, True),  # a client id whose unique key is digested
    ({"unique": "order-7"}, False),  # a unique key of its own: pairs
    ({"headers": {"k": "v"}}, False),  # headers: pairs
    ({"prefix": True}, False),  # a prefix subscriber among them: pairs
])
def test_the_ledger_records_exactly_the_copies_gearmand_got(registry, extra, by_client_id):
    """Whatever form the ledger's line takes, it reads back as the very
    (queue, unique) of every copy submitted, and the look-up's width."""
    from gearhorn.store.ledger import Ledger
    from gearhorn.store.ledgerentries import rows_from_entries
    from gearhorn.store.ledgerexport import entries
    from gearhorn.store.observers import LedgerObserver

    ledger = Ledger(registry.redis, registry.keys)
    client = RecordingClient()
    svc = build_service(Config(), registry, SubscriberCache(registry), client,
                        observer=LedgerObserver(ledger))
    extra = dict(extra)
    clients = ["alice", "bob", "x" * 60 if extra.pop("long_id", False) else "carol"]
    for who in clients:
        call(svc, "subscribe_fanout", topic="news.eu", client_id=who)
    if extra.pop("prefix", False):
        call(svc, "subscribe_fanout", topic="news.*", client_id="dave")
    for _ in range(2):  # the second finds the subscribers remembered
        call(svc, "fanout", topic="news.eu", background=True,
             **({"payload": "hi"} if "payloads" not in extra else {}), **extra)
    ledger.flush()
    raw = registry.redis.xrange(registry.keys.ledger(0))
    assert any(b'{"to":' in fields[b"events"] for _, fields in raw) is by_client_id
    rows = list(rows_from_entries(entries(registry.redis, registry.keys, 1)))
    enqueued = sorted((r["subscriber"], r["unique"]) for r in rows if r["event"] == "enqueued")
    assert enqueued == sorted((c.function, c.unique) for c in client.background)
    published = [r for r in rows if r["event"] == "published"]
    assert {r["count"] for r in published} == {len(client.background) // len(published)}


def test_a_fanouts_plain_subscribers_are_recorded_by_client_id():
    from gearhorn.rules.events import Event
    from gearhorn.store.ledgerentries import (
        PUBLISHED_BATCH,
        SharedSubscribers,
        SubscriberCopies,
        batch_entry,
        published_line,
        rows_from_entries,
    )

    shared = SharedSubscribers("news", ["alice", "bob"])
    copies = SubscriberCopies("m1", shared)
    assert list(copies) == [("news_alice", "m1:alice"), ("news_bob", "m1:bob")]
    assert len(copies) == 2 and copies[1] == ("news_bob", "m1:bob")
    short = published_line(5, "m1", "news", 2, copies)
    assert short == '[5,"m1","news",2,{"to":["alice","bob"]}]'
    long = published_line(5, "m1", "news", 2, list(copies))

    def rows(line):
        entry = batch_entry(PUBLISHED_BATCH, [line], "w1")
        return [{k: v for k, v in r.items() if k != "stream_id"}
                for r in rows_from_entries([("1-0", entry)])]
    assert rows(short) == rows(long)
    assert [r["event"] for r in rows(short)] == [Event.PUBLISHED, Event.ENQUEUED, Event.ENQUEUED]
