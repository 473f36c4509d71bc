"""The records of held copies (gearhorn/store/heldcopies.py) on fakeredis:
what a record keeps, the unique each generation goes under, and what a
holder that takes over another's copies finds."""

from __future__ import annotations

import fakeredis
import pytest

from gearhorn.rules.naming import header_id_of
from gearhorn.store.heldcopies import Fenced, HeldCopies, HeldCopy, key_of
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
    assert store.queues_of("w1") == ["q1", "q2"] and store.owners("q1") == {"w1": 0, "w2": 0}
    store.forget([("q1", "m1^0")])  # an answer names its generation
    assert store.count("q1") == 1 and [c.unique for c in store.held_by("w1")] == ["m1"]


def test_a_copy_kept_again_is_not_handed_again_its_holder_has_it(store):
    """A fanout run again (a producer's retry, or a replay after its worker
    died) keeps the same copies: each is held already, by its holder or by
    whoever takes over from it, so it goes out once, as gearmand's
    coalescing did."""
    [first] = store.keep([HeldCopy("q", "m1:alice", b"a", "dead")])
    assert first.generation == 0 and first.handed().unique == "m1:alice^0"
    assert [c.unique for c in store.keep([HeldCopy("q", "m1:alice", b"a", "w2"),
                                          HeldCopy("q", "m2:alice", b"b", "w2")])] == [
        "m2:alice"]


def test_a_holder_hands_again_only_what_is_still_its_own_at_that_generation(store):
    store.keep([HeldCopy("q", "m1", b"a", "w1"), HeldCopy("q", "m2", b"b", "w1"),
                HeldCopy("q", "m3", b"c", "w2")])
    found = {c.unique: c for c in store.records("q")}
    [again] = store.hand_again([found["m1"]], "w1")
    assert (again.generation, again.holder) == (1, "w1")
    # read before that hand again: its generation is gone, so is w2's copy
    assert store.hand_again([found["m1"], found["m3"]], "w1") == []
    store.forget([("q", "m2^0")])  # answered meanwhile
    assert store.hand_again([found["m2"]], "w1") == []


def test_an_answer_to_an_older_generation_leaves_a_copy_handed_again_since(store):
    [copy] = store.keep([HeldCopy("q", "m1", b"a", "w1")])
    store.hand_again([copy], "w1")  # now at generation 1
    store.forget([("q", "m1^0")])
    assert store.count("q") == 1
    store.forget([("q", "m1^2")])  # a later one (the write of 2 was lost): it goes
    assert store.count("q") == 0


def test_a_fenced_holder_writes_nothing_more_in_that_queue(store):
    [copy] = store.keep([HeldCopy("q", "m1", b"a", "zombie")])
    assert store.fence("q", ["zombie"]) == {"zombie"}
    with pytest.raises(Fenced):
        store.keep([HeldCopy("q", "m2", b"b", "zombie")])
    with pytest.raises(Fenced):
        store.hand_again([copy], "zombie")
    store.keep([HeldCopy("other", "m2", b"b", "zombie")])  # elsewhere it may, until fenced
    assert store.count("q") == 1


def test_a_taker_takes_a_record_only_from_a_fenced_owner_as_it_read_it(store):
    store.keep([HeldCopy("q", "m1", b"a", "dead"), HeldCopy("q", "m2", b"b", "alive")])
    found = {c.unique: c for c in store.records("q")}
    assert store.take("q", "taker", [(found["m1"], 0)]) == []  # not fenced yet
    store.fence("q", ["dead"])
    store.forget([("q", "m1^0")])
    assert store.take("q", "taker", [(found["m1"], 0), (found["m2"], 1)]) == []
    store.keep([HeldCopy("q", "m3", b"c", "dead2")])
    store.fence("q", ["dead2"])
    [taken] = store.take("q", "taker", [(next(c for c in store.records("q")
                                              if c.unique == "m3"), 1)])
    assert (taken.holder, taken.generation, taken.data) == ("taker", 1, b"c")
    assert store.records("q") and store.owners("q")["taker"] == 0


def test_the_owners_of_a_queue_go_with_its_last_record(store):
    store.keep([HeldCopy("q", "m1", b"a", "w1")])
    store.fence("q", ["w0"])
    store.forget([("q", "m1^0")])
    assert store.owners("q") == {}


def test_a_long_unique_that_names_its_headers_keeps_them_when_held():
    """A STOMP subscriber's copy (``@<header id>:<client id>``, long ids
    digested) still names its headers under its held unique, so the bridge
    gives the MESSAGE the destination it was published to."""
    header_id = "0123456789abcdef" * 2
    copy = HeldCopy("q", f"@{header_id}:" + "s" * 29, b"x", "w1", generation=5)
    handed = copy.handed().unique
    assert len(handed) <= 63 and header_id_of(handed) == header_id
    assert key_of(handed) == copy.key != copy.unique


def test_a_keep_run_twice_reports_what_it_wrote_both_times(store):
    """CI, 2026-12-07: a cluster master killed after it applied a keep and
    before its reply; the client ran the call again on the promoted replica,
    which had the records, and the copies, reported held already, were
    never handed (64 acknowledged copies stranded). Another holder's record,
    or another body, is still left alone."""
    copy = HeldCopy("q", "m1:alice", b"a", "w1")
    assert store.keep([copy]) == [copy]
    assert store.keep([copy]) == [copy]
    assert store.keep([HeldCopy("q", "m1:alice", b"a", "w2")]) == []
    assert store.keep([HeldCopy("q", "m1:alice", b"other", "w1")]) == []
