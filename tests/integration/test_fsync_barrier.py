"""Acknowledgements after fsync, on real servers: the worker pool and the
bridge answer only after the syncer beside their Redis fsynced what the
answer covers (gearhorn/store/fsync.py, gearhorn/supervision/aofsync.py).

The syncer runs in this process (servers.start_redis starts it beside a
Redis with an AOF), so a test replaces its fsync with a disk of its own:
one that stalls until told, or one that fails.
"""

from __future__ import annotations

import errno
import threading
import time

import pytest
import redis

from gearhorn.store import fsync
from gearhorn.supervision import aofsync, servers

from .helpers import GearClient, PoolProcess, unique_topic, wait_for
from .stomp_helpers import BridgeProcess, StompClient

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


class Disk:
    """The syncer's fsync, as this test wants it: ``stall()`` holds every
    fsync until ``release()``; ``fail()`` makes each raise EIO."""

    def __init__(self, syncer):
        self.syncer = syncer
        self.open = threading.Event()
        self.open.set()
        self.entered = threading.Semaphore(0)
        self.failing = False
        self.released_at = None
        self.latency = 0.0  # seconds each fsync takes: a slow disk
        syncer._fsync = self.fsync

    def fsync(self, layout):
        self.entered.release()
        self.open.wait()
        time.sleep(self.latency)  # the disk's own time, not a wait for a condition
        if self.failing:
            raise OSError(errno.EIO, "Input/output error (the test's disk)")
        return aofsync.sync(layout)

    def stall(self):
        self.open.clear()

    def release(self):
        self.released_at = time.monotonic()
        self.open.set()


@pytest.fixture
def durable_redis(tmp_path):
    server = servers.start_redis(data_dir=str(tmp_path / "registry"), appendonly=True)
    yield server, Disk(server.companions[0])
    server.stop()


def submit_in_background(client, function, payload):
    """Submit a foreground job from a thread; its answer and when it came."""
    done = {}

    def run():
        job = client.submit(function, payload, timeout=60)
        done.update(job=job, at=time.monotonic())
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return done, thread


@pytest.mark.parametrize("durability", ["fsync", "written"])
def test_an_answer_never_comes_before_the_fsync_that_covers_it(
        durable_redis, gearmand, tmp_path, durability):
    """A stalled disk holds the answer back; with the barrier skipped
    (durability = written) the answer comes while the disk still stalls,
    which is what this test would catch."""
    server, disk = durable_redis
    pool = PoolProcess([gearmand], server.details["url"], processes=1, log_dir=str(tmp_path),
                       env={"GEARHORN_DURABILITY": durability})
    client = GearClient(gearmand)
    try:
        pool.wait_ready()
        client.call("subscribe_fanout", {"topic": unique_topic(), "client_id": "warm"})
        disk.stall()
        while disk.entered.acquire(timeout=0):  # forget the rounds before the stall
            pass
        done, thread = submit_in_background(
            client, "subscribe_fanout", {"topic": unique_topic(), "client_id": "alice"})
        if durability == "fsync":
            assert disk.entered.acquire(timeout=30), "the syncer was never asked"
            assert not thread.join(0.5) and "job" not in done, "answered before the fsync"
            disk.release()
            thread.join(30)
            assert done["at"] > disk.released_at, "answered before the fsync ended"
        else:
            thread.join(30)
            assert "job" in done and not done["job"].failure
            assert disk.released_at is None  # answered with the disk still stalled
            disk.release()
        assert not done["job"].failure
    finally:
        disk.release()
        client.close()
        pool.stop()


def test_a_failed_fsync_fails_the_operation_with_the_reason(
        durable_redis, gearmand, tmp_path):
    server, disk = durable_redis
    pool = PoolProcess([gearmand], server.details["url"], processes=1, log_dir=str(tmp_path))
    client = GearClient(gearmand)
    try:
        pool.wait_ready()
        disk.failing = True
        job = client.submit("subscribe_fanout", {"topic": unique_topic(), "client_id": "bob"})
        said = b"".join(job.data).decode()
        assert job.failure and "fsync of the registry's Redis" in said, said
        assert "Input/output error (the test's disk)" in said
        disk.failing = False  # the disk works again: so does the service
        assert client.call("subscribe_fanout", {"topic": unique_topic(),
                                                "client_id": "bob"})["subscribers"] == 1
    finally:
        client.close()
        pool.stop()


@pytest.mark.parametrize("durability", ["fsync", "written"])
def test_a_receipt_waits_for_the_disk_and_a_failed_fsync_is_an_error_frame(
        durable_redis, gearmand, tmp_path, durability):
    """With the barrier, the RECEIPT arrives after the stalled fsync ends;
    skipped (durability = written), it arrives while the disk stalls, which
    is what the ordering check would catch."""
    server, disk = durable_redis
    bridge = BridgeProcess([gearmand], server.details["url"], str(tmp_path),
                           env={"GEARHORN_DURABILITY": durability})
    client = StompClient(bridge.port)
    tickets = redis.Redis.from_url(server.details["url"])
    try:
        client.send("/queue/orders", b"one")  # a RECEIPT, with the disk working
        disk.stall()
        while disk.entered.acquire(timeout=0):
            pass
        before = int(tickets.get(fsync.TICKET) or 0)
        rid = client.receipt()
        client.conn.send(destination="/queue/orders", body=b"two", receipt=rid)
        if durability == "written":
            client.await_receipt(rid, timeout=30)  # the disk still stalls
            assert disk.released_at is None
            disk.release()
            return
        # The bridge took a ticket for what the SEND wrote: it waits on the barrier.
        wait_for(lambda: int(tickets.get(fsync.TICKET) or 0) > before, 30,
                 message="the bridge to take a ticket")
        assert disk.entered.acquire(timeout=30), "the syncer was never asked"
        assert rid not in client.listener.arrived, "a RECEIPT before the fsync"
        disk.release()
        client.await_receipt(rid)
        assert client.listener.arrived[rid] > disk.released_at, "a RECEIPT before the fsync ended"
        disk.failing = True
        client.conn.send(destination="/queue/orders", body=b"three", receipt="r-bad")
        client.wait(lambda: client.listener.errors, 30, "an ERROR")
        message = client.listener.errors[0].headers["message"]
        assert "fsync of the registry's Redis" in message and "Input/output" in message
        assert "r-bad" not in client.listener.arrived
    finally:
        disk.release()
        tickets.close()
        client.close()
        bridge.stop()


def test_one_fsync_covers_the_answers_of_many_at_once(durable_redis, gearmand, tmp_path,
                                                      report):
    """Group commit: 8 producers at once, far fewer fsyncs than answers.
    Only the fsyncs that covered a ticket count (the syncer's idle rounds
    cover none); one fsync per answer would be 200, and the bound is 150
    (measured: 69-90, as 8 producers that each wait for their answer come
    back in waves that the next round splits).
    The disk takes 50 ms an fsync, so answers wait together as on a real
    disk (tmpfs syncs too fast for more than one or two to be waiting)."""
    server, disk = durable_redis
    pool = PoolProcess([gearmand], server.details["url"], processes=2, log_dir=str(tmp_path))
    clients = [GearClient(gearmand) for _ in range(8)]
    try:
        pool.wait_ready()
        topic = unique_topic()
        disk.latency = 0.05
        rounds_before = disk.syncer.waited_on

        def subscribe(n, client):
            for i in range(25):
                client.call("subscribe_fanout", {"topic": topic, "client_id": f"c{n}x{i}"})
        threads = [threading.Thread(target=subscribe, args=(n, c)) for n, c in enumerate(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        rounds = disk.syncer.waited_on - rounds_before
        assert clients[0].call("topic_presence", {"topic": topic})["subscribers"] == 200
        assert 0 < rounds < 150, f"{rounds} fsyncs for 200 answers"
        report(f"group commit: {rounds} fsyncs covered 200 answers")
    finally:
        for client in clients:
            client.close()
        pool.stop()


def test_without_a_syncer_answers_come_once_written_until_one_serves(
        durable_redis, gearmand, tmp_path):
    """durability = auto (the default) beside a Redis whose AOF no syncer
    serves: the start says so and answers come once written; once a syncer
    serves, answers wait for its fsync (a stalled disk holds them back)."""
    server, _ = durable_redis
    syncer = server.companions.pop()
    syncer.stop()
    pool = PoolProcess([gearmand], server.details["url"], processes=1, log_dir=str(tmp_path))
    client = GearClient(gearmand)
    try:
        pool.wait_ready()
        assert "written, not fsynced: no syncer serves its append-only file" in pool.log(True)
        client.call("subscribe_fanout", {"topic": unique_topic(), "client_id": "carol"})
        served = aofsync.AofSyncer(server.details["url"], syncer.data_dir).start()
        server.companions.append(served)
        disk = Disk(served)
        tickets = redis.Redis.from_url(server.details["url"])
        before = int(tickets.get(fsync.TICKET) or 0)

        def waits_for_the_syncer():  # the worker asks again every VERDICT_TTL
            client.call("subscribe_fanout", {"topic": unique_topic(), "client_id": "dave"})
            return int(tickets.get(fsync.TICKET) or 0) > before
        wait_for(waits_for_the_syncer, 60, interval=0.5, message="the worker to take tickets")
        disk.stall()
        while disk.entered.acquire(timeout=0):  # forget the rounds before the stall
            pass
        done, thread = submit_in_background(
            client, "subscribe_fanout", {"topic": unique_topic(), "client_id": "erin"})
        assert disk.entered.acquire(timeout=30), "the syncer was never asked"
        assert not thread.join(0.5) and "job" not in done, "answered before the fsync"
        disk.release()
        thread.join(30)
        assert not done["job"].failure and done["at"] > disk.released_at
    finally:
        client.close()
        pool.stop()

