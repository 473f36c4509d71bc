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
