"""A held copy a receiver runs twice, through the real protocol, is seen as
a duplicate (issue 79): real redis-server and gearmand, two ``gearhorn
worker`` pools, a plain Gearman receiver.

The one way the takeover still hands a copy twice (docs/design/held-copies.rst,
"The bounds"): the taker looked at the job, found it live (its holder paused
with a receiver running it), and attached; the receiver answered in the
instant between that look and the attach, so the attach made the job again
under the same unique, and the receiver ran it once more. Here that instant
is made long enough to act in by a proxy that holds back the taker's attach
(tests/integration/gate.py). Both answers reach a holder (the first waits
unread in the paused holder's connection), in one generation but under two
of gearmand's job handles: the count-first audit must name the copy.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from gearhorn import gearman
from gearhorn.client import Producer
from gearhorn.pipeline.audit import AuditSettings
from gearhorn.pipeline.countaudit import CountAudit
from gearhorn.store import redisconn
from gearhorn.store.auditfeed import ledger_rows
from gearhorn.store.keys import Keys
from gearhorn.store.ledger import now_ms
from gearhorn.supervision import servers
from tests.needs import require_binary

from .gate import SubmitGate
from .helpers import PoolProcess, nothing_held, queue_depth, unique_topic, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

FAST = {"GEARHORN_HEARTBEAT_INTERVAL": "0.5", "GEARHORN_WORKER_TTL": "2"}
SHARDS = 8  # the ledger's default


def grab_one(receiver, timeout=60.0):
    got = []
    wait_for(lambda: got.extend(receiver.grab(1)) or got, timeout, interval=0.05,
             message="a job for the receiver")
    return got[0]


def answers(client, queue):
    """The complete answers the ledger holds of ``queue``'s copies:
    (unique, generation, job handle) each."""
    return sorted((r["unique"], r["count"], r["handle"])
                  for r in ledger_rows(client, Keys(), SHARDS, 0, {queue})
                  if r["event"] == "answered" and r["reason"] == "complete")


def test_a_copy_made_again_at_a_takers_attach_and_run_twice_is_a_duplicate(tmp_path):
    require_binary("gearmand", "gearman-job-server")
    require_binary("redis-server", "redis-server")
    gearmand = servers.start_gearmand(data_dir=str(tmp_path / "gearmand"))
    redis = servers.start_redis(None, str(tmp_path / "redis"), appendonly=True, barrier=False,
                                extra=["--appendfsync", "always"])
    url, client = redis.details["url"], None
    topic = unique_topic("twice")
    queue = f"{topic}_a"
    gate = SubmitGate(gearmand, queue)
    receiver = gearman.WorkerConnection(gearmand.host, gearmand.port, [queue], "receiver")
    first = PoolProcess([gearmand], url, processes=1, log_dir=str(tmp_path), env=FAST,
                        log_name="pool-a.log")
    second = victim = None
    try:
        client = redisconn.connect(url)
        first.wait_ready()
        with Producer([(gearmand.host, gearmand.port)], timeout=30) as producer:
            producer.subscribe(topic, "a")
            published = producer.publish(topic, "m0", background=True)
        assert published["copies"] == 1
        (victim,) = first.own_pids()  # it made and holds the copy
        receiver.open()
        job = grab_one(receiver)  # running: its holder waits for the answer
        # The taker, started after the fanout: its gearmand is the gate.
        second = PoolProcess([gate], url, processes=1, log_dir=str(tmp_path), env=FAST,
                             log_name="pool-b.log")
        wait_for(lambda: len(second.own_pids()) == 1 and len(second.live()) == 2, 60,
                 message="the taker's worker serving")
        os.kill(victim, signal.SIGSTOP)
        try:
            wait_for(gate.held.is_set, 60, message="the taker's attach to the live job")
            receiver.complete(job.handle, b"ran once")  # answered just before the attach
            wait_for(lambda: queue_depth(gearmand, queue) == 0, 30,
                     message="gearmand to let go of the answered job")
            gate.release()
            again = grab_one(receiver)  # the attach made it again
            receiver.complete(again.handle, b"ran twice")
        finally:
            os.kill(victim, signal.SIGCONT)
        assert (again.unique, again.handle != job.handle) == (job.unique, True)
        wait_for(lambda: len(answers(client, queue)) == 2, 60,
                 message="both answers in the ledger (the paused holder's once resumed)")
        wait_for(nothing_held(url, queue), 60, message="the copy's record dropped")
        found = audit_until_found(client, tmp_path)
        logs = first.log(full=True) + second.log(full=True)
    finally:
        if victim is not None:
            os.kill(victim, signal.SIGCONT)
        receiver.close()
        for pool in (first, second):
            if pool is not None:
                pool.stop()
        gate.close()
        gearmand.stop()
        redis.stop()
    (unique, generation, _), (_, again_generation, _) = answers_seen = found["answers"]
    assert generation == again_generation == 0, answers_seen  # one generation, two jobs
    assert found["findings"] == [("duplicate", published["message_id"], queue, unique)], logs
    assert "answered just before and made again" in logs  # and the taker said so


def audit_until_found(client, tmp_path):
    """The count-first audit over everything the pools wrote, its clock a
    minute past it (every bucket due), round after round until it reports
    (the writers' counts go out once a second)."""
    settings = AuditSettings(str(tmp_path / "audit"), deadline_ms=30_000, lateness_ms=5_000,
                             interval_s=1, from_start=True, shards=SHARDS)
    told = []
    audit = CountAudit(client, Keys(), settings, lambda state, found: told.extend(found),
                       clock=lambda: now_ms() + 60_000)
    audit.begin()
    deadline = time.monotonic() + 60
    while not told and time.monotonic() < deadline:
        audit.round()
        audit.wait_for_looks(60)  # a closer look's findings: told in the next round
        time.sleep(0.2)  # the next counts entry comes within a second
    queue = {f.subscriber for f in told}
    return {"findings": sorted((f.kind, f.message_id, f.subscriber, f.unique) for f in told),
            "answers": answers(client, queue.pop()) if queue else []}
