"""Syncing Redis's append-only files (gearhorn/aofsync.py)."""

from __future__ import annotations

import os
import threading

from gearhorn import aofsync


def make_files(data_dir, *names):
    for name in names:
        path = os.path.join(data_dir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fp:
            fp.write(b"*1\r\n$4\r\nPING\r\n")


def test_every_aof_file_of_redis_7_and_6_is_synced(tmp_path, monkeypatch):
    make_files(str(tmp_path), "appendonlydir/appendonly.aof.1.base.rdb",
               "appendonlydir/appendonly.aof.1.incr.aof", "appendonlydir/appendonly.aof.manifest",
               "appendonly.aof", "dump.rdb")
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(aofsync.os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    # 3 files and their folder, and Redis 6's file; not the RDB snapshot beside them
    assert aofsync.sync(str(tmp_path)) == 5
    assert len(synced) == 5
    assert aofsync.sync(str(tmp_path / "nothing-here")) == 0


def test_a_file_removed_meanwhile_is_skipped(tmp_path, monkeypatch):
    """Redis removes old increments after a rewrite, between listing and opening."""
    make_files(str(tmp_path), "appendonlydir/a.incr.aof", "appendonlydir/b.incr.aof")
    listed = aofsync.aof_files(str(tmp_path))
    os.remove(listed[0])
    monkeypatch.setattr(aofsync, "aof_files", lambda data_dir: listed)
    assert aofsync.sync(str(tmp_path)) == 2  # the other file and the folder


def test_the_syncer_syncs_until_stopped(tmp_path, monkeypatch):
    make_files(str(tmp_path), "appendonlydir/a.incr.aof")
    rounds = threading.Semaphore(0)
    monkeypatch.setattr(aofsync, "sync", lambda data_dir: rounds.release())
    syncer = aofsync.AofSyncer([str(tmp_path)], interval=0.01)
    syncer.start()
    assert all(rounds.acquire(timeout=30) for _ in range(3))  # it goes on, round after round
    syncer.stop()
    assert not syncer._thread.is_alive()


def test_a_syncer_never_started_stops_all_the_same(tmp_path):
    """gearhorn up stops it on the way out even when a server failed to start first."""
    aofsync.AofSyncer([str(tmp_path)]).stop()
