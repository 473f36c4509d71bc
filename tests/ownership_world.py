"""A small world for the held-copies ownership protocol: holders
(gearhorn/store/holding.py, stepped by hand, no threads) against a fakeredis
that runs the real Lua, one clock for Redis and each holder's own offset
from it, model gearmands (tests/gearmand_model.py) and receivers. Faults:
pause and resume, kill -9, a Redis restart that loses what no fsync
covered, a gearmand restart, skewed clocks.

What it checks (docs/design/held-copies.rst, "The bounds"):

- :meth:`World.check_safety` after any step: every acknowledged copy is
  answered or still has its record; no copy has two jobs a receiver could
  be given; no copy was completed more often than a fault allowed (one
  more each time a receiver was running it, or its answer sat unread,
  when its holder was killed or its gearmand restarted);
- :meth:`World.heal_and_drain`: with every fault over and the receivers
  taking everything, every acknowledged copy is completed and no record
  is left.
"""

from __future__ import annotations

import types
from collections import Counter

import fakeredis
import fakeredis.commands_mixins.server_mixin as server_mixin

from gearhorn import gearman
from gearhorn.store import gearmands, holding
from gearhorn.store.fsync import RedisLost
from gearhorn.store.heldcopies import Fenced, HeldCopies, HeldCopy, key_of
from gearhorn.store.holders import Holders
from gearhorn.store.keys import Keys
from gearhorn.store.redisconn import REDIS_ERRORS
from gearhorn.store.takeover import OWNER_WAIT
from tests.gearmand_model import ModelGearmand, ModelHolder

TTL, INTERVAL = 2.0, 0.5
QUEUES = ("news_alice", "news_bob")


class Clock:
    """Redis's clock (its TIME, in fakeredis) and the base of every holder's."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def time(self) -> float:
        return self.now


class SnapshotDurability:
    """Writes reach the disk at each wait (a group commit's fsync covers
    everything written before it); a Redis restart brings back the last."""

    def __init__(self, world: World) -> None:
        self.world = world

    def marks(self) -> tuple[int, ...]:
        return (self.world.epoch,)

    def wait(self, marks: tuple[int, ...] | None = None) -> None:
        if marks is not None and marks[0] != self.world.epoch:
            raise RedisLost("Redis restarted since the writes")
        self.world.sync()


class Client:
    """The part of gearman.Client a HoldingClient uses."""

    def __init__(self, ports: list[int]) -> None:
        self.connections = [types.SimpleNamespace(host="127.0.0.1", port=p) for p in ports]

    def home(self, queue: str) -> int:
        return QUEUES.index(queue) % len(self.connections) if queue in QUEUES else 0


class Process:
    """One worker process: its HoldingClient, and whether it runs."""

    def __init__(self, world: World, name: str, skew: float) -> None:
        self.world, self.name, self.skew = world, name, skew
        self.alive, self.paused, self.paused_at = True, False, 0.0
        self.holding = holding.HoldingClient(
            Client(world.ports), HeldCopies(world.redis, world.keys),
            Holders(world.redis, world.keys), name, TTL, INTERVAL,
            record=self._answered, durability=SnapshotDurability(world),
            clock=lambda: world.clock.now + skew)
        self.holding.lease.register()

    def _answered(self, queue: str, key: str, status: str, generation: int,
                  handle: str) -> None:
        self.world.answers[key] += 1

    def connections(self) -> list[ModelHolder]:
        gearmands = self.holding.gearmands
        return [*gearmands._holders.values(),
                *(h for _, holders in gearmands._retiring for h in holders)]

    def runs(self) -> bool:
        return self.alive and not self.paused

    def step(self) -> None:
        """A heartbeat and a turn of the holding thread, as their threads
        would run them (an error is an outage: the next turn tries again)."""
        if not self.runs():
            return
        for turn in (self.holding.lease.renew, self.holding.step):
            try:
                turn()
            except Fenced:
                self.holding._fenced(self.holding.holder_id)
            except (*REDIS_ERRORS, RedisLost, gearman.GearmanError):
                self.holding.lease.troubled()

    def publish(self, keys: list[str], queue: str) -> bool:
        """A background fanout's copies; True once acknowledged (kept, and
        an fsync covers them)."""
        if not self.runs():
            return False
        durability = self.holding.durability
        try:
            marks = durability.marks()
            self.holding.submit_background([gearman.Copy(queue, k, k.encode()) for k in keys])
            durability.wait(marks)
        except (*REDIS_ERRORS, RedisLost):
            return False
        self.world.acked.update(keys)
        return True

    def pause(self) -> None:
        self.paused, self.paused_at = True, self.world.clock.now
        for conn in self.connections():
            conn.paused = True

    def resume(self) -> None:
        """Its connections read what came meanwhile. An answer that waited
        unread past OWNER_WAIT leases may have been handed again: the bound
        allows that copy once more (docs/design/held-copies.rst)."""
        self.paused = False
        if self.world.clock.now - self.paused_at > OWNER_WAIT * TTL:
            for conn in self.connections():
                for item in conn.inbox:
                    if item[0] == "answer":
                        self.world.allowance[key_of(_unique(conn, item[1]))] += 1
        for conn in self.connections():
            conn.resume()

    def kill(self) -> None:
        """kill -9: its connections close; what it had not read, or read
        and not yet forgotten, is lost."""
        for _, unique in self.holding.forgets.pending():
            self.world.allowance[key_of(unique)] += 1
        for conn in self.connections():
            for item in conn.inbox:
                if item[0] == "answer":
                    self.world.allowance[key_of(_unique(conn, item[1]))] += 1
            for job in self.world.running_jobs():  # its answer may now reach no one
                if conn in job.clients:
                    self.world.allowance[key_of(job.unique)] += 1
            conn.die()
        self.alive = False


def _unique(conn: ModelHolder, handle: str) -> str:
    copy = conn._held.get(handle)
    return copy.unique if copy is not None else "?^0"


class World:
    def __init__(self, clock: Clock, processes: int = 3, gearmands: int = 1,
                 skews=None) -> None:
        self.clock = clock
        self.epoch = 0
        self._server = fakeredis.FakeServer()
        self.redis = fakeredis.FakeRedis(server=self._server)
        self.keys = Keys()
        self.ports = [47300 + n for n in range(gearmands)]
        self.servers = [ModelGearmand(p) for p in self.ports]
        self.acked: set[str] = set()
        self.completed: Counter[str] = Counter()  # receivers' completions, by copy key
        self.answers: Counter[str] = Counter()  # answers holders read
        self.allowance: Counter[str] = Counter()  # completions a fault allows beyond one
        self.running: list[tuple[ModelGearmand, object]] = []  # jobs receivers hold
        self._snapshot: dict[bytes, bytes] = {}
        skews = skews or [0.0] * processes
        self.processes = [Process(self, f"w{n}", skews[n]) for n in range(processes)]

    # -- Redis ------------------------------------------------------------------

    def sync(self) -> None:
        self._snapshot = {k: self.redis.dump(k) for k in self.redis.keys("*")}

    def restart_redis(self) -> None:
        """Redis restarted from its disk: what no fsync covered is gone, and
        every connection to it broke (the next wait raises RedisLost)."""
        self.redis.flushall()
        for key, value in self._snapshot.items():
            self.redis.restore(key, 0, value)
        self.epoch += 1
        for process in self.processes:
            process.holding.lease.troubled()

    # -- gearmand and receivers -------------------------------------------------

    def running_jobs(self) -> list:
        return [job for _, job in self.running]

    def take(self, queue: str) -> bool:
        """A receiver takes the next copy of ``queue`` from some gearmand."""
        for server in self.servers:
            job = server.grab(queue)
            if job is not None:
                self.running.append((server, job))
                return True
        return False

    def complete(self, index: int = 0) -> bool:
        """A receiver answers the copy it took."""
        if not self.running:
            return False
        server, job = self.running.pop(index % len(self.running))
        self.completed[key_of(job.unique)] += 1
        server.answer(job, gearman.Outcome("complete"))
        return True

    def restart_gearmand(self, index: int = 0) -> None:
        server = self.servers[index % len(self.servers)]
        for held_by, job in list(self.running):
            if held_by is server:  # its receiver did the work; no answer reaches anyone
                self.running.remove((held_by, job))
                self.completed[key_of(job.unique)] += 1
                self.allowance[key_of(job.unique)] += 1
        server.restart()

    # -- checks -----------------------------------------------------------------

    def records(self) -> dict[str, HeldCopy]:
        store = HeldCopies(self.redis, self.keys)
        return {c.key: c for q in QUEUES for c in store.records(q)}

    def check_safety(self) -> None:
        records = self.records()
        for key in self.acked:
            assert self.completed[key] or key in records, f"acknowledged {key} is lost"
        runnable = Counter(key_of(j.unique) for s in self.servers for j in s.jobs.values()
                           if not j.abandoned and not j.running)
        for key, jobs in runnable.items():
            assert jobs <= 1, f"{key} has {jobs} jobs a receiver could be given"
        for key, times in self.completed.items():
            assert times <= 1 + self.allowance[key], (
                f"{key} completed {times} times; its faults allow {1 + self.allowance[key]}")

    def heal_and_drain(self, rounds: int = 60) -> None:
        """Every fault over; receivers take and answer everything; the
        holders run, the clock moves. Every acknowledged copy is completed
        and no record is left."""
        for server in self.servers:
            server.up = True
        for process in self.processes:
            if process.paused:
                process.resume()
        for _ in range(rounds):
            while self.complete():
                pass
            for queue in QUEUES:
                while self.take(queue):
                    pass
            self.clock.now += INTERVAL
            for process in self.processes:
                process.step()
            self.check_safety()
        while self.complete():
            pass
        for process in self.processes:
            process.step()
        missing = sorted(k for k in self.acked if not self.completed[k])
        assert not missing, f"never completed: {missing[:10]}"
        left = self.records()
        assert not left, f"records left after the drain: {sorted(left)[:10]}"


def make_world(monkeypatch, **options) -> World:
    """A world whose Redis TIME is its clock, with model gearmands."""
    clock = Clock()
    monkeypatch.setattr(server_mixin, "time", types.SimpleNamespace(time=clock.time))
    monkeypatch.setattr(holding, "Holder", ModelHolder)
    monkeypatch.setattr(gearmands.Gearmands, "connected", lambda self, index: ModelGearmand.servers[
        self.client.connections[index].port].client_ids())
    return World(clock, **options)
