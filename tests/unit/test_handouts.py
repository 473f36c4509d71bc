"""Hand-out counts and given-back records in Redis (gearhorn/store/handouts.py)."""

from __future__ import annotations

import pytest

from gearhorn.store.handouts import Handouts, Returned
from gearhorn.store.keys import Keys


@pytest.fixture
def handouts(fake_redis):
    return Handouts(fake_redis, Keys("t:", "chan"), ttl=60)


def test_a_message_taken_again_was_handed_out_before(handouts, fake_redis):
    assert handouts.take("q", ["a", "b"]) == [False, False]
    assert handouts.take("q", ["b", "c"]) == [True, False]
    assert handouts.take("other", ["a"]) == [False]  # per queue
    assert 0 < fake_redis.pttl("t:handouts:q") <= 60_000


def test_an_acknowledged_message_is_forgotten(handouts, fake_redis):
    handouts.take("q", ["a", "b"])
    handouts.settled("q", ["a"])
    handouts.settled("q", [])  # nothing to do, no command
    assert handouts.take("q", ["a", "b"]) == [False, True]


def test_a_message_given_back_names_its_original_and_undoes_what_never_went_out(handouts):
    handouts.take("q", ["sent", "waiting"])
    handouts.give_back("q", [Returned("t1", "sent", True), Returned("t2", "waiting", False)],
                       never_delivered=["waiting"])
    found = handouts.originals(["t1", "t2", "gone"])
    assert found == {"t1": Returned("t1", "sent", True), "t2": Returned("t2", "waiting", False)}
    assert handouts.take("q", ["sent", "waiting"]) == [True, False]
    assert handouts.originals([]) == {}


def test_acknowledged_messages_are_forgotten_with_the_next_grab(handouts):
    handouts.take("q", ["a", "b"])
    assert handouts.take("q", ["c"], settled=["a"]) == [False]
    assert handouts.take("q", ["a", "b", "c"]) == [False, True, True]


def test_an_acked_message_is_forgotten_only_once_its_completion_has_surely_landed(
        handouts, monkeypatch):
    """A kill -9 can drop a WORK_COMPLETE still in the bridge's socket buffer;
    gearmand then hands the acked job out again, and it must say
    redelivered:true, so the grab right after the ack keeps its count."""
    from gearhorn.stomp import recall as recall_module

    now = [100.0]
    monkeypatch.setattr(recall_module.time, "monotonic", lambda: now[0])
    recall = recall_module.Recall("q", handouts=handouts)
    assert recall._take(["a"]) == [False]
    recall.settled("a")
    assert recall._take(["b"]) == [False]  # the ack is fresh: "a" is still counted
    assert handouts.take("q", ["a"]) == [True]
    now[0] += recall_module.SETTLE_SECONDS
    recall._take(["c"])  # now it is forgotten
    assert handouts.take("q", ["a"]) == [False]
