import threading
import time

import pytest

from gearhorn.store.keys import Keys
from gearhorn.worker.delayed import DelayedItem, Releaser, Scheduler


@pytest.fixture
def scheduler(fake_redis):
    return Scheduler(fake_redis, Keys("t:"), shard_seconds=0.1, lease_seconds=0.2, lanes=3)


def item(n, due, **kw):
    return DelayedItem(due, (f"m{n}",), (f"body {n}".encode(),), topic="news", **kw)


def test_item_survives_its_json_form():
    original = DelayedItem(12.5, ("a", "b"), (b"\x00\xff", b"x"), topic="t", unique=None,
                           priority="high", header_ids=("1" * 32, "2" * 32))
    assert DelayedItem.from_json(original.to_json()) == original


def test_messages_spread_over_shards_and_nothing_is_taken_early(scheduler, fake_redis):
    now = time.time()
    for n in range(20):  # a minute ahead: none is due, however slow the machine
        assert scheduler.schedule(item(n, now + 60 + n * 0.05))
    shards = list(fake_redis.scan_iter("{t:due:*}:[0-9]*"))
    lanes = {key.split(b"}")[0] for key in shards}
    assert len(shards) >= 5 and len(lanes) == 3 and scheduler.pending() == 20
    assert scheduler.take() == []


def test_a_due_message_is_not_kept(scheduler):
    assert scheduler.schedule(item(1, time.time() - 1)) is False
    assert scheduler.pending() == 0


def test_each_due_message_goes_to_exactly_one_of_several_takers(scheduler):
    due = time.time() + 1
    # A message whose time has passed by the time it is scheduled is not
    # kept (the caller sends it at once): on a loaded machine some may be.
    kept = [f"m{n}" for n in range(300) if scheduler.schedule(item(n, due))]
    assert kept
    got, lock = [], threading.Lock()

    def take():
        deadline = time.monotonic() + 60  # a safety net: they stop once all are taken
        while time.monotonic() < deadline:
            taken = scheduler.take(limit=7)
            scheduler.done(taken)
            with lock:
                got.extend(i.message_ids[0] for _, i in taken)
                if len(got) >= len(kept):
                    return

    takers = [threading.Thread(target=take) for _ in range(4)]
    for t in takers:
        t.start()
    for t in takers:
        t.join()
    assert sorted(got) == sorted(kept)  # each once
    assert time.time() >= due and scheduler.pending() == 0


def test_a_taken_message_never_marked_done_comes_back_after_its_lease(scheduler):
    assert scheduler.schedule(item(1, time.time() + 1))
    first = []
    while not first:
        first = scheduler.take()
    assert scheduler.take() == []  # leased
    again = []
    while not again:  # the taker "died": the lease (0.2 s) ends
        again = scheduler.take()
    assert again[0][1] == first[0][1]


def test_releaser_sends_due_messages_and_keeps_failed_ones(scheduler):
    sent, failing = [], {"m2"}

    def send(delayed):
        if delayed.message_ids[0] in failing:
            raise ConnectionError("gearmand away")
        sent.append(delayed.message_ids[0])

    due = time.time() + 1
    assert scheduler.schedule(item(1, due))
    assert scheduler.schedule(item(2, due + 0.001))
    releaser = Releaser(scheduler, send, interval=0.01)
    with pytest.raises(ConnectionError):
        while len(sent) < 2:
            releaser.release_due()
    assert sent == ["m1"]
    assert scheduler.pending() == 1  # m2 stays, to be sent after its lease
    failing.clear()
    while "m2" not in sent:
        releaser.release_due()
    assert sorted(sent) == ["m1", "m2"] and scheduler.pending() == 0


def test_a_cursor_far_behind_catches_up_call_by_call(scheduler, fake_redis):
    due = time.time() + 1
    assert scheduler.schedule(item(1, due))
    shard = int(due * 1000) // scheduler.width_ms
    fake_redis.set(scheduler.keys.due_cursor(scheduler.lane(item(1, due))),
                   shard - 3500)  # as after a long outage
    calls, taken = 0, []
    while not taken and calls < 1000:  # polls until due (1 s), 10 ms apart
        calls += 1
        taken = scheduler.take(max_shards=1000)
        time.sleep(0.01)
    assert [i.message_ids for _, i in taken] == [("m1",)]
    assert calls >= 4  # 1,000 shards a call at most
