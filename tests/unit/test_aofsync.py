"""The fsync barrier's pure parts and files (gearhorn/aofsync.py,
gearhorn/store/fsync.py, gearhorn/aofrepair.py); with real Redis servers in
tests/integration/test_fsync_barrier.py."""

from __future__ import annotations

import os
import threading

import pytest

from gearhorn import aofrepair, aofsync
from gearhorn.store.fsync import Progress, Round
from tests.lossyfs import Dirty


def make_files(data_dir, *names, data=b"*1\r\n$4\r\nPING\r\n"):
    for name in names:
        path = os.path.join(data_dir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fp:
            fp.write(data)


def test_every_aof_file_of_redis_7_and_6_is_synced(tmp_path, monkeypatch):
    make_files(str(tmp_path), "appendonlydir/appendonly.aof.1.base.rdb",
               "appendonlydir/appendonly.aof.1.incr.aof", "appendonlydir/appendonly.aof.manifest",
               "appendonly.aof", "dump.rdb")
    synced = []
    real_fsync = os.fsync
    test_thread = threading.get_ident()

    def counting(fd):
        # os.fsync is the process's: a syncer thread of another test's
        # server, alive in this pytest worker, calls it too
        if threading.get_ident() == test_thread:
            synced.append(fd)
        return real_fsync(fd)
    monkeypatch.setattr(aofsync.os, "fsync", counting)
    # 3 files and their folder, and Redis 6's file; not the RDB snapshot beside them
    assert aofsync.sync(str(tmp_path)) == 5
    assert len(synced) == 5
    assert aofsync.sync(str(tmp_path / "nothing-here")) == 0


def test_a_file_removed_meanwhile_is_skipped(tmp_path, monkeypatch):
    """Redis removes old increments after a rewrite, between listing and opening."""
    make_files(str(tmp_path), "appendonlydir/a.incr.aof", "appendonlydir/b.incr.aof")
    listed = aofsync.aof_files(str(tmp_path))
    os.remove(listed[0])
    monkeypatch.setattr(aofsync, "aof_files", lambda data_dir, folder: listed)
    assert aofsync.sync(str(tmp_path)) == 2  # the other file and the folder


def test_a_failed_fsync_is_an_error_for_the_caller(tmp_path, monkeypatch):
    make_files(str(tmp_path), "appendonlydir/a.incr.aof")

    real_fsync = os.fsync
    test_thread = threading.get_ident()

    def broken(fd):
        if threading.get_ident() != test_thread:  # another test's syncer
            return real_fsync(fd)
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(aofsync.os, "fsync", broken)
    with pytest.raises(OSError, match="Input/output"):
        aofsync.sync(str(tmp_path))


def test_a_syncer_never_started_stops_all_the_same():
    """gearhorn up stops it on the way out even when a server failed to start first."""
    aofsync.AofSyncer("redis://127.0.0.1:1/0", "/nonexistent").stop()


# -- the rounds a syncer publishes, and what a waiter makes of them ------------


@pytest.mark.parametrize("round_", [Round(0, 7), Round(3, 9, "[Errno 5] Input/output error"),
                                    Round(0, 0)])
def test_rounds_travel_as_they_are(round_):
    decoded = Round.decode(round_.encode())
    assert (decoded.last, decoded.reason) == (round_.last, round_.reason)
    if round_.reason:
        assert decoded.first == round_.first


@pytest.mark.parametrize("junk", [b"", b"ok", b"ok x", b"fail 1", b"hello 1 2"])
def test_anything_else_is_not_a_round(junk):
    with pytest.raises(ValueError):
        Round.decode(junk)


def test_a_ticket_waits_until_a_round_covers_it():
    progress = Progress()
    assert progress.outcome(1) is None
    progress.heard(Round(0, 3))
    assert [progress.outcome(t) for t in (1, 3, 4)] == ["", "", None]


def test_a_failed_round_fails_its_tickets_even_after_a_later_success():
    """After a failed fsync the kernel may have dropped the pages: a later
    fsync that works says nothing about them."""
    progress = Progress()
    progress.heard(Round(0, 3))
    progress.heard(Round(3, 6, "EIO"))
    progress.heard(Round(6, 9))
    assert [progress.outcome(t) for t in (3, 4, 6, 7, 9)] == ["", "EIO", "EIO", "", ""]


# -- cutting a torn AOF ----------------------------------------------------------

SET = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n"
MULTI, EXEC = b"*1\r\n$5\r\nMULTI\r\n", b"*1\r\n$4\r\nEXEC\r\n"


@pytest.mark.parametrize("tail", [b"", b"*3\r\n$3\r\nSE", b"\0" * 4096, SET[:-1],
                                  b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$99\r\nhello\r\n",
                                  MULTI + SET, b"garbage"])
def test_the_complete_prefix_stops_before_whatever_is_torn(tail):
    whole = b"#TS:1700000000\r\n" + SET + MULTI + SET + EXEC + SET
    assert aofrepair.complete_prefix(whole + tail) == len(whole)


def test_every_cut_of_a_file_keeps_exactly_its_whole_commands():
    commands = [SET, MULTI, SET, SET, EXEC, SET]
    data = b"".join(commands)
    ends = [0, len(SET), len(SET + MULTI + SET + SET + EXEC), len(data)]
    for cut in range(len(data) + 1):
        assert aofrepair.complete_prefix(data[:cut]) == max(e for e in ends if e <= cut)


def redis7_dir(tmp_path, incr_files):
    folder = tmp_path / "appendonlydir"
    folder.mkdir()
    lines = ["file appendonly.aof.1.base.rdb seq 1 type b"]
    for seq, (name, data) in enumerate(incr_files, start=1):
        (folder / name).write_bytes(data)
        lines.append(f"file {name} seq {seq} type i")
    (folder / "appendonly.aof.1.base.rdb").write_bytes(b"REDIS0010")
    (folder / "appendonly.aof.manifest").write_text("\n".join(lines) + "\n")
    return folder


def test_a_torn_increment_is_cut_its_original_kept_and_later_ones_emptied(tmp_path):
    folder = redis7_dir(tmp_path, [("a.1.incr.aof", SET + SET + b"\0" * 100),
                                   ("a.2.incr.aof", SET)])
    said = aofrepair.repair(str(tmp_path))
    assert (folder / "a.1.incr.aof").read_bytes() == SET + SET
    assert (folder / "a.2.incr.aof").read_bytes() == b""  # came after the hole
    assert len(said) == 2 and "cut 100 bytes" in said[0]
    copies = sorted(p.name for p in folder.iterdir() if ".torn-" in p.name)
    assert len(copies) == 2
    assert (folder / copies[0]).read_bytes().endswith(b"\0" * 100)  # the original, kept


def test_a_whole_aof_is_left_as_it_is(tmp_path):
    folder = redis7_dir(tmp_path, [("a.1.incr.aof", SET + MULTI + SET + EXEC)])
    assert aofrepair.repair(str(tmp_path)) == []
    assert sorted(p.name for p in folder.iterdir()) == [
        "a.1.incr.aof", "appendonly.aof.1.base.rdb", "appendonly.aof.manifest"]
    assert aofrepair.repair(str(tmp_path / "no-aof-here")) == []


def test_redis_6s_single_file_is_repaired_too(tmp_path):
    (tmp_path / "appendonly.aof").write_bytes(SET + b"*2\r\n$3")
    aofrepair.repair(str(tmp_path))
    assert (tmp_path / "appendonly.aof").read_bytes() == SET


# -- the power-cut file system's memory of unsynced writes ------------------------


def test_unsynced_writes_overlay_what_a_reader_sees_in_order():
    dirty = Dirty()
    dirty.add(2, b"abcd")
    dirty.add(4, b"XY")
    buf = bytearray(b"........")
    dirty.overlay(buf, 0)
    assert bytes(buf) == b"..abXY.."
    part = bytearray(b"..")
    dirty.overlay(part, 3)
    assert bytes(part) == b"bX"
    dirty.truncate(5)
    assert dirty.writes == [(2, b"abc"), (4, b"X")] and dirty.size == 4
