"""Jobs a worker took together (FanoutService.run): consecutive plain
fanouts share one subscriber look-up (one round trip for all their topics)
and one Gearman write; any other job runs alone, in its place."""

import json

import pytest

from gearhorn import gearman
from gearhorn.config import Config
from gearhorn.errors import BadRequest
from gearhorn.rules.naming import message_ids_for
from gearhorn.store.subscribers import SubscriberCache
from gearhorn.worker.jobs import Job, ServiceUnavailable
from gearhorn.worker.wiring import build_service
from tests.fakes import RecordingClient


def fanout(unique, topic="news", **extra):
    body = {"topic": topic, "payload": unique, "background": True, **extra}
    return Job("fanout", json.dumps(body).encode(), unique)


def subscribe(topic, who):
    return Job("subscribe_fanout", json.dumps({"topic": topic, "client_id": who}).encode())


@pytest.fixture
def service(registry, monkeypatch):
    client = RecordingClient()
    svc = build_service(Config(max_payload_bytes=1000), registry, SubscriberCache(registry),
                        client)
    looked_up = []  # the topics of each round trip
    members_with = registry.members_with

    def counted(cached, also=()):
        looked_up.append(list(cached))
        return members_with(cached, also)

    monkeypatch.setattr(registry, "members_with", counted)
    for group in svc.run([subscribe("news", "alice"), subscribe("news", "bob"),
                          subscribe("sport", "carol")]):
        assert not isinstance(group[0], BadRequest)
    looked_up.clear()
    return svc, client, looked_up


def by_queue(client):
    """Each queue's copies in the order written (the order among a topic's
    subscribers is a Redis set's, so any)."""
    queues = {}
    for copy in client.background:
        queues.setdefault(copy.function, []).append(copy.data)
    return queues


def test_plain_fanouts_taken_together_share_one_look_up_and_one_write(service):
    svc, client, looked_up = service
    groups = list(svc.run([fanout("n1"), fanout("n2"), fanout("s1", "sport"), fanout("n3")]))
    assert [len(g) for g in groups] == [4]
    results = [json.loads(r) for r in groups[0]]
    assert [(r["topic"], r["copies"]) for r in results] == [
        ("news", 2), ("news", 2), ("sport", 1), ("news", 2)]
    # the ids a job gets alone: the same each time its Gearman unique key comes
    ids = [message_ids_for(unique, 1)[0] for unique in ("n1", "n2", "s1", "n3")]
    assert [r["message_id"] for r in results] == ids
    assert looked_up == [["news", "sport"]]  # one round trip for both topics
    assert client.precedences == ["normal"]  # one write
    assert by_queue(client) == {"news_alice": [b"n1", b"n2", b"n3"],
                                "news_bob": [b"n1", b"n2", b"n3"], "sport_carol": [b"s1"]}
    assert sorted(c.unique for c in client.background if c.data == b"n1") == [
        f"{ids[0]}:alice", f"{ids[0]}:bob"]


def test_any_other_job_runs_alone_in_its_place(service):
    svc, client, _ = service
    jobs = [fanout("n1"), fanout("n2"), subscribe("news", "dave"), fanout("n3"),
            Job("fanout", b"{not json", "bad"), fanout("n4", priority="high"),
            fanout("n5", priority="high"), fanout("n6", headers={"k": "v"}), fanout("n7")]
    groups = list(svc.run(jobs))
    assert [len(g) for g in groups] == [2, 1, 1, 1, 2, 1, 1]
    flat = [outcome for group in groups for outcome in group]
    assert isinstance(flat[4], BadRequest) and "JSON" in str(flat[4])
    assert json.loads(flat[2])["subscribers"] == 3
    # dave is in every fanout after his subscription, in none before it
    queues = by_queue(client)
    assert queues["news_dave"] == [b"n3", b"n4", b"n5", b"n6", b"n7"]
    assert queues["news_alice"] == [b"n1", b"n2", b"n3", b"n4", b"n5", b"n6", b"n7"]
    assert client.precedences == ["normal", "normal", "high", "normal", "normal"]


def test_an_outage_stops_the_run_after_the_groups_that_are_done(service):
    svc, client, _ = service
    written = []

    def submit_background(copies, precedence="normal"):
        if written:
            raise gearman.GearmanError("lost gearmand 127.0.0.1:4730")
        written.append(list(copies))
        return len(copies)

    client.submit_background = submit_background
    run = svc.run([fanout("n1"), subscribe("news", "erin"), fanout("n2")])
    assert json.loads(next(run)[0])["copies"] == 2
    assert json.loads(next(run)[0])["subscribers"] == 3
    with pytest.raises(ServiceUnavailable, match="gearmand unavailable"):
        next(run)
    assert [c.data for c in written[0]] == [b"n1", b"n1"]


def test_a_fanout_to_no_one_completes_with_no_copies(service):
    svc, client, _ = service
    [outcomes] = svc.run([fanout("q1", "quiet"), fanout("q2", "quiet")])
    assert [json.loads(o)["copies"] for o in outcomes] == [0, 0]
    assert client.background == []
