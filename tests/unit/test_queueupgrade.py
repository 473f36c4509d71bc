"""Reading an older data directory's gearmand redis queue into held copies
(gearhorn/supervision/queueupgrade.py), without servers."""

import pytest

from gearhorn.store.heldcopies import HeldCopies
from gearhorn.store.holders import Holders
from gearhorn.store.keys import Keys
from gearhorn.supervision import queueupgrade
from gearhorn.supervision.queueupgrade import UPGRADE_HOLDER, move_to_held, split_key

KEYS = Keys("t:", "chan")


@pytest.mark.parametrize(("key", "dashed", "expected"), [
    (b"_gear_-news_alice-m1:alice", set(), (b"news_alice", b"m1:alice")),
    (b"_gear_-fanout-0f3d-77aa-91", set(), (b"fanout", b"0f3d-77aa-91")),
    (b"_gear_-price-feed_alice-m1:al-ice", {b"price-feed_alice"},
     (b"price-feed_alice", b"m1:al-ice")),
    # the longest recorded name wins
    (b"_gear_-a-b-c-u", {b"a-b", b"a-b-c"}, (b"a-b-c", b"u")),
    (b"_gear_-q-u*x", set(), (b"q", b"u*x")),
    (b"_gear_-plain_bob-", set(), (b"plain_bob", b"")),
])
def test_a_key_splits_into_its_function_and_unique(key, dashed, expected):
    assert split_key(key, dashed) == expected


@pytest.mark.parametrize("key", [b"gearhorn:topics", b"_gear_", b"_gear_-nodash"])
def test_keys_that_are_not_gearmand_jobs_are_left_alone(key):
    assert split_key(key, set()) is None


def job_key(function, unique):
    return b"_gear_-" + function + b"-" + unique


def test_every_queued_job_becomes_a_held_copy_and_leaves_the_queue(fake_redis):
    jobs = {
        (b"news_alice", b"m1:alice"): (b"fine", b"1"),
        (b"price-feed_alice", b"m1:alice"): (b"dashed", b"0"),
        (b"news_carol", b"m2:carol"): (b"a\0b", b"2"),
    }
    for (function, unique), (data, priority) in jobs.items():
        fake_redis.hset(job_key(function, unique), mapping={"data": data, "priority": priority})
    # One an older start had set aside while gearmand started.
    fake_redis.hset(KEYS.held_job(job_key(b"news_bob", b"u*x")),
                    mapping={"data": b"star", "priority": b"1"})
    fake_redis.sadd(KEYS.dashed_functions, "price-feed_alice")
    store, synced = HeldCopies(fake_redis, KEYS), []
    dashed = queueupgrade.dashed_functions(fake_redis, KEYS)
    assert move_to_held(fake_redis, store, KEYS, dashed, lambda: synced.append(1)) == 4
    assert fake_redis.keys(b"_gear_-*") == [] and fake_redis.keys(b"t:held:*") == []
    assert synced, "the queue's keys went before an fsync covered the records"
    (holder,) = Holders(fake_redis, KEYS).leases()  # never registered: taken over at once
    assert holder.startswith(UPGRADE_HOLDER)
    held = {(c.queue, c.unique, c.data, c.precedence) for c in store.held_by(holder)}
    assert held == {("news_alice", "m1:alice", b"fine", "normal"),
                    ("price-feed_alice", "m1:alice", b"dashed", "high"),
                    ("news_carol", "m2:carol", b"a\0b", "low"),
                    ("news_bob", "u*x", b"star", "normal")}
    assert move_to_held(fake_redis, store, KEYS, dashed, lambda: None) == 0  # again: nothing


def test_keys_gearhorn_cannot_read_are_left_where_they_are(fake_redis):
    fake_redis.set(job_key(b"old-style", b"u1"), b"gearmand <= 1.1.15 kept a string")
    fake_redis.hset(job_key(b"bad", b"u2"), mapping={"data": b"x", "priority": b"high?"})
    fake_redis.hset(job_key(b"\xff\xfe", b"u3"), mapping={"data": b"x", "priority": b"1"})
    store = HeldCopies(fake_redis, KEYS)
    assert move_to_held(fake_redis, store, KEYS, set(), lambda: None) == 0
    assert len(fake_redis.keys(b"_gear_-*")) == 3
