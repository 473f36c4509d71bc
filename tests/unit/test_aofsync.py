"""The fsync barrier's pure parts and files (gearhorn/supervision/aofsync.py,
gearhorn/store/fsync.py, gearhorn/supervision/aofrepair.py); with real Redis servers in
tests/integration/test_fsync_barrier.py."""

from __future__ import annotations

import os
import threading

import pytest

from gearhorn.store.fsync import Progress, Round
from gearhorn.supervision import aofrepair, aofsync


def make_files(data_dir, *names, data=b"*1\r\n$4\r\nPING\r\n"):
    for name in names:
        path = os.path.join(data_dir, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fp:
            fp.write(data)


def synced_paths(monkeypatch):
    """The paths this thread fsyncs (os.fsync is the process's: a syncer
    thread of another test's server, alive in this pytest worker, calls it
    too)."""
    synced, real_fsync, opened = [], os.fsync, {}
    real_open, test_thread = os.open, threading.get_ident()

    def opening(path, flags, *args):
        fd = real_open(path, flags, *args)
        opened[fd] = str(path)
        return fd

    def counting(fd):
        if threading.get_ident() == test_thread:
            synced.append(opened.get(fd, fd))
        return real_fsync(fd)
    monkeypatch.setattr(aofsync.os, "open", opening)
    monkeypatch.setattr(aofsync.os, "fsync", counting)
    return synced


def test_every_aof_file_of_redis_7_and_the_folders_naming_them_are_synced(tmp_path, monkeypatch):
    make_files(str(tmp_path), "appendonlydir/appendonly.aof.1.base.rdb",
               "appendonlydir/appendonly.aof.1.incr.aof", "appendonlydir/appendonly.aof.manifest",
               "dump.rdb")
    synced = synced_paths(monkeypatch)
    layout = aofsync.AofLayout(str(tmp_path))
    assert aofsync.sync(layout) == 3
    folder = str(tmp_path / "appendonlydir")
    assert synced == [f"{folder}/appendonly.aof.1.base.rdb", f"{folder}/appendonly.aof.1.incr.aof",
                      f"{folder}/appendonly.aof.manifest", folder, str(tmp_path)]
    # A rewrite's new increment is listed at the next round, and its name synced with it.
    make_files(str(tmp_path), "appendonlydir/appendonly.aof.2.incr.aof")
    synced.clear()
    assert aofsync.sync(layout) == 4 and f"{folder}/appendonly.aof.2.incr.aof" in synced


def test_redis_6s_renamed_file_is_synced_with_its_folder(tmp_path, monkeypatch):
    make_files(str(tmp_path), "custom.aof", "dump.rdb")
    synced = synced_paths(monkeypatch)
    assert aofsync.sync(aofsync.AofLayout(str(tmp_path), filename="custom.aof")) == 1
    assert synced == [str(tmp_path / "custom.aof"), str(tmp_path)]


def test_the_folder_redis_names_is_the_one_synced(tmp_path, monkeypatch):
    """appenddirname other than appendonlydir: its files, not a guess's."""
    make_files(str(tmp_path), "mine/appendonly.aof.1.incr.aof", "appendonlydir/stale.aof")
    synced = synced_paths(monkeypatch)
    assert aofsync.sync(aofsync.AofLayout(str(tmp_path), folder="mine")) == 1
    assert str(tmp_path / "appendonlydir" / "stale.aof") not in synced
    assert aofsync.sync(aofsync.AofLayout(str(tmp_path / "nothing-here"))) == 0


def test_the_folders_above_redis_dir_are_named_up_to_its_mount(tmp_path, monkeypatch):
    """``gearhorn up`` makes its data folders just before Redis starts:
    their names are on disk only once the folders above them are synced."""
    mounts = {str(tmp_path)}
    monkeypatch.setattr(aofsync.os.path, "ismount", lambda path: path in mounts or path == "/")
    deep = tmp_path / "data" / "registry"
    assert aofsync.ancestors(str(deep)) == [str(tmp_path / "data"), str(tmp_path)]
    assert aofsync.ancestors(str(tmp_path)) == []


def test_the_layout_is_asked_of_redis():
    class Asked:
        def config_get(self, name):
            return {"dir": {"dir": "/var/lib/redis"}, "appenddirname": {b"appenddirname": b"aof"},
                    "appendfilename": {"appendfilename": "x.aof"}}[name]
    assert aofsync.layout_of(Asked()) == aofsync.AofLayout("/var/lib/redis", "aof", "x.aof")
    assert aofsync.layout_of(Asked(), "/mnt/r").data_dir == "/mnt/r"


def test_a_file_removed_meanwhile_is_skipped(tmp_path, monkeypatch):
    """Redis removes old increments after a rewrite, between listing and opening."""
    make_files(str(tmp_path), "appendonlydir/a.incr.aof", "appendonlydir/b.incr.aof")
    layout = aofsync.AofLayout(str(tmp_path))
    listed = aofsync.aof_files(layout)
    os.remove(listed[0])
    monkeypatch.setattr(aofsync, "aof_files", lambda layout: listed)
    assert aofsync.sync(layout) == 1  # the other file (and the folders)


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
        aofsync.sync(aofsync.AofLayout(str(tmp_path)))


class Published:
    def __init__(self):
        self.said = []

    def publish(self, channel, data):
        self.said.append(Round.decode(data))


def syncer_with(synced_files):
    syncer = aofsync.AofSyncer("redis://127.0.0.1:1/0", "/data",
                               fsync=lambda layout: synced_files)
    syncer.layout = aofsync.AofLayout("/data")
    return syncer


def test_a_round_that_synced_no_file_is_told_as_a_failure():
    client, syncer = Published(), syncer_with(0)
    syncer._round(client, 5)
    [round_] = client.said
    assert round_.last == 5 and "no append-only file found in /data" in round_.reason
    assert syncer.rounds == 0


def test_a_syncer_forgets_its_progress_when_it_connects_again(tmp_path):
    """A Redis that came back with its ticket counter one below the last
    round's: its next ticket equals that round's, and gets an fsync, not an
    ``ok`` from memory."""
    class Redis(Published):
        def __init__(self, tickets):
            super().__init__()
            self.tickets = tickets

        def config_get(self, name):
            return {"dir": {"dir": str(tmp_path)}}.get(name, {})

        def pubsub(self):
            syncer_ = syncer

            class PubSub:
                woken = False

                def subscribe(self, channel):
                    pass

                def get_message(self, timeout):  # one wake, then one pass of the loop
                    syncer_._stopping.set()
                    if self.woken:
                        return None
                    self.woken = True
                    return {"type": "message", "data": b"1"}

                def close(self):
                    pass
            return PubSub()

        def get(self, key):
            return self.tickets

    syncs = []
    syncer = aofsync.AofSyncer("redis://127.0.0.1:1/0",
                               fsync=lambda layout: syncs.append(layout) or 1)
    syncer._done, syncer._last_sync = 8, float("inf")  # synced up to 8, just now
    client = Redis(8)  # came back at 7; a waiter's INCR made it 8 again
    syncer._serve(client)
    assert syncs and client.said == [Round(0, 8)]


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


def test_a_crash_in_mid_rewrite_leaves_a_temp_manifest_that_is_not_read(tmp_path):
    """Redis writes temp-appendonly.aof.manifest, then renames it: killed
    between the two, it leaves both, and loads only appendonly.aof.manifest."""
    folder = redis7_dir(tmp_path, [("a.1.incr.aof", SET + b"\0" * 10)])
    (folder / "temp-appendonly.aof.manifest").write_text(
        "file appendonly.aof.2.base.rdb seq 2 type b\nfile a.9.incr.aof seq 9 type i\n")
    said = aofrepair.repair(str(tmp_path))
    assert (folder / "a.1.incr.aof").read_bytes() == SET and len(said) == 1


def test_redis_6s_single_file_is_repaired_too(tmp_path):
    (tmp_path / "appendonly.aof").write_bytes(SET + b"*2\r\n$3")
    aofrepair.repair(str(tmp_path))
    assert (tmp_path / "appendonly.aof").read_bytes() == SET
