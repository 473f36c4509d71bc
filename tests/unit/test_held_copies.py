"""The records of held copies (gearhorn/store/heldcopies.py) on fakeredis:
what a record keeps, the unique each generation goes under, and what a
holder that takes over another's copies finds."""

from __future__ import annotations

import fakeredis
import pytest

from gearhorn.rules.naming import header_id_of
from gearhorn.store.heldcopies import HeldCopies, HeldCopy, key_of
from gearhorn.store.keys import Keys

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def store():
    return HeldCopies(fakeredis.FakeRedis(), Keys())


def test_a_record_keeps_everything_a_copy_is_handed_with():
    copy = HeldCopy("news_alice", "m1:alice", b"a\0binary\nbody", "w1", "high", 3)
    again = HeldCopy.decode("news_alice", copy.encode())
    assert again == copy
    assert copy.handed().unique == "m1:alice^3" and copy.handed().data == copy.data
    long = HeldCopy("q", "m" * 63, b"x", "w1", generation=46655)
    assert len(long.handed().unique) == 63 and key_of(long.handed().unique) == long.key


@pytest.mark.parametrize("unique", ["m1:alice", "@" + "a" * 32 + ":bob", "h:" + "f" * 60,
                                    "m1:bob^3", "m1:carol^", "!m2:dave^07"])
@pytest.mark.parametrize("generation", [0, 1, 3, 17])
def test_an_answer_forgets_exactly_the_copy_it_was_for(store, unique, generation):
    """Whatever the copy's own unique holds (a client id may end in ^3), the
    answer to any of its generations drops its record and no other's."""
    other = HeldCopy("q", "m1:bob", b"x", "w1", generation=3)  # "m1:bob^3" handed
    copy = HeldCopy("q", unique, b"x", "w1", generation=generation)
    store.keep([other, copy])
    store.forget([("q", copy.handed().unique)])
    left = {c.unique for c in store.held_by("w1")}
    assert unique not in left
    assert left == {"m1:bob"} - {unique}


def test_a_holders_copies_are_found_queue_by_queue_and_only_its_own(store):
    store.keep([HeldCopy("q1", "m1", b"a", "w1"), HeldCopy("q2", "m1", b"b", "w1"),
                HeldCopy("q1", "m2", b"c", "w2")])
    assert sorted((c.queue, c.unique) for c in store.held_by("w1")) == [("q1", "m1"),
                                                                        ("q2", "m1")]
    assert store.holders() == ["w1", "w2"]
    store.keep([HeldCopy("q1", "m1", b"a", "w1", generation=4)])
    store.forget([("q1", "m1^4")])  # an answer names its generation
    assert store.count("q1") == 1 and [c.unique for c in store.held_by("w1")] == ["m1"]


def alive(*ids):
    """``claim``'s question: is this claimer alive now?"""
    return set(ids).__contains__


def test_a_takeover_hands_the_next_generation_and_retires_the_dead_holder(store):
    store.keep([HeldCopy("q1", "m1", b"a", "dead", "low", 2)])
    assert store.claim("dead", "alive", alive("alive", "other"))
    assert not store.claim("dead", "other", alive("alive", "other"))  # one taker at a time
    [moved] = store.hand_over(list(store.held_by("dead")), "alive")
    store.retire("dead")
    assert (moved.holder, moved.generation, moved.precedence) == ("alive", 3, "low")
    assert list(store.held_by("dead")) == [] and store.holders() == ["alive"]
    [kept] = list(store.held_by("alive"))
    assert kept == moved  # written before it is handed: a second loss goes to 4


def test_a_claim_ends_with_its_claimer_not_only_with_its_time(store):
    """A claimer killed mid-takeover (a power cut takes the whole node)
    leaves its claim behind, good for a minute: the copies it was taking
    over must not wait for that minute, nor be taken twice meanwhile."""
    assert store.claim("dead", "w1", alive("w1"))
    assert not store.claim("dead", "w2", alive("w1", "w2"))  # w1 is alive: still its claim
    assert store.claim("dead", "w1", alive("w1", "w2"))  # its own claim, again after an error
    assert store.claim("dead", "w2", alive("w2"))  # w1 died with its claim: w2 takes it
    assert not store.claim("dead", "w3", alive("w2", "w3"))
    store.redis.set(store.keys.taking_over("old"), "1", ex=60)  # an older version's claim
    assert store.claim("old", "w2", alive("w2"))


def test_a_copy_kept_again_is_not_handed_again_its_holder_has_it(store):
    """A fanout run again (a producer's retry, or a replay after its worker
    died) keeps the same copies: each is held already, by its holder or by
    whoever takes over from it, so it goes out once, as gearmand's
    coalescing did, and never under a unique handed out before."""
    [first] = store.keep([HeldCopy("q", "m1:alice", b"a", "dead")])
    assert first.generation == 0 and first.handed().unique == "m1:alice^0"
    assert [c.unique for c in store.keep([HeldCopy("q", "m1:alice", b"a", "w2"),
                                          HeldCopy("q", "m2:alice", b"b", "w2")])] == [
        "m2:alice"]
    [taken] = store.hand_over(list(store.held_by("dead")), "w3")
    assert (taken.unique, taken.generation, taken.holder) == ("m1:alice", 1, "w3")
    # a hand-over never goes under a generation that was handed out already
    [later] = store.hand_over([first.again("dead")], "w4")  # read before w3's hand-over
    assert later.generation == 2


def test_a_copy_answered_before_its_hand_over_is_not_handed_again(store):
    store.keep([HeldCopy("q", "m1", b"a", "dead"), HeldCopy("q", "m2", b"b", "dead")])
    found = list(store.held_by("dead"))
    store.forget([("q", "m1^0")])  # answered while the taker read the records
    moved = store.hand_over(found, "alive")
    assert [(c.unique, c.generation) for c in moved] == [("m2", 1)]
    assert store.count("q") == 1


def test_a_long_unique_that_names_its_headers_keeps_them_when_held():
    """A STOMP subscriber's copy (``@<header id>:<client id>``, long ids
    digested) still names its headers under its held unique, so the bridge
    gives the MESSAGE the destination it was published to."""
    header_id = "0123456789abcdef" * 2
    copy = HeldCopy("q", f"@{header_id}:" + "s" * 29, b"x", "w1", generation=5)
    handed = copy.handed().unique
    assert len(handed) <= 63 and header_id_of(handed) == header_id
    assert key_of(handed) == copy.key != copy.unique
