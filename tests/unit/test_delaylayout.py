"""The delayed messages' layout is the store's: a process configured with
other shard widths or lanes still finds every message (gearhorn/store/delaylayout.py)."""

import logging
import threading
import time

import pytest

from gearhorn.store.delayed import DelayedItem, Releaser, Scheduler
from gearhorn.store.delaylayout import Layout
from gearhorn.store.keys import Keys

KEYS = Keys("t:")


def item(n, due):
    return DelayedItem(due, (f"m{n}",), (b"body",), topic="news")


def taken_soon(scheduler, count=1):
    """The ids of ``count`` messages taken (and done) within a generous deadline."""
    got = []
    deadline = time.monotonic() + 30
    while len(got) < count and time.monotonic() < deadline:
        taken = scheduler.take()
        scheduler.done(taken)
        got += [it.message_ids[0] for _, it in taken]
        time.sleep(0.01)
    return sorted(got)


def soon():
    """Due in a second: still ahead by Redis's clock when the schedule reads
    it on a loaded machine (due already, it would not be kept at all)."""
    return time.time() + 1.0


def test_the_layout_survives_its_json_form_and_rejects_others():
    layout = Layout(10_000, 8)
    assert Layout.from_json(layout.to_json()) == layout
    for text in (b"nonsense", b"{}", b'{"width_ms":0,"lanes":8}', b"[1,2]", None):
        with pytest.raises(ValueError):
            Layout.from_json(text)


def test_narrower_shards_configured_later_do_not_strand_new_messages(fake_redis):
    first = Scheduler(fake_redis, KEYS, shard_seconds=10, lanes=1)
    assert first.schedule(item(1, soon()))
    assert taken_soon(first) == ["m1"]  # the lane's cursor now exists
    narrower = Scheduler(fake_redis, KEYS, shard_seconds=5, lanes=1)
    assert narrower.schedule(item(2, soon()))
    assert taken_soon(narrower) == ["m2"]
    assert narrower.layout == first.layout == Layout(10_000, 1)


def test_messages_kept_under_narrower_shards_are_found_by_a_wider_configuration(fake_redis):
    assert Scheduler(fake_redis, KEYS, shard_seconds=10, lanes=2).schedule(item(1, soon()))
    assert taken_soon(Scheduler(fake_redis, KEYS, shard_seconds=20, lanes=2)) == ["m1"]


def test_fewer_lanes_configured_later_still_find_every_message(fake_redis):
    """Due 3 s ahead (a message already due when scheduled is sent at once,
    not kept: on a loaded machine 20 schedules took longer than 0.05 s);
    the scripts take Redis's clock, so the test waits for it."""
    eight = Scheduler(fake_redis, KEYS, lanes=8)
    due = time.time() + 3
    for n in range(20):
        assert eight.schedule(item(n, due))
    assert len({eight.lane(item(n, due)) for n in range(20)}) > 1
    assert taken_soon(Scheduler(fake_redis, KEYS, lanes=1), 20) == sorted(
        f"m{n}" for n in range(20))


def test_a_configuration_other_than_the_stores_is_told(fake_redis, caplog):
    Scheduler(fake_redis, KEYS, shard_seconds=10, lanes=8).pending()  # no store use yet
    assert fake_redis.get(KEYS.due_layout()) is None
    assert Scheduler(fake_redis, KEYS, shard_seconds=10, lanes=8).layout == Layout(10_000, 8)
    assert not caplog.records
    with caplog.at_level(logging.WARNING):
        assert Scheduler(fake_redis, KEYS, shard_seconds=2.5, lanes=4).layout == Layout(
            10_000, 8)
    (record,) = caplog.records
    assert ("laid out with delay_shard_seconds = 10, delay_lanes = 8; using that, not the "
            "configured delay_shard_seconds = 2.5, delay_lanes = 4") in record.getMessage()


def test_a_wiped_store_gets_the_running_processes_layout_back_at_their_next_look(fake_redis):
    running = Scheduler(fake_redis, KEYS, shard_seconds=10, lanes=2)
    running.take()
    fake_redis.flushall()
    running.take()
    assert Scheduler(fake_redis, KEYS, shard_seconds=5, lanes=1).layout == Layout(10_000, 2)


def test_an_unreadable_layout_is_logged_and_the_configured_one_used(fake_redis, caplog):
    fake_redis.set(KEYS.due_layout(), "written by hand")
    scheduler = Scheduler(fake_redis, KEYS, shard_seconds=10, lanes=2)
    assert scheduler.layout == Layout(10_000, 2)
    assert "unreadable" in caplog.records[0].getMessage()
    assert scheduler.schedule(item(1, soon()))
    assert taken_soon(scheduler) == ["m1"]


def test_the_releaser_looks_at_least_every_half_shard_of_the_stores_layout(fake_redis):
    Scheduler(fake_redis, KEYS, shard_seconds=0.2).take()  # the store's: 0.2 s shards
    scheduler = Scheduler(fake_redis, KEYS, shard_seconds=3600)
    looks = []
    take_next = scheduler.take_next

    def counted(limit):
        looks.append(time.monotonic())
        return take_next(limit)

    scheduler.take_next = counted
    releaser = Releaser(scheduler, lambda item: None, longest=3600)
    releaser.start()
    try:
        deadline = time.monotonic() + 30
        while len(looks) < 4 and time.monotonic() < deadline:
            threading.Event().wait(0.01)
        assert len(looks) >= 4  # with hour-wide shards it would look once an hour
    finally:
        releaser.stop(timeout=10)
