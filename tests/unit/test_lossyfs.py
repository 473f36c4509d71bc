"""The power-cut file system (tests/lossyfs.py) without FUSE: its
operations called as the kernel would call them, on a folder of the test's.
The power-cut test trusts it to lose exactly what a real disk may lose."""

from __future__ import annotations

import os

import pytest

from tests.lossyfs import Dirty, LossyFS

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(params=[False, True], ids=["lazyfs", "strict"])
def fs(request, tmp_path):
    backing = tmp_path / "backing"
    backing.mkdir()
    return LossyFS(str(backing), strict=request.param)


@pytest.fixture
def strict(tmp_path):
    backing = tmp_path / "backing"
    backing.mkdir()
    return LossyFS(str(backing), strict=True)


def new_file(fs, path, data=b""):
    fh = fs.create(path, 0o644)
    if data:
        fs.write(path, data, 0, fh)
    return fh


def on_disk(fs, path):
    """What a reader sees after the cut (None: no such file)."""
    real = fs._real(path)
    return open(real, "rb").read() if os.path.exists(real) else None


def cut(fs):
    return fs.clear_cache()


def sync_names(fs, *folders):
    for folder in folders:
        fs.fsyncdir(folder, 0, 0)


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


def test_a_write_is_read_back_at_once_and_lost_at_the_cut_unless_fsynced(fs):
    kept, lost = new_file(fs, "/kept", b"kept"), new_file(fs, "/lost", b"lost")
    assert fs.read("/lost", 100, 0, lost) == b"lost"
    fs.fsync("/kept", 0, kept)
    sync_names(fs, "/")
    assert cut(fs).startswith("ok dropped 4 bytes of 1 files")
    assert on_disk(fs, "/kept") == b"kept"
    # LazyFS keeps the size (zeros where the data was); strict keeps the
    # size the last fsync saw: none, so the file is empty.
    assert on_disk(fs, "/lost") == (b"" if fs.names else b"\0" * 4)


def test_an_fsync_through_another_descriptor_covers_the_file(fs):
    writer = new_file(fs, "/f", b"data")
    other = fs.open("/f", os.O_RDONLY)
    fs.fsync("/f", 1, other)
    sync_names(fs, "/")
    cut(fs)
    assert on_disk(fs, "/f") == b"data"
    fs.release("/f", writer)


def test_pending_writes_follow_a_renamed_file_and_a_renamed_folder(fs):
    fs.mkdir("/a", 0o755)
    fh = new_file(fs, "/a/f", b"one")
    fs.rename("/a/f", "/a/g")
    fs.rename("/a", "/b")
    assert fs.read("/b/g", 100, 0, fh) == b"one"
    fs.fsync("/b/g", 0, fs.open("/b/g", os.O_RDONLY))
    sync_names(fs, "/b", "/")
    cut(fs)
    assert on_disk(fs, "/b/g") == b"one"


def test_truncating_drops_what_it_cut_off_and_o_trunc_clears_the_pending_writes(fs):
    fh = new_file(fs, "/f", b"0123456789")
    fs.truncate("/f", 4, fh)
    assert fs.read("/f", 100, 0, fh) == b"0123"
    again = fs.create("/f", 0o644)  # open(O_CREAT | O_TRUNC) of a file that exists
    assert fs.read("/f", 100, 0, again) == b""
    fs.write("/f", b"xy", 0, again)
    fs.fsync("/f", 0, again)
    sync_names(fs, "/")
    cut(fs)
    assert on_disk(fs, "/f") == b"xy"  # nothing of the writes before O_TRUNC comes back


def test_an_open_with_o_trunc_clears_them_too(fs):
    new_file(fs, "/f", b"old")
    fh = fs.open("/f", os.O_WRONLY | os.O_TRUNC)
    assert fs.read("/f", 100, 0, fh) == b""


def test_by_default_names_and_sizes_are_on_disk_at_once(tmp_path):
    backing = tmp_path / "backing"
    backing.mkdir()
    fs = LossyFS(str(backing))
    fs.mkdir("/d", 0o755)
    new_file(fs, "/d/f", b"abc")
    fs.rename("/d/f", "/d/g")
    cut(fs)
    assert on_disk(fs, "/d/g") == b"\0\0\0" and on_disk(fs, "/d/f") is None


def test_strict_a_new_name_is_on_disk_only_once_its_folder_is_synced(strict):
    fs = strict
    fs.mkdir("/d", 0o755)
    fh = new_file(fs, "/d/f", b"abc")
    fs.fsync("/d/f", 0, fh)  # the data, and not its name
    assert "undid 2 name changes" in cut(fs)
    assert not os.path.exists(fs._real("/d"))
    fs.mkdir("/d", 0o755)
    fh = new_file(fs, "/d/f", b"abc")
    fs.fsync("/d/f", 0, fh)
    sync_names(fs, "/d")  # the file's entry, and not the folder's own
    cut(fs)
    assert not os.path.exists(fs._real("/d"))
    fs.mkdir("/d", 0o755)
    fh = new_file(fs, "/d/f", b"abc")
    fs.fsync("/d/f", 0, fh)
    sync_names(fs, "/d", "/")
    assert "undid 0 name changes" in cut(fs)
    assert on_disk(fs, "/d/f") == b"abc"


def test_strict_an_unsynced_rename_is_undone_and_what_it_replaced_comes_back(strict):
    fs = strict
    for name, data in (("/manifest", b"old"), ("/tmp-manifest", b"new")):
        fs.fsync(name, 0, new_file(fs, name, data))
    sync_names(fs, "/")
    fs.rename("/tmp-manifest", "/manifest")
    assert on_disk(fs, "/manifest") == b"new"
    cut(fs)  # the rename never reached the disk
    assert (on_disk(fs, "/manifest"), on_disk(fs, "/tmp-manifest")) == (b"old", b"new")
    fs.rename("/tmp-manifest", "/manifest")
    sync_names(fs, "/")
    cut(fs)
    assert (on_disk(fs, "/manifest"), on_disk(fs, "/tmp-manifest")) == (b"new", None)
    assert os.listdir(fs.names.graveyard) == []


def test_strict_a_rename_across_folders_needs_both_synced(strict):
    fs = strict
    for folder in ("/a", "/b"):
        fs.mkdir(folder, 0o755)
    fs.fsync("/a/f", 0, new_file(fs, "/a/f", b"x"))
    sync_names(fs, "/a", "/b", "/")
    fs.rename("/a/f", "/b/f")
    sync_names(fs, "/b")
    cut(fs)
    assert (on_disk(fs, "/a/f"), on_disk(fs, "/b/f")) == (b"x", None)


def test_strict_an_unsynced_removal_is_undone(strict):
    fs = strict
    fs.mkdir("/d", 0o755)
    fs.fsync("/d/f", 0, new_file(fs, "/d/f", b"keep"))
    sync_names(fs, "/d", "/")
    fs.unlink("/d/f")
    fs.rmdir("/d")
    assert not os.path.exists(fs._real("/d"))
    cut(fs)
    assert on_disk(fs, "/d/f") == b"keep"
    fs.unlink("/d/f")
    sync_names(fs, "/d")
    cut(fs)
    assert on_disk(fs, "/d/f") is None and os.listdir(fs.names.graveyard) == []


def test_strict_a_size_is_the_last_fsynced_one_and_a_truncation_is_undone(strict):
    fs = strict
    fh = new_file(fs, "/f", b"0123456789")
    fs.fsync("/f", 0, fh)
    sync_names(fs, "/")
    fs.write("/f", b"tail", 10, fh)  # grows the file: not on disk
    fs.truncate("/f", 3, fh)  # shrinks it below what is on disk
    fs.write("/f", b"XYZ", 3, fh)
    assert fs.read("/f", 100, 0, fh) == b"012XYZ"
    assert "cut 1 files" in cut(fs)
    assert on_disk(fs, "/f") == b"0123456789"
