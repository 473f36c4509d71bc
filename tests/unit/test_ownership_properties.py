"""The held-copies ownership protocol under every interleaving Hypothesis
finds (docs/design/held-copies.rst): several holders against Redis (real
Lua on fakeredis), model gearmands, receivers that take and answer, and
the faults: pause and resume, kill -9 and a new process, a Redis restart
that loses what no fsync covered, a gearmand restart, clocks that
disagree. tests/ownership_world.py holds the world and its checks.

CI runs a bounded budget. For as long as you like::

    GEARHORN_OWNERSHIP_EXAMPLES=20000 .venv/bin/python -m pytest \\
        tests/unit/test_ownership_properties.py -p no:xdist --timeout 0
"""

from __future__ import annotations

import itertools
import os

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from gearhorn.store.heldcopies import HeldCopies
from tests.ownership_world import QUEUES, Process, make_world

EXAMPLES = int(os.environ.get("GEARHORN_OWNERSHIP_EXAMPLES", "40"))
MOST_PROCESSES = 4

pytestmark = pytest.mark.timeout(max(300, EXAMPLES))

processes = st.integers(0, MOST_PROCESSES - 1)
TAKE = HeldCopies.take  # before any example wraps it


class Ownership(RuleBasedStateMachine):
    monkeypatch: pytest.MonkeyPatch

    def __init__(self) -> None:
        super().__init__()
        self.world = make_world(self.monkeypatch, processes=2, gearmands=2,
                                skews=[0.0, -10.0])
        self.names = itertools.count()
        self.answer_in_take = False
        self.monkeypatch.setattr(HeldCopies, "take", self._take_with_an_answer())

    def _take_with_an_answer(self):
        def take(store, queue, taker, copies):
            if self.answer_in_take and self.world.take(queue):
                self.world.complete(-1)  # the copy just taken: after the taker looked
            self.answer_in_take = False
            return TAKE(store, queue, taker, copies)
        return take

    def process(self, n: int) -> Process:
        return self.world.processes[n % len(self.world.processes)]

    @rule(n=processes, queue=st.sampled_from(QUEUES), count=st.integers(1, 3))
    def publish(self, n, queue, count):
        self.process(n).publish([f"m{next(self.names)}:{queue}" for _ in range(count)], queue)

    @rule(n=processes)
    def step(self, n):
        self.process(n).step()

    @rule(seconds=st.sampled_from([0.2, 0.5, 1.0, 2.5]))
    def time_passes(self, seconds):
        self.world.clock.now += seconds
        for process in self.world.processes:
            process.step()

    @rule(queue=st.sampled_from(QUEUES))
    def receiver_takes(self, queue):
        self.world.take(queue)

    @rule(index=st.integers(0, 5))
    def receiver_answers(self, index):
        self.world.complete(index)

    @rule()
    def a_receiver_answers_during_the_next_take(self):
        self.answer_in_take = True

    @rule(n=processes)
    def pause(self, n):
        self.process(n).pause()

    @rule(n=processes)
    def resume(self, n):
        if self.process(n).paused:
            self.process(n).resume()

    @rule(n=processes)
    def kill(self, n):
        if self.process(n).alive:
            self.process(n).kill()

    @precondition(lambda self: len(self.world.processes) < MOST_PROCESSES)
    @rule(skew=st.sampled_from([0.0, 7.0, -10.0]))
    def start_a_process(self, skew):
        world = self.world
        world.processes.append(Process(world, f"w{len(world.processes)}", skew))

    @rule()
    def redis_restarts(self):
        self.world.restart_redis()

    @rule(index=st.integers(0, 1))
    def gearmand_restarts(self, index):
        self.world.restart_gearmand(index)

    @invariant()
    def safe(self):
        self.world.check_safety()

    def teardown(self):
        world = self.world
        if not any(p.alive for p in world.processes):
            world.processes.append(Process(world, f"w{len(world.processes)}", 0.0))
        world.heal_and_drain()


def test_the_ownership_protocol_holds_under_every_interleaving(monkeypatch):
    Ownership.monkeypatch = monkeypatch
    run = Ownership.TestCase
    run.settings = settings(max_examples=EXAMPLES, stateful_step_count=40, deadline=None,
                            suppress_health_check=list(HealthCheck))
    run("runTest").runTest()
