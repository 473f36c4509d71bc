"""A worker's answers go out once an fsync covers them, from a thread of
their own (gearhorn/worker/commits.py); the disk is a fake here."""

from __future__ import annotations

import threading

import pytest

from gearhorn.store.fsync import BarrierUnavailable, FsyncFailed, RedisLost
from gearhorn.worker.commits import Committer, Group

pytestmark = pytest.mark.timeout(30)


class Disk:
    """Durability whose wait blocks until released, or raises what it is told."""

    def __init__(self):
        self.open = threading.Event()
        self.waits = []
        self.raises = []  # exceptions the next waits raise, in order

    def wait(self, marks=None):
        self.waits.append(marks)
        if self.raises:
            raise self.raises.pop(0)
        assert self.open.wait(20)


@pytest.fixture
def committer():
    disk, sent, woken = Disk(), [], threading.Event()
    c = Committer(disk, lambda workers: sent.append(sorted(workers)), woken.set, most=4)
    c.start()
    yield c, disk, sent, woken
    disk.open.set()
    c.stop()


def group(name, log, durable=True, marks=(0,)):
    def answer(reason):
        log.append((name, reason))
        return {name}
    return Group(answer, durable, marks, redo=name)


def test_answers_wait_for_the_disk_and_one_fsync_covers_every_group_waiting(committer):
    c, disk, sent, _ = committer
    log = []
    c.put(group("a", log))
    while not disk.waits:  # a is waiting for its fsync
        threading.Event().wait(0.001)
    c.put(group("b", log))
    c.put(group("c", log))
    assert log == []  # nothing answered before the fsync
    disk.open.set()
    assert c.wait_idle(10)
    assert log == [("a", ""), ("b", ""), ("c", "")]
    assert len(disk.waits) == 2  # a alone, then b and c together
    assert c.done == 3


def test_answers_that_promise_nothing_do_not_wait(committer):
    c, disk, _, _ = committer
    log = []
    c.put(group("refused", log, durable=False))
    assert c.wait_idle(10)
    assert log == [("refused", "")] and disk.waits == []


def test_a_failed_fsync_refuses_what_it_covered_with_the_reason(committer):
    c, disk, _, _ = committer
    log = []
    disk.raises.append(FsyncFailed("fsync of the registry's Redis failed: EIO"))
    c.put(group("a", log))
    assert c.wait_idle(10)
    assert log == [("a", "fsync of the registry's Redis failed: EIO")]


def test_a_barrier_outage_fails_the_groups_with_its_reason_then_answers_again(committer):
    """Durability.wait outlasted barrier_timeout: every group waiting fails
    with the reason (never answered as done); the next group is answered."""
    c, disk, _, _ = committer
    log = []
    disk.raises.append(BarrierUnavailable("no fsync barrier serves it (waited 5s for it)"))
    c.put(group("a", log))
    assert c.wait_idle(10)
    assert log == [("a", "no fsync barrier serves it (waited 5s for it)")]
    disk.open.set()
    c.put(group("b", log))
    assert c.wait_idle(10)
    assert log[1:] == [("b", "")]


def test_a_redis_lost_after_the_writes_sends_the_group_back_to_run_again(committer):
    c, disk, _, woken = committer
    log = []
    disk.raises.append(RedisLost("connection lost since the writes"))
    c.put(group("a", log, marks=(3,)))
    assert woken.wait(10) and c.wait_idle(10)
    assert log == [] and c.take_redo() == ["a"] and c.take_redo() == []
    assert disk.waits == [(3,)]


def test_a_worker_leaving_while_answers_wait_for_the_disk_is_not_held_back():
    """With every slot waiting for a disk that does not come, a group that
    cannot be queued is dropped once the worker leaves: gearmand gives its
    jobs to another worker."""
    disk, leaving = Disk(), threading.Event()
    c = Committer(disk, lambda workers: None, lambda: None, most=1, leaving=leaving)
    c.start()
    log = []
    try:
        c.put(group("a", log))  # waits for the disk
        while not disk.waits:
            threading.Event().wait(0.001)
        c.put(group("b", log))  # queued behind it: the slot is full now
        leaving.set()
        c.put(group("c", log))  # returns, dropped
    finally:
        disk.open.set()
        c.stop()
    assert ("c", "") not in log


def test_what_the_answers_must_follow_is_written_first_once_for_every_group_waiting():
    """The ledger's entries (``before_answers``) are written before the fsync
    that covers the answers, once for all the groups answered together, and
    from the committer's thread, not the worker's."""
    disk, order = Disk(), []
    real_wait = disk.wait

    def wait(marks=None):
        order.append("fsync")
        real_wait(marks)
    disk.wait = wait
    c = Committer(disk, lambda workers: None, lambda: None, most=4,
                  before_answers=lambda: order.append(("ledger", threading.current_thread())))
    c.start()
    try:
        log = []
        c.put(group("a", log))
        while "fsync" not in order:  # a waits for its fsync
            threading.Event().wait(0.001)
        c.put(group("b", log))
        c.put(group("c", log))
        disk.open.set()
        assert c.wait_idle(10)
    finally:
        disk.open.set()
        c.stop()
    assert order == [("ledger", c), "fsync", ("ledger", c), "fsync"]
    assert log == [("a", ""), ("b", ""), ("c", "")]
