"""The replica wait of a group commit (gearhorn/store/replicas.py): one
write and one WAITAOF (or WAIT) per wait, too few replicas refuse with the
reason, and the refusal is an outage Durability waits out for its patience.

The Redis here is a fake that answers pipelines as a master with
``replicas`` confirming; tests/integration/test_replicas.py runs a real
master and replica."""

from __future__ import annotations

import pytest
import redis

from gearhorn.config import Config, ConfigError, load
from gearhorn.store import durability
from gearhorn.store.durability import Durability
from gearhorn.store.fsync import BarrierUnavailable, RedisLost
from gearhorn.store.replicas import FSYNCED, MARK, RECEIVED, NotReplicated, ReplicaWait

pytestmark = pytest.mark.timeout(30)


class Master:
    """Answers INCR and WAIT/WAITAOF as a master whose ``replicas`` confirm;
    ``has_waitaof`` False answers WAITAOF as Redis 7.0 does."""

    def __init__(self, replicas=1, has_waitaof=True):
        self.replicas, self.has_waitaof = replicas, has_waitaof
        self.sent = []  # one list of commands per pipeline
        self.down = False

    def pipeline(self, transaction=True):
        return Pipeline(self)

    def ping(self):
        if self.down:
            raise redis.ConnectionError("Connection refused")
        return True

    def info(self, section):
        return {"connected_slaves": self.replicas}


class Pipeline:
    def __init__(self, master):
        self.master, self.commands = master, []

    def incr(self, key):
        self.commands.append(("INCR", key))

    def execute_command(self, *args):
        self.commands.append(args)

    def execute(self, raise_on_error=True):
        if self.master.down:
            raise redis.ConnectionError("Connection reset by peer")
        self.master.sent.append(self.commands)
        replies = []
        for command in self.commands:
            if command[0] == "INCR":
                replies.append(len(self.master.sent))
            elif command[0] == "WAITAOF" and not self.master.has_waitaof:
                replies.append(redis.ResponseError("unknown command 'WAITAOF', with args "
                                                   "beginning with: '0' '1' '1000'"))
            elif command[0] == "WAITAOF":
                replies.append([0, min(self.master.replicas, command[2])])
            else:
                replies.append(min(self.master.replicas, command[1]))
        return replies


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_one_write_then_waitaof_for_the_replicas_needed():
    master = Master(replicas=2)
    wait = ReplicaWait(master, "R", needed=2, timeout=0.5)
    wait.wait()
    assert master.sent == [[("INCR", MARK), ("WAITAOF", 0, 2, 500)]]
    assert wait.how == FSYNCED and wait.waits == 1


def test_a_redis_without_waitaof_is_waited_for_with_wait_from_then_on():
    master = Master(replicas=1, has_waitaof=False)
    wait = ReplicaWait(master, "R", needed=1, timeout=1.0)
    wait.wait()
    wait.wait()
    assert wait.how == RECEIVED
    assert master.sent[1:] == [[("INCR", MARK), ("WAIT", 1, 1000)]] * 2


def test_too_few_replicas_refuse_with_the_reason():
    wait = ReplicaWait(Master(replicas=0, has_waitaof=False), "the registry's Redis",
                       needed=1, timeout=1.0)
    with pytest.raises(NotReplicated, match="only 0 of the 1 replicas of the registry's Redis "
                                            "that min_replicas asks for received the writes "
                                            "within 1s") as caught:
        wait.wait()
    assert not caught.value.lost and wait.waits == 0


def durability_with(master, clock, patience=5.0):
    return Durability([], patience=patience, sleep=clock.sleep, clock=clock,
                      replicas=ReplicaWait(master, "R", needed=1, timeout=1.0))


def test_a_missing_replica_is_an_outage_waited_out_then_the_operation_fails_with_why():
    clock, master = Clock(), Master(replicas=0)
    with pytest.raises(BarrierUnavailable, match=r"only 0 of the 1 .*\(waited 5s for it\)"):
        durability_with(master, clock).wait()
    assert clock.now == pytest.approx(5.0)
    assert len(master.sent) > 3  # asked again while it waited


def test_a_replica_back_within_the_patience_lets_the_acknowledgement_through():
    clock, master = Clock(), Master(replicas=0)
    acks = durability_with(master, clock)

    def back_after_two_seconds(seconds):
        clock.now += seconds
        master.replicas = 1 if clock.now >= 2.0 else 0
    acks._sleep = back_after_two_seconds
    acks.wait()
    assert acks.waits == 1 and 2.0 <= clock.now < 5.0


def test_a_master_lost_during_the_wait_means_the_writes_may_be_gone():
    """Back within the patience: the work is done again (RedisLost); away
    for longer: the operation fails with the reason."""
    clock, master = Clock(), Master(replicas=1)
    master.down = True
    acks = durability_with(master, clock)

    def back_after_a_second(seconds):
        clock.now += seconds
        master.down = clock.now < 1.0
    acks._sleep = back_after_a_second
    with pytest.raises(RedisLost):
        acks.wait()
    master.down, acks._sleep = True, clock.sleep
    with pytest.raises(BarrierUnavailable, match="still unreachable after 5s") as caught:
        acks.wait()
    assert not caught.value.lost


def test_settings_and_what_the_start_says():
    assert load({"min_replicas": 2, "replica_timeout": 0.25}, env={}).min_replicas == 2
    with pytest.raises(ConfigError, match="min_replicas must be 0 or more"):
        load({"min_replicas": -1}, env={})
    with pytest.raises(ConfigError, match="replica_timeout must be above 0"):
        load({"replica_timeout": 0.0}, env={})
    lines = durability.promises(Config(), [("R", durability.WRITTEN)])
    assert lines[-1].startswith("replicas: none waited for (min_replicas = 0): what that Redis "
                                "holds is lost with its disk")
    lines = durability.promises(Config(min_replicas=1), [("R", durability.WRITTEN)])
    assert lines[-1].startswith("replicas: also on 1 replica(s) of that Redis")


def test_written_with_replicas_still_waits_for_them():
    master = Master(replicas=1)
    acks = durability.for_config(Config(durability="written", min_replicas=1), master)
    assert acks.barriers == [] and acks.replicas is not None
    acks.wait()
    assert acks.replicas.waits == 1
