"""The waiting side of the fsync barrier (gearhorn/store/fsync.py's
FsyncBarrier and Watcher) on fakeredis, with the test as the syncer: it
listens for wakes and publishes the rounds. A wait returns only once a
round covers its ticket, fails with a failed round's reason, and ends with
RedisLost when the connection it listened on broke."""

from __future__ import annotations

import threading

import fakeredis
import pytest

from gearhorn.store.fsync import (
    SYNCED,
    WAKE,
    BarrierUnavailable,
    FsyncBarrier,
    FsyncFailed,
    Round,
)

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def server():
    return fakeredis.FakeServer()


@pytest.fixture
def barrier(server):
    made = FsyncBarrier(fakeredis.FakeRedis(server=server), "the test's Redis")
    yield made
    made.close()


class Syncer:
    """The test's side: a listener on WAKE (so a ticket finds a syncer)
    that publishes the rounds it is told to."""

    def __init__(self, server):
        self.client = fakeredis.FakeRedis(server=server)
        self.wakes = self.client.pubsub()
        self.wakes.subscribe(WAKE)

    def publish(self, round_):
        self.client.publish(SYNCED, round_.encode())

    def leave(self):
        self.wakes.unsubscribe(WAKE)
        self.wakes.close()


@pytest.fixture
def syncer(server):
    made = Syncer(server)
    yield made
    made.wakes.close()


class Waiting:
    """``barrier.wait`` in a thread: its outcome once it ends."""

    def __init__(self, barrier, ticket, epoch):
        self.outcome = None
        self.thread = threading.Thread(target=self._run, args=(barrier, ticket, epoch),
                                       daemon=True)
        self.thread.start()

    def _run(self, barrier, ticket, epoch):
        try:
            barrier.wait(ticket, epoch)
            self.outcome = "ok"
        except Exception as exc:  # noqa: BLE001 - the outcome under test
            self.outcome = exc

    def ended(self, timeout=10.0):
        self.thread.join(timeout)
        return not self.thread.is_alive()


def heard(barrier, last):
    watcher = barrier.watcher
    with watcher.changed:
        assert watcher.changed.wait_for(lambda: watcher.progress.synced >= last, 10), \
            f"the watcher never heard the round up to {last}"


def test_a_wait_ends_only_once_a_round_covers_its_ticket(barrier, syncer):
    ticket, epoch = barrier.ticket()
    assert ticket == 1
    second, _ = barrier.ticket()
    waiting = Waiting(barrier, second, epoch)
    syncer.publish(Round(0, 1))
    heard(barrier, 1)
    assert waiting.thread.is_alive() and waiting.outcome is None  # 2 is not covered
    syncer.publish(Round(1, 2))
    assert waiting.ended() and waiting.outcome == "ok"


def test_a_failed_round_fails_its_tickets_with_the_reason(barrier, syncer):
    ticket, epoch = barrier.ticket()
    waiting = Waiting(barrier, ticket, epoch)
    syncer.publish(Round(0, 1, "[Errno 5] Input/output error"))
    assert waiting.ended()
    assert isinstance(waiting.outcome, FsyncFailed) and "Input/output" in str(waiting.outcome)
    syncer.publish(Round(1, 3))  # a later success does not cover it
    heard(barrier, 3)
    with pytest.raises(FsyncFailed):
        barrier.wait(ticket, epoch)


def test_a_broken_connection_ends_the_wait_and_moves_the_mark(server, barrier, syncer):
    """The wait ends with the loss said: RedisLost when the listener saw the
    connection break first, BarrierUnavailable (its base) when the wait's
    own nudge to the syncer failed first; both are the same outage to
    Durability. The mark moves once the listener saw it."""
    ticket, epoch = barrier.ticket()
    mark = barrier.mark()
    waiting = Waiting(barrier, ticket, epoch)
    server.connected = False  # the Redis went away: a round for the ticket may be lost
    assert waiting.ended() and isinstance(waiting.outcome, BarrierUnavailable)
    watcher = barrier.watcher
    with watcher.changed:  # Durability.wait(marks) then sees the writes may be gone
        assert watcher.changed.wait_for(lambda: barrier.mark() != mark, 10)
    server.connected = True
    ticket, epoch = barrier.ticket()  # listening again: a new epoch
    waiting = Waiting(barrier, ticket, epoch)
    syncer.publish(Round(0, ticket))
    assert waiting.ended() and waiting.outcome == "ok"


def test_no_syncer_listening_is_said_at_the_ticket(server):
    barrier = FsyncBarrier(fakeredis.FakeRedis(server=server), "the test's Redis")
    try:
        with pytest.raises(BarrierUnavailable, match="no fsync barrier serves the test's Redis"):
            barrier.ticket()
    finally:
        barrier.close()


def test_a_syncer_gone_while_a_ticket_waits_is_said(barrier, syncer, monkeypatch):
    from gearhorn.store import fsync

    monkeypatch.setattr(fsync, "NUDGE_EVERY", 0.05)  # the waiter wakes the syncer again soon
    ticket, epoch = barrier.ticket()
    waiting = Waiting(barrier, ticket, epoch)
    syncer.leave()  # no round will come: the wait must not last for ever
    assert waiting.ended()
    assert isinstance(waiting.outcome, BarrierUnavailable)
    assert "stopped serving" in str(waiting.outcome)


def test_a_listener_that_fails_unexpectedly_listens_again(barrier, syncer, monkeypatch):
    """redis-py raises TypeError when its socket is closed under a read: the
    watcher must not die of it (every wait would then hang), but count it
    as a broken connection and listen again."""
    from gearhorn.store import fsync

    ticket, epoch = barrier.ticket()
    real = fakeredis.FakeRedis.pubsub
    failing = {"left": 1}

    def pubsub(self, **kwargs):
        made = real(self, **kwargs)
        if failing["left"]:
            failing["left"] -= 1

            def broken(timeout=0.0):
                raise TypeError("argument must be an int, or have a fileno() method.")
            made.get_message = broken
        return made
    watcher = barrier.watcher
    watcher.stop(wait=5)  # the one started by ticket(): replaced by a failing one
    barrier.watcher = fsync.Watcher(barrier.client, barrier.name)
    monkeypatch.setattr(fakeredis.FakeRedis, "pubsub", pubsub)
    # The first listener fails while it subscribes; the watcher counts a
    # broken connection (a new epoch) and its second listener serves.
    assert barrier.watcher.ensure_started(10) == 1 and not failing["left"]
    ticket, epoch = barrier.ticket()
    waiting = Waiting(barrier, ticket, epoch)
    syncer.publish(Round(0, ticket))
    assert waiting.ended() and waiting.outcome == "ok"
