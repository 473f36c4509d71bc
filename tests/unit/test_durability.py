"""What a process's acknowledgements wait for (gearhorn/store/durability.py):
an outage of a barrier is waited out for ``patience`` seconds and then
fails with the reason; a slow disk is never cut short; the start-up check
says what each Redis promises and stops on a setting it cannot keep.

The barriers and Redis servers are fakes with a clock of the test's."""

from __future__ import annotations

import pytest
import redis

from gearhorn.config import Config
from gearhorn.store import durability, fsync
from gearhorn.store.durability import Durability, SetupError
from gearhorn.store.fsync import BarrierUnavailable, FsyncBarrier, RedisLost

pytestmark = pytest.mark.timeout(30)


class Clock:
    def __init__(self):
        self.now = 0.0
        self.slept = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += seconds


class Pinged:
    def __init__(self):
        self.down_until = 0.0
        self.clock = None

    def ping(self):
        if self.clock() < self.down_until:
            raise redis.ConnectionError("Connection refused")
        return True


class FakeBarrier:
    """A barrier whose tickets fail while ``down`` says so, and whose
    fsync takes ``disk_seconds`` of the test's clock."""

    name = "the registry's Redis (redis://127.0.0.1:6379/0)"

    def __init__(self, clock, outages=()):
        self.clock, self.outages = clock, list(outages)
        self.disk_seconds = 0.0
        self.client = Pinged()
        self.client.clock = clock
        self.synced = 0

    def needed(self):
        return True

    def mark(self):
        return 0

    def ticket(self):
        if self.outages:
            raise self.outages.pop(0)
        return 1, 0

    def wait(self, ticket, epoch):
        self.clock.now += self.disk_seconds
        self.synced += 1

    def close(self):
        pass


def durability_of(barrier, clock, patience=5.0):
    return Durability([barrier], patience=patience, sleep=clock.sleep, clock=clock)


def test_an_outage_shorter_than_the_patience_is_waited_out():
    clock = Clock()
    barrier = FakeBarrier(clock, [BarrierUnavailable("no fsync barrier serves it")] * 3)
    durability_of(barrier, clock).wait()
    assert barrier.synced == 1 and 0 < clock.now < 5.0


def test_an_outage_longer_than_the_patience_fails_with_the_reason_not_before():
    clock = Clock()
    barrier = FakeBarrier(clock, [BarrierUnavailable("no fsync barrier serves it")] * 1000)
    with pytest.raises(BarrierUnavailable, match=r"no fsync barrier serves it \(waited 5s"):
        durability_of(barrier, clock).wait()
    assert clock.now == pytest.approx(5.0)  # bounded, and not cut short either
    assert barrier.synced == 0


def test_a_slow_disk_is_waited_for_however_long_it_takes():
    """The bound is for an outage, not for a disk that is syncing."""
    clock = Clock()
    barrier = FakeBarrier(clock)
    barrier.disk_seconds = 60.0
    durability_of(barrier, clock).wait()
    assert barrier.synced == 1 and clock.now == 60.0


def test_the_patience_counts_from_the_outage_not_from_a_slow_fsync_before_it():
    clock = Clock()
    barrier = FakeBarrier(clock, [BarrierUnavailable("the fsync barrier stopped serving")] * 2)
    clock.now = 100.0  # a long wait went before: the outage still gets its 5 s
    durability_of(barrier, clock).wait()
    assert barrier.synced == 1


def test_a_redis_lost_since_the_writes_is_raised_once_it_answers_again():
    clock = Clock()
    barrier = FakeBarrier(clock, [RedisLost("connection lost since the writes")])
    barrier.client.down_until = 2.0
    with pytest.raises(RedisLost):
        durability_of(barrier, clock).wait()
    assert 2.0 <= clock.now < 5.0  # raised when the work can be done again


def test_a_redis_that_stays_away_fails_the_operation_instead_of_redoing_it():
    clock = Clock()
    barrier = FakeBarrier(clock, [RedisLost("connection lost since the writes")])
    barrier.client.down_until = 1000.0
    with pytest.raises(BarrierUnavailable, match="still unreachable after 5s") as caught:
        durability_of(barrier, clock).wait()
    assert not caught.value.lost  # the group fails with the reason, not run again
    assert clock.now >= 5.0


# -- what a Redis promises: FsyncBarrier's verdict --------------------------


class RedisOf:
    """CONFIG GET append* and PUBSUB NUMSUB of a Redis as the test sets it."""

    def __init__(self, appendonly="yes", appendfsync="everysec", syncers=0, up=True):
        self.settings = {"appendonly": appendonly, "appendfsync": appendfsync}
        self.syncers, self.up = syncers, up

    def config_get(self, pattern):
        if not self.up:
            raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:6380.")
        return dict(self.settings)

    def pubsub_numsub(self, *channels):
        return [(fsync.WAKE.encode(), self.syncers)]

    def ping(self):
        return True


def barrier_of(client, strict, clock):
    return FsyncBarrier(client, "the registry's Redis (redis://127.0.0.1:6379/0)", strict,
                        clock=clock)


def test_auto_waits_for_a_syncer_once_one_serves_and_from_then_on():
    clock, client = Clock(), RedisOf(syncers=0)
    barrier = barrier_of(client, False, clock)
    assert barrier.verdict() == fsync.UNSERVED and not barrier.needed()
    client.syncers = 1
    clock.now += fsync.VERDICT_TTL + 1  # asked again
    assert barrier.verdict() == fsync.BARRIER
    client.syncers = 0  # the syncer went away: an outage now, not a silent downgrade
    clock.now += fsync.VERDICT_TTL + 1
    assert barrier.needed()


def test_fsync_always_waits_for_a_syncer():
    barrier = barrier_of(RedisOf(syncers=0), True, Clock())
    assert barrier.needed()


@pytest.mark.parametrize(("settings", "expected"), [
    ({"appendonly": "no"}, fsync.VOLATILE),
    ({"appendfsync": "always"}, fsync.ALWAYS),
    ({"syncers": 1}, fsync.BARRIER),
    ({"syncers": 0}, fsync.UNSERVED),
])
def test_auto_asks_each_redis_what_it_keeps(settings, expected):
    assert barrier_of(RedisOf(**settings), False, Clock()).verdict() == expected


# -- the start-up check ------------------------------------------------------


def check(client, **settings):
    config = Config(**settings)
    found = Durability([barrier_of(client, config.durability == "fsync", Clock())])
    return durability.promises(config, durability.verdicts(config, found))


def test_the_start_says_what_an_acknowledgement_covers_beside_a_plain_gearmand():
    lines = check(RedisOf(appendonly="no"), copies="gearmand")
    assert lines[0].startswith("the registry's Redis (redis://127.0.0.1:6379/0): in memory only")
    assert lines[1].startswith("copies queued in gearmand: kept as that gearmand keeps")
    assert "memory queue" in lines[1]
    lines = check(RedisOf(syncers=0))
    assert "written, not fsynced: no syncer serves" in lines[0]
    assert "on disk" in check(RedisOf(syncers=1))[0]


def test_held_copies_are_the_default_and_the_start_says_where_they_are():
    lines = check(RedisOf(appendonly="no"))  # every default
    assert "in memory only" in lines[0]  # what is lost with that Redis, said first
    assert lines[1].startswith("fanout copies and the bridge's SENDs (copies = held): in the "
                               "registry's Redis until their receivers answer")
    # what gearmand still keeps itself: other producers' jobs
    assert lines[2].startswith("jobs submitted straight to gearmand (gearman -b")
    assert "memory queue" in lines[2]
    assert not any("copies = held" in line
                   for line in check(RedisOf(syncers=1), copies="gearmand"))


@pytest.mark.parametrize(("client", "says"), [
    (RedisOf(syncers=0), "durability = fsync, but no syncer serves the registry's Redis"),
    (RedisOf(appendonly="no"), "durability = fsync, but the registry's Redis .* keeps no "
                               "append-only file"),
    (RedisOf(up=False), "cannot reach the registry's Redis .*Error 111"),
])
def test_a_setting_that_cannot_be_kept_stops_the_start_with_one_line(client, says):
    with pytest.raises(SetupError, match=says) as caught:
        check(client, durability="fsync")
    assert "\n" not in str(caught.value) and caught.value.exit_code == 2


@pytest.mark.parametrize(("persistence", "says"), [
    ("none", "in gearmand's memory, lost when it stops"),
    ("sqlite", "background ones in its sqlite queue"),
    ("redis", "background ones in its redis queue, as durable as that Redis"),
    ("auto", "with its memory queue (started without -q) a restart of it loses them"),
])
def test_what_a_copy_queued_in_gearmand_survives(persistence, says):
    assert says in durability.gearmand_covers(persistence)
