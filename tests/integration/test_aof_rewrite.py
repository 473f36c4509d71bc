"""Redis rewrites its append-only file while acknowledgements wait, and
the power goes: nothing acknowledged is lost.

A rewrite (BGREWRITEAOF) opens a new increment, writes a new manifest under
a temporary name and renames it, then writes a new base and removes the
old files: names that change while writes are acknowledged. Redis runs on
tests/lossyfs.py (both semantics) with its syncer; two writers SET keys,
each acknowledged once the fsync barrier covers it (Durability.wait, as
the worker pool and the bridge do). The cut comes right after a rewrite
ended, or in the middle of one (``rdb-key-save-delay`` slows its child);
Redis is started again on the same files, as ``gearhorn up`` would (its
torn tail repaired), and every acknowledged key must be there.
"""

from __future__ import annotations

import os
import subprocess
import threading

import pytest
import redis

from gearhorn.store.durability import Durability
from gearhorn.store.fsync import FsyncBarrier
from gearhorn.supervision import servers

from .helpers import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

WRITERS = 2
PRELOAD = 2000  # keys before the load: the rewrite has something to write


class Writers:
    """SETs at full speed, each acknowledged after the barrier covers it."""

    def __init__(self, url):
        self.url = url
        self.acked: list[str] = []
        self.failures: list[str] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._write, args=(n,), daemon=True)
                        for n in range(WRITERS)]

    def start(self):
        for thread in self.threads:
            thread.start()
        return self

    def count(self):
        with self.lock:
            return len(self.acked)

    def stop(self):
        self.stopping.set()
        for thread in self.threads:
            thread.join(60)

    def _write(self, n):
        client = redis.Redis.from_url(self.url, socket_timeout=10)
        barrier = FsyncBarrier(client, "the test's Redis")
        durability = Durability([barrier], patience=1)  # the outage is the kill: end soon
        i = 0
        try:
            while not self.stopping.is_set():
                key = f"w{n}.{i}"
                try:
                    marks = durability.marks()
                    client.set(key, key)
                    durability.wait(marks)
                except Exception:  # noqa: BLE001 - the power went off: not acknowledged
                    return
                with self.lock:
                    self.acked.append(key)
                i += 1
        finally:
            barrier.close(wait=10)  # its listener gone before the client closes under it
            client.close()


def info(client, field):
    return int(client.info("persistence")[field])


def rewrite_done(client):
    stats = client.info("persistence")
    return (not stats["aof_rewrite_in_progress"] and not stats["aof_rewrite_scheduled"]
            and stats["aof_last_bgrewrite_status"] == "ok")


def kill_with_its_child(server):
    """kill -9 of Redis and of a rewrite child it may have forked."""
    subprocess.run(["pkill", "-9", "-P", str(server.process.pid)], capture_output=True)
    server.kill()


@pytest.mark.parametrize("lossy_disk", ["lazyfs", "strict"], indirect=True)
@pytest.mark.parametrize("moment", ["after", "during"])
def test_a_cut_right_after_or_during_a_rewrite_keeps_every_acknowledged_write(
        lossy_disk, moment, report):
    data_dir = os.path.join(lossy_disk.path, "redis")
    server = servers.start_redis(data_dir=data_dir, appendonly=True)
    client = redis.Redis.from_url(server.details["url"])
    pipe = client.pipeline(transaction=False)
    for i in range(PRELOAD):
        pipe.set(f"pre{i}", "x" * 100)
    pipe.execute()
    writers = Writers(server.details["url"]).start()
    try:
        for rewrites in range(2):  # whole rewrites while writes are acknowledged
            before = writers.count()
            client.bgrewriteaof()
            wait_for(lambda r=rewrites: info(client, "aof_rewrites") > r and rewrite_done(client),
                     60, message="the rewrite done")
            wait_for(lambda b=before: writers.count() >= b + 20, 60,
                     message="writes acknowledged across the rewrite")
        if moment == "during":
            client.config_set("rdb-key-save-delay", "2000")  # µs a key: about 4 s
            client.bgrewriteaof()
            wait_for(lambda: info(client, "aof_rewrite_in_progress") == 1, 60,
                     message="a rewrite in progress")
        before = writers.count()
        wait_for(lambda: writers.count() >= before + 20, 60, message="more acknowledgements")
        if moment == "during":
            assert info(client, "aof_rewrite_in_progress") == 1, "the rewrite ended too soon"
        kill_with_its_child(server)
        account = lossy_disk.power_cut()
        writers.stop()
    finally:
        writers.stop()
        server.stop()
    acked = set(writers.acked)
    assert not writers.failures
    assert int(account.split()[2]) > 0, f"the cut dropped nothing: {account}"
    again = servers.start_redis(port=server.port, data_dir=data_dir, appendonly=True)
    try:
        back = redis.Redis.from_url(again.details["url"])
        keys = sorted(acked)
        found = [v for i in range(0, len(keys), 1000) for v in back.mget(keys[i:i + 1000])]
        lost = [k for k, v in zip(keys, found, strict=True) if v is None]
        assert not lost, f"{len(lost)} of {len(keys)} acknowledged writes lost, e.g. {lost[:5]}"
        assert back.dbsize() >= PRELOAD + len(keys)
    finally:
        again.stop()
    report(f"{moment} a rewrite, {lossy_disk.strict and 'strict' or 'lazyfs'}: "
           f"{len(acked):,} acknowledged writes kept; the cut: {account}; "
           f"repaired: {again.details.get('repaired', 'nothing')}")
