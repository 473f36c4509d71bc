import json

import pytest
import redis

from gearhorn import gearman
from gearhorn.cache import SubscriberCache
from gearhorn.config import Config
from gearhorn.fanout import FanoutService, Unavailable
from gearhorn.messages import BadRequest


class RecordingClient:
    """Stands in for gearmand: records copies, answers foreground jobs."""

    def __init__(self, answers=None):
        self.background, self.foreground = [], []
        self.answers = answers or {}

    def submit_background(self, copies, precedence="normal"):
        self.background += copies
        return len(copies)

    def submit_foreground(self, copies, timeout, precedence="normal"):
        self.foreground += copies
        return [self.answers.get(c.function, gearman.Outcome("complete", b"ok")) for c in copies]


@pytest.fixture
def service(registry):
    client = RecordingClient()
    svc = FanoutService(Config(max_payload_bytes=1000), registry,
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


def test_foreground_fanout_reports_failures_per_subscriber(registry):
    client = RecordingClient({"news_bob": gearman.Outcome("timeout", reason="no answer")})
    svc = FanoutService(Config(), registry, SubscriberCache(registry), client)
    call(svc, "subscribe_fanout", topic="news", client_id="alice")
    call(svc, "subscribe_fanout", topic="news", client_id="bob")
    result = call(svc, "fanout", topic="news", payload="hi")
    assert result["copies"] == 2 and result["completed"] == 1
    assert result["failed"] == [{"client_id": "bob", "queue": "news_bob",
                                 "status": "timeout", "reason": "no answer"}]


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


def test_redis_down_is_reported_as_unavailable(registry, monkeypatch):
    svc = FanoutService(Config(), registry, SubscriberCache(registry), RecordingClient())

    def down(*args, **kwargs):
        raise redis.ConnectionError("Connection refused")

    monkeypatch.setattr(registry, "members", down)
    with pytest.raises(Unavailable, match="registry unavailable"):
        svc.handle("fanout", b'{"topic": "t", "payload": 1}')
