import json
import math
import threading
import time

import pytest

from gearhorn.store.delayed import DelayedItem, Releaser, Scheduler
from gearhorn.store.keys import Keys


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


def test_each_due_message_goes_to_exactly_one_of_several_takers(fake_redis):
    # A lease longer than any taker takes between take and done, even on a
    # loaded machine: with the fixture's 0.2 s, a slow taker's messages came
    # back to another taker (that is the lease doing its job, tested below).
    scheduler = Scheduler(fake_redis, Keys("t:"), shard_seconds=0.1, lease_seconds=60, lanes=3)
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
    releaser = Releaser(scheduler, send, longest=0.01)
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



# -- sleeping until due, woken by announcements ------------------------------------------


@pytest.fixture
def wide(fake_redis):
    """An hour-wide shard: the shards a take looks at hold every message here."""
    return Scheduler(fake_redis, Keys("t:"), shard_seconds=3600)


def announcements(fake_redis):
    pubsub = fake_redis.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe("__matchmaking")
    return pubsub


def test_take_tells_when_the_next_message_is_due(wide):
    assert wide.take_next() == ([], None)
    assert wide.schedule(item(1, time.time() + 600))
    taken, next_in = wide.take_next()
    # Due once its (rounded down) millisecond is over: up to 1 ms past 600 s
    # when the take runs within the millisecond the message was scheduled in.
    assert taken == [] and 590 < next_in <= 600.001


def test_a_message_first_in_its_shard_is_announced_a_later_one_not(wide, fake_redis):
    pubsub = announcements(fake_redis)
    shard_start = (int(time.time()) // 3600 + 1) * 3600  # the next hour-wide shard
    assert wide.schedule(item(1, shard_start + 600))
    assert wide.schedule(item(2, shard_start + 900))  # after the first: found by a take
    assert wide.schedule(item(3, shard_start + 300))  # before it: sleepers must wake
    heard = []
    deadline = time.monotonic() + 30
    while len(heard) < 2 and time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.1)
        if message:
            heard.append(json.loads(message["data"]))
    assert [m["op"] for m in heard] == ["due", "due"]
    first_in, third_in = ((shard_start + at - time.time()) * 1000 for at in (600, 300))
    assert first_in < heard[0]["in_ms"] <= first_in + 30_000
    assert third_in < heard[1]["in_ms"] <= third_in + 30_000
    assert pubsub.get_message(timeout=0.1) is None  # nothing for message 2


def test_an_announcement_wakes_the_releaser_only_when_earlier_than_its_sleep(wide, caplog):
    releaser = Releaser(wide, lambda item: None, longest=3600)
    releaser._wake_at = time.monotonic() + 60  # as when sleeping for a minute
    releaser.announced(b'{"op":"due","in_ms":120000}')
    releaser.announced(b'{"op":"subscribe","topic":"due","client_id":"c","version":"1"}')
    releaser.announced(b'{"op":"due","in_ms":"soon"}')  # malformed: ignored, logged
    assert not releaser.woken.is_set()
    assert [r.getMessage()[:36] for r in caplog.records] == [
        "ignoring malformed due announcement "]  # once: the subscribe is no concern
    releaser.announced(b'{"op":"due","in_ms":5000}')
    assert releaser.woken.is_set()


def test_a_sleeping_releaser_sends_an_announced_message_on_time(wide, fake_redis):
    sent = []
    releaser = Releaser(wide, lambda item: sent.append((item.message_ids[0], time.time())),
                        longest=3600)  # only the announcement can wake it
    pubsub = announcements(fake_redis)
    releaser.start()
    try:
        deadline = time.monotonic() + 30
        while releaser._wake_at == math.inf and time.monotonic() < deadline:
            time.sleep(0.01)  # its first look, empty: it sleeps for the hour
        due = time.time() + 0.3
        assert wide.schedule(item(1, due))
        while not sent and time.monotonic() < deadline:
            message = pubsub.get_message(timeout=0.05)
            if message:
                releaser.announced(message["data"])  # as the worker's listener does
    finally:
        releaser.stop(timeout=10)
    assert [message_id for message_id, _ in sent] == ["m1"]
    assert sent[0][1] >= due  # never early (Redis's clock is this machine's)


def test_announcements_move_the_wake_up_without_a_look_each(wide):
    looks = []

    class Counting:
        width_ms = 7_200_000  # half a shard is no shorter than longest

        def take_next(self, limit):
            looks.append(time.monotonic())
            return [], None

        def done(self, sent):
            pass

    releaser = Releaser(Counting(), lambda item: None, longest=3600)
    releaser.start()
    try:
        deadline = time.monotonic() + 30
        while not looks and time.monotonic() < deadline:
            time.sleep(0.01)
        # A producer scheduling ever earlier messages, all an hour or so ahead.
        for n in range(1000):
            releaser.announced(f'{{"op":"due","in_ms":{3_000_000 - n}}}'.encode())
        threading.Event().wait(0.2)  # time to look, had it meant to (an absence)
        assert len(looks) == 1
        assert 2900 < releaser._wake_at - time.monotonic() <= 3000
        releaser.look_now()  # as after the channel came back
        while len(looks) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(looks) == 2
    finally:
        releaser.stop(timeout=10)
