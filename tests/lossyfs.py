"""A file system that loses what was not fsynced: a power cut for tests.

``python -m tests.lossyfs BACKING MOUNTPOINT CONTROL_SOCKET [--strict]``
mounts BACKING at MOUNTPOINT (FUSE 3, mfusepy) with LazyFS's semantics
(dsrhaslab/lazyfs, which Jepsen uses to test databases for power cuts):

- Data written to a file stays in this process's memory until the file
  is fsynced (fsync or fdatasync, through any descriptor of it, under any
  name it has had); reads see it meanwhile. Only then is it written to
  BACKING. Truncating (``O_TRUNC`` included) drops what it cuts off.
- ``clear-cache`` on the control socket drops every write not fsynced:
  the power goes off. :func:`control` sends a command, returns the answer.

Metadata has one of two semantics:

- by default (LazyFS's): creating, renaming and removing files and
  folders, and file sizes, take effect on "disk" at once. A file keeps
  its size through the cut, so a page that never reached the disk reads
  as zeros (a file padded with zeros is harder on a reader than one cut
  short: Redis's own check repairs only the second);
- ``--strict`` (what POSIX promises, and what ext4 does between its
  journal commits): a file's size is on disk once the file is fsynced, and
  a folder's entries (a new, renamed or removed name) once that folder is
  fsynced; a rename across folders needs both. The cut puts back every
  name change not yet covered, newest first, and cuts every file back to
  its last fsynced size. Removed and overwritten files wait in a
  graveyard beside BACKING until their removal is on disk.

The kernel's page cache is bypassed (``direct_io``, no attribute
caching), so after ``clear-cache`` every reader sees what the "disk" kept.
Pending writes are kept by inode, so they follow a file through renames
of it or of its folders.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
import threading
from dataclasses import dataclass, field

from tests.lossynames import Names, inode_of

COMMANDS = ("clear-cache", "stats")


@dataclass
class Dirty:
    """One file's writes not yet fsynced, in the order made."""

    writes: list[tuple[int, bytes]] = field(default_factory=list)
    size: int = 0  # bytes held

    def add(self, offset: int, data: bytes) -> None:
        self.writes.append((offset, data))
        self.size += len(data)

    def overlay(self, buf: bytearray, offset: int) -> None:
        """Apply the writes that overlap ``buf`` (read at ``offset``)."""
        end = offset + len(buf)
        for at, data in self.writes:
            lo, hi = max(at, offset), min(at + len(data), end)
            if lo < hi:
                buf[lo - offset:hi - offset] = data[lo - at:hi - at]

    def truncate(self, length: int) -> None:
        kept = []
        for at, data in self.writes:
            if at < length:
                kept.append((at, data[:length - at]))
        self.writes = kept
        self.size = sum(len(d) for _, d in kept)


class LossyFS:
    """The operations (mfusepy's high-level API): a pass-through to
    ``backing`` whose data writes wait for fsync (and, ``strict``, whose
    sizes and names do too)."""

    use_ns = True

    def __init__(self, backing: str, strict: bool = False) -> None:
        self.backing = os.path.realpath(backing)
        self._mutex = threading.RLock()
        self.dirty: dict[int, Dirty] = {}  # by inode
        self.appending: dict[int, bool] = {}  # fh -> opened with O_APPEND
        self.dropped = self.synced = 0  # bytes (stats)
        self.names = Names(self.backing) if strict else None
        # strict: inode -> its size on disk, for files whose size changed since
        # their last fsync; and the on-disk bytes a truncation cut off, in order.
        self.disk_size: dict[int, int] = {}
        self.cut_off: dict[int, list[tuple[int, bytes]]] = {}

    def _real(self, path: str) -> str:
        return os.path.join(self.backing, path.lstrip("/"))

    # -- metadata ------------------------------------------------------------

    def getattr(self, path: str, fh: int | None = None) -> dict:
        st = os.lstat(self._real(path))
        return {key: getattr(st, key) for key in (
            "st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_atime_ns",
            "st_mtime_ns", "st_ctime_ns")} | {
            "st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns, "st_ctime": st.st_ctime_ns}

    def readdir(self, path: str, fh: int):
        return [".", "..", *os.listdir(self._real(path))]

    def access(self, path: str, amode: int) -> int:
        if not os.access(self._real(path), amode):
            raise OSError(errno.EACCES, "")
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        with self._mutex:
            os.mkdir(self._real(path), mode)
            if self.names:
                self.names.record("mkdir", self._real(path), os.lstat(self._real(path)).st_ino)
        return 0

    def rmdir(self, path: str) -> int:
        with self._mutex:
            real = self._real(path)
            if not self.names:
                os.rmdir(real)
                return 0
            if os.listdir(real):
                raise OSError(errno.ENOTEMPTY, os.strerror(errno.ENOTEMPTY))
            inode = os.lstat(real).st_ino
            self.names.record("rmdir", real, inode, grave=self.names.bury(real))
        return 0

    def unlink(self, path: str) -> int:
        with self._mutex:
            real = self._real(path)
            inode = os.lstat(real).st_ino
            if not self.names:
                os.unlink(real)
                self._forget(inode)
                return 0
            self.names.record("unlink", real, inode, grave=self.names.bury(real))
        return 0

    def rename(self, old: str, new: str) -> int:
        with self._mutex:
            real_old, real_new = self._real(old), self._real(new)
            inode, replaced = os.lstat(real_old).st_ino, inode_of(real_new)
            if not self.names:
                os.rename(real_old, real_new)
                if replaced is not None and replaced != inode:
                    self._forget(replaced)
                return 0
            grave = (self.names.bury(real_new)
                     if replaced is not None and replaced != inode else None)
            try:
                os.rename(real_old, real_new)
            except OSError:
                if grave is not None:
                    os.rename(grave, real_new)
                raise
            self.names.record("rename", real_new, inode, came_from=real_old, grave=grave)
        return 0

    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._real(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        os.chown(self._real(path), uid, gid)
        return 0

    def utimens(self, path: str, times=None) -> int:
        os.utime(self._real(path), ns=times)
        return 0

    def statfs(self, path: str) -> dict:
        st = os.statvfs(self._real(path))
        return {key: getattr(st, key) for key in (
            "f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files",
            "f_flag", "f_frsize", "f_namemax")}

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        with self._mutex:
            real = self._real(path)
            st = os.lstat(real)
            if self.names:
                on_disk = self.disk_size.setdefault(st.st_ino, st.st_size)
                if length < on_disk:  # what the cut takes back, if it comes first
                    with open(real, "rb") as fp:
                        fp.seek(length)
                        kept = fp.read(on_disk - length)
                    self.cut_off.setdefault(st.st_ino, []).append((length, kept))
            os.truncate(real, length)
            if (dirty := self.dirty.get(st.st_ino)) is not None:
                dirty.truncate(length)
        return 0

    # -- data: held until fsync ---------------------------------------------

    def create(self, path: str, mode: int, fi=None) -> int:
        with self._mutex:
            real = self._real(path)
            if os.path.lexists(real):
                self.truncate(path, 0)
            else:
                os.close(os.open(real, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode))
                if self.names:
                    inode = os.lstat(real).st_ino
                    self.disk_size[inode] = 0
                    self.names.record("create", real, inode)
            return self.open(path, os.O_RDWR)

    def open(self, path: str, flags: int) -> int:
        if flags & os.O_TRUNC:
            self.truncate(path, 0)
        # Our own descriptor reads and writes whatever the caller may do.
        fd = os.open(self._real(path), os.O_RDWR if os.access(self._real(path), os.W_OK)
                     else os.O_RDONLY)
        self.appending[fd] = bool(flags & os.O_APPEND)
        return fd

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        with self._mutex:
            st = os.fstat(fh)
            length = max(0, min(size, st.st_size - offset))
            buf = bytearray(os.pread(fh, length, offset).ljust(length, b"\0"))
            if (dirty := self.dirty.get(st.st_ino)) is not None:
                dirty.overlay(buf, offset)
            return bytes(buf)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        with self._mutex:
            st = os.fstat(fh)
            if self.appending.get(fh):
                offset = st.st_size
            if offset + len(data) > st.st_size:  # readers see the new size at once
                if self.names:
                    self.disk_size.setdefault(st.st_ino, st.st_size)
                os.ftruncate(fh, offset + len(data))
            self.dirty.setdefault(st.st_ino, Dirty()).add(offset, bytes(data))
            return len(data)

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        with self._mutex:
            inode = os.fstat(fh).st_ino
            dirty = self.dirty.pop(inode, None)
            if dirty is not None:
                for at, data in dirty.writes:
                    os.pwrite(fh, data, at)
                self.synced += dirty.size
            self.disk_size.pop(inode, None)
            self.cut_off.pop(inode, None)
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        with self._mutex:
            if self.names:
                self.names.synced(os.lstat(self._real(path)).st_ino)
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0

    def release(self, path: str, fh: int) -> int:
        with self._mutex:
            self.appending.pop(fh, None)
            if os.fstat(fh).st_nlink == 0:  # removed and now closed: its inode may be reused
                self._forget(os.fstat(fh).st_ino)
            os.close(fh)
        return 0

    def _forget(self, inode: int) -> None:
        self.dirty.pop(inode, None)
        self.disk_size.pop(inode, None)
        self.cut_off.pop(inode, None)

    # -- the power cut -------------------------------------------------------

    def clear_cache(self) -> str:
        with self._mutex:
            lost = sum(d.size for d in self.dirty.values())
            files = len(self.dirty)
            self.dirty.clear()
            self.dropped += lost
            answer = f"ok dropped {lost} bytes of {files} files"
            if self.names:
                shortened = self._back_to_disk_sizes()
                answer += (f", undid {self.names.undo()} name changes, cut {shortened} "
                           "files to their fsynced size")
        return answer

    def _back_to_disk_sizes(self) -> int:
        shortened = 0
        for top in (self.backing, self.names.graveyard):
            for folder, _, names in os.walk(top):
                for name in names:
                    shortened += self._to_disk_size(os.path.join(folder, name))
        self.disk_size.clear()
        self.cut_off.clear()
        return shortened

    def _to_disk_size(self, path: str) -> int:
        inode = os.lstat(path).st_ino
        if inode not in self.disk_size:
            return 0
        with open(path, "r+b") as fp:
            for at, data in reversed(self.cut_off.get(inode, [])):
                fp.seek(at)
                fp.write(data)
            fp.truncate(self.disk_size[inode])
        return 1

    def stats(self) -> str:
        with self._mutex:
            held = sum(d.size for d in self.dirty.values())
            names = f" names {len(self.names.journal)}" if self.names else ""
        return f"ok held {held} synced {self.synced} dropped {self.dropped}{names}"


def serve_control(fs: LossyFS, path: str) -> None:
    """Answer one command per connection on the Unix socket at ``path``."""
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(8)
    while True:
        conn, _ = server.accept()
        with conn:
            command = conn.recv(256).decode().strip()
            handler = {"clear-cache": fs.clear_cache, "stats": fs.stats}.get(command)
            answer = handler() if handler else f"error unknown command {command!r}"
            conn.sendall(answer.encode() + b"\n")


def control(path: str, command: str, timeout: float = 30.0) -> str:
    """Send ``command`` (``clear-cache`` or ``stats``); its answer."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(command.encode())
        answer = sock.recv(4096).decode().strip()
    if not answer.startswith("ok"):
        raise RuntimeError(answer)
    return answer


def main(argv: list[str]) -> int:
    import mfusepy

    strict = "--strict" in argv
    backing, mountpoint, control_path = [a for a in argv if a != "--strict"]
    fs = LossyFS(backing, strict=strict)
    threading.Thread(target=serve_control, args=(fs, control_path), daemon=True).start()
    mfusepy.FUSE(fs, mountpoint, foreground=True, nothreads=False, direct_io=True,
                 attr_timeout=0, entry_timeout=0, negative_timeout=0, auto_unmount=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
