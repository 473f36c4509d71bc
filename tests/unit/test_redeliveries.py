"""Hand-out counts and given-back records in Redis (gearhorn/store/redeliveries.py)."""

from __future__ import annotations

import pytest

from gearhorn.store.keys import Keys
from gearhorn.store.redeliveries import Redeliveries, Returned


@pytest.fixture
def handouts(fake_redis):
    return Redeliveries(fake_redis, Keys("t:", "chan"), ttl=60)


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


class JobAnswers:
    """A worker connection as JobInfo sees it (gearman.WorkerConnection)."""

    def __init__(self):
        self.answers_given = self.answers_read = 0
        self.is_open = True

    def complete(self):
        self.answers_given += 1


def test_an_acked_message_is_forgotten_only_once_gearmand_read_its_completion(handouts):
    """A kill -9 can drop a WORK_COMPLETE still in the bridge's socket buffers;
    gearmand then hands the acked job out again, and it must say
    redelivered:true, so a grab before gearmand surely read the completion
    keeps its count."""
    from gearhorn.stomp.queues.jobinfo import JobInfo

    recall, worker = JobInfo("q", handouts=handouts), JobAnswers()
    assert recall._take(["a", "b"]) == [False, False]
    worker.complete()
    recall.settled("a", worker)
    worker.complete()
    recall.settled("b", worker)
    assert recall._take(["c"]) == [False]  # neither completion read yet: both counted
    assert handouts.take("q", ["a", "b"]) == [True, True]
    worker.answers_read = 1  # a GRAB's reply: gearmand read the first completion
    recall._take(["d"])
    assert handouts.take("q", ["a", "b"]) == [False, True]
    worker.answers_read = 2
    recall._take(["e"])
    assert handouts.take("q", ["b"]) == [False]
    assert not recall.unwritten


def test_a_completion_whose_connection_broke_keeps_the_count(handouts):
    """gearmand may never have read it: the job may come again, redelivered."""
    from gearhorn.stomp.queues.jobinfo import JobInfo

    recall, worker = JobInfo("q", handouts=handouts), JobAnswers()
    recall._take(["a"])
    worker.complete()
    recall.settled("a", worker)
    worker.is_open = False
    recall._take(["b"])
    assert not recall.unwritten  # not kept for ever either: it expires with the hash
    assert handouts.take("q", ["a"]) == [True]


def test_a_closing_dispatcher_forgets_only_the_counts_of_completions_gearmand_read(handouts):
    from gearhorn.stomp.queues.jobinfo import JobInfo

    recall, worker = JobInfo("q", handouts=handouts), JobAnswers()
    recall._take(["a", "b"])
    for unique in ("a", "b"):
        worker.complete()
        recall.settled(unique, worker)
    worker.answers_read = 1  # "b"'s completion may still be in the socket's buffers
    recall.write_settled()
    assert not recall.unwritten
    assert handouts.take("q", ["a", "b"]) == [False, True]
