"""The mend for gearmand 1.1.20's redis-queue replay, without servers."""

import pytest

from gearhorn.store.dashed import DashedFunctions
from gearhorn.store.keys import Keys
from gearhorn.worker import replay
from gearhorn.worker.replay import QueuedJob, replayed_wrong, split_key

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
    assert split_key(key, dashed) == QueuedJob(*expected)


@pytest.mark.parametrize("key", [b"gearhorn:topics", b"_gear_", b"_gear_-nodash"])
def test_keys_that_are_not_gearmand_jobs_are_left_alone(key):
    assert split_key(key, set()) is None


@pytest.mark.parametrize(("function", "unique", "nul", "wrong"), [
    (b"news_alice", b"m1:alice", False, False),
    (b"fanout", b"0f3d-77aa", False, False),  # gearmand reads the unique to the end
    (b"price-feed_alice", b"m1:alice", False, True),
    (b"news_alice", b"u*x", False, True),
    (b"news_alice", b"m1:alice", True, True),
])
def test_what_gearmand_replays_wrong(function, unique, nul, wrong):
    assert replayed_wrong(QueuedJob(function, unique), nul) is wrong


def test_dashed_names_are_recorded_once_per_process(fake_redis):
    dashed = DashedFunctions(fake_redis, KEYS)
    calls = []
    real_sadd = fake_redis.sadd
    fake_redis.sadd = lambda *args: calls.append(args) or real_sadd(*args)
    dashed.record(["a-b_c", "plain", "a-b_c"])
    dashed.record(["a-b_c", "x-y"])
    assert dashed.load() == {b"a-b_c", b"x-y"}
    assert [sorted(c[1:]) for c in calls] == [["a-b_c"], ["x-y"]]


def job_key(function, unique):
    return b"_gear_-" + function + b"-" + unique


class RecordingClient:
    def __init__(self):
        self.submitted = []

    def submit_background(self, copies, precedence="normal"):
        self.submitted += [(c.function, c.unique, c.data, precedence) for c in copies]
        return len(copies)


def test_hold_moves_aside_only_what_would_come_back_wrong_and_resubmit_restores_it(fake_redis):
    jobs = {
        (b"news_alice", b"m1:alice"): (b"fine", b"1"),
        (b"price-feed_alice", b"m1:alice"): (b"dashed", b"0"),
        (b"news_bob", b"u*x"): (b"star", b"2"),
        (b"news_carol", b"m2:carol"): (b"a\0b", b"1"),
    }
    for (function, unique), (data, priority) in jobs.items():
        fake_redis.hset(job_key(function, unique), mapping={"data": data, "priority": priority})
    dashed = {b"price-feed_alice"}

    assert replay.hold(fake_redis, dashed, KEYS) == 3
    assert set(fake_redis.keys(b"_gear_-*")) == {job_key(b"news_alice", b"m1:alice")}
    assert replay.hold(fake_redis, dashed, KEYS) == 0  # again: nothing more

    client = RecordingClient()
    assert replay.resubmit(fake_redis, dashed, KEYS, client) == 3
    assert sorted(client.submitted) == [
        ("news_bob", "u*x", b"star", "low"),
        ("news_carol", "m2:carol", b"a\0b", "normal"),
        ("price-feed_alice", "m1:alice", b"dashed", "high"),
    ]
    assert fake_redis.keys(b"t:held:*") == []
    assert replay.resubmit(fake_redis, dashed, KEYS, RecordingClient()) == 0


def test_keys_gearhorn_cannot_read_are_left_where_they_are(fake_redis):
    fake_redis.set(job_key(b"old-style", b"u*1"), b"gearmand <= 1.1.15 kept a string")
    fake_redis.hset(job_key(b"bad", b"u*2"), mapping={"data": b"x", "priority": b"high?"})
    fake_redis.hset(job_key(b"\xff\xfe", b"u*3"), mapping={"data": b"x", "priority": b"1"})
    assert replay.hold(fake_redis, set(), KEYS) == 3  # '*' in every unique
    client = RecordingClient()
    assert replay.resubmit(fake_redis, set(), KEYS, client) == 0
    assert client.submitted == [] and len(fake_redis.keys(b"t:held:*")) == 3
