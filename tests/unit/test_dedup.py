"""Publisher deduplication: parsed, claimed once per topic and window, released
only when a fanout was refused before any copy."""

import json

import pytest

from gearhorn.config import Config
from gearhorn.errors import BadRequest
from gearhorn.rules.messages import DEDUP_HEADER, parse_fanout
from gearhorn.stomp.protocol.frames import Frame
from gearhorn.store.subscribers import SubscriberCache
from gearhorn.worker.wiring import build_service
from tests.fakes import FakeBroker, FakeTransport, RecordingClient, session_without_sockets

pytestmark = pytest.mark.timeout(10)


class Over:
    """A queue store over its guard, until told otherwise."""

    bounded = frozenset()  # no reject-publish queue here

    def __init__(self):
        self.reason = "queue store full: 95 MiB of 100 MiB used"

    def current(self):
        return frozenset(), self.reason

    def read_again(self):
        return self.current()[0]


def fanout(svc, unique="", **job):
    return json.loads(svc.handle("fanout", json.dumps({"topic": "news", **job}).encode(),
                                 unique))


@pytest.fixture
def service(registry):
    client = RecordingClient()
    svc = build_service(Config(dedup_window=120), registry, SubscriberCache(registry), client)
    svc.handle("subscribe_fanout", b'{"topic": "news", "client_id": "alice"}')
    return svc, client


def test_dedup_id_comes_from_the_job_or_the_stomp_header():
    assert parse_fanout(b'{"topic": "t", "payload": "x", "dedup_id": "order-7"}').dedup_id \
        == "order-7"
    job = {"topic": "t", "payload": "x", "headers": {DEDUP_HEADER: "sha-1"}}
    assert parse_fanout(json.dumps(job).encode()).dedup_id == "sha-1"
    assert parse_fanout(b'{"topic": "t", "payload": "x"}').dedup_id is None


@pytest.mark.parametrize("job, reason", [
    ({"dedup_id": 7}, "dedup_id must be a string, not a number"),
    ({"dedup_id": ""}, "invalid dedup_id"),
    ({"dedup_id": "has space"}, "invalid dedup_id"),
    ({"dedup_id": "x" * 201}, "use 1 to 200 printable"),
    ({"payloads": ["a", "b"], "dedup_id": "d"}, "dedup_id applies to one message"),
])
def test_a_bad_dedup_id_is_refused_in_one_line(job, reason):
    body = {"topic": "t", "payload": "x", **job}
    if "payloads" in job:
        del body["payload"]
    with pytest.raises(BadRequest, match=reason):
        parse_fanout(json.dumps(body).encode())


def test_the_same_id_again_is_a_duplicate_with_no_copies(service, fake_redis, registry):
    svc, client = service
    first = fanout(svc, payload="a", background=True, dedup_id="order-7")
    again = fanout(svc, payload="a", background=True, dedup_id="order-7")
    assert first["copies"] == 1 and "duplicate" not in first
    assert again == {"topic": "news", "copies": 0, "duplicate": True, "background": True,
                     "message_id": first["message_id"]}
    assert len(client.background) == 1
    ttl = fake_redis.pttl(registry.keys.dedup("news", "order-7"))
    assert 119_000 < ttl <= 120_000


def test_ids_are_per_topic_and_the_same_job_run_again_goes_on(service):
    svc, client = service
    svc.handle("subscribe_fanout", b'{"topic": "sports", "client_id": "alice"}')
    first = fanout(svc, "job-1", payload="a", background=True, dedup_id="d")
    other_topic = json.loads(svc.handle("fanout", json.dumps(
        {"topic": "sports", "payload": "a", "background": True, "dedup_id": "d"}).encode()))
    rerun = fanout(svc, "job-1", payload="a", background=True, dedup_id="d")
    assert other_topic["copies"] == 1 and "duplicate" not in other_topic
    # The worker died and gearmand gave the job to another: same ids, same copies.
    assert rerun["copies"] == 1 and rerun["message_id"] == first["message_id"]
    assert client.background[0].unique == client.background[2].unique


def test_a_fanout_refused_before_any_copy_frees_its_id(service):
    svc, client = service
    svc.fanouts.pressure = Over()
    with pytest.raises(BadRequest, match="queue store full"):
        fanout(svc, payload="a", background=True, dedup_id="d")
    svc.fanouts.pressure.reason = ""
    assert fanout(svc, payload="a", background=True, dedup_id="d")["copies"] == 1


def test_a_window_of_zero_turns_deduplication_off(registry):
    client = RecordingClient()
    svc = build_service(Config(dedup_window=0), registry, SubscriberCache(registry), client)
    svc.handle("subscribe_fanout", b'{"topic": "news", "client_id": "alice"}')
    for _ in range(2):
        assert fanout(svc, payload="a", background=True, dedup_id="d")["copies"] == 1


def test_a_stomp_send_told_duplicate_says_so_in_its_receipt():
    transport, broker = FakeTransport(), FakeBroker()
    s = session_without_sockets(broker.backend(), transport)
    s.handle(Frame("CONNECT", {"accept-version": "1.2"}))
    for value, rid in (("new", "r1"), ("seen", "r2")):
        s.handle(Frame("SEND", {"destination": "/topic/t", DEDUP_HEADER: value,
                                "receipt": rid}, b"x"))
    receipts = [f.headers for f in transport.frames if f.command == "RECEIPT"]
    assert receipts == [{"receipt-id": "r1"}, {"receipt-id": "r2", "x-duplicate": "true"}]
