"""A file system that loses what was not fsynced: a power cut for tests.

``python -m tests.lossyfs BACKING MOUNTPOINT CONTROL_SOCKET`` mounts
BACKING at MOUNTPOINT (FUSE 3, mfusepy) with LazyFS's semantics
(dsrhaslab/lazyfs, which Jepsen uses to test databases for power cuts):

- Metadata takes effect at once: creating, renaming, removing files and
  folders, and file sizes (a write past the end grows the file at once).
- Data written to a file stays in this process's memory until the file
  is fsynced (fsync or fdatasync, through any descriptor of it); reads see
  it meanwhile. Only then is it written to BACKING.
- ``clear-cache`` on the control socket drops every write not fsynced:
  the power goes off. A file keeps its size, so a page that never
  reached the disk reads as zeros (LazyFS's harsher case: a file cut
  short is easier on a reader than one padded with zeros, and Redis's
  own check repairs only the first).

The kernel's page cache is bypassed (``direct_io``, no attribute
caching), so after ``clear-cache`` every reader sees what the "disk"
kept. :func:`control` sends a command and returns the answer.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
import threading
from dataclasses import dataclass, field

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
    ``backing`` whose data writes wait for fsync."""

    use_ns = True

    def __init__(self, backing: str) -> None:
        self.backing = os.path.realpath(backing)
        self._mutex = threading.RLock()
        self.dirty: dict[str, Dirty] = {}  # by path in BACKING
        self.appending: dict[int, bool] = {}  # fh -> opened with O_APPEND
        self.dropped = self.synced = 0  # bytes (stats)

    def _real(self, path: str) -> str:
        return os.path.join(self.backing, path.lstrip("/"))

    # -- metadata: at once ---------------------------------------------------

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
        os.mkdir(self._real(path), mode)
        return 0

    def rmdir(self, path: str) -> int:
        os.rmdir(self._real(path))
        return 0

    def unlink(self, path: str) -> int:
        with self._mutex:
            os.unlink(self._real(path))
            self.dirty.pop(self._real(path), None)
        return 0

    def rename(self, old: str, new: str) -> int:
        with self._mutex:
            os.rename(self._real(old), self._real(new))
            moved = self.dirty.pop(self._real(old), None)
            self.dirty.pop(self._real(new), None)
            if moved is not None:
                self.dirty[self._real(new)] = moved
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
            os.truncate(self._real(path), length)
            if (dirty := self.dirty.get(self._real(path))) is not None:
                dirty.truncate(length)
        return 0

    # -- data: held until fsync ---------------------------------------------

    def create(self, path: str, mode: int, fi=None) -> int:
        fd = os.open(self._real(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        os.close(fd)
        return self.open(path, os.O_RDWR)

    def open(self, path: str, flags: int) -> int:
        # Our own descriptor reads and writes whatever the caller may do.
        fd = os.open(self._real(path), os.O_RDWR if os.access(self._real(path), os.W_OK)
                     else os.O_RDONLY)
        self.appending[fd] = bool(flags & os.O_APPEND)
        return fd

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        with self._mutex:
            real = self._real(path)
            length = max(0, min(size, os.fstat(fh).st_size - offset))
            buf = bytearray(os.pread(fh, length, offset).ljust(length, b"\0"))
            if (dirty := self.dirty.get(real)) is not None:
                dirty.overlay(buf, offset)
            return bytes(buf)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        with self._mutex:
            size = os.fstat(fh).st_size
            if self.appending.get(fh):
                offset = size
            if offset + len(data) > size:  # the size is metadata: on "disk" at once
                os.ftruncate(fh, offset + len(data))
            self.dirty.setdefault(self._real(path), Dirty()).add(offset, bytes(data))
            return len(data)

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        with self._mutex:
            dirty = self.dirty.pop(self._real(path), None)
            if dirty is not None:
                for at, data in dirty.writes:
                    os.pwrite(fh, data, at)
                self.synced += dirty.size
        return 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        return 0  # metadata is on "disk" already

    def flush(self, path: str, fh: int) -> int:
        return 0

    def release(self, path: str, fh: int) -> int:
        with self._mutex:
            self.appending.pop(fh, None)
        os.close(fh)
        return 0

    # -- the power cut -------------------------------------------------------

    def clear_cache(self) -> str:
        with self._mutex:
            lost = sum(d.size for d in self.dirty.values())
            files = len(self.dirty)
            self.dirty.clear()
            self.dropped += lost
        return f"ok dropped {lost} bytes of {files} files"

    def stats(self) -> str:
        with self._mutex:
            held = sum(d.size for d in self.dirty.values())
        return f"ok held {held} synced {self.synced} dropped {self.dropped}"


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

    backing, mountpoint, control_path = argv
    fs = LossyFS(backing)
    threading.Thread(target=serve_control, args=(fs, control_path), daemon=True).start()
    mfusepy.FUSE(fs, mountpoint, foreground=True, nothreads=False, direct_io=True,
                 attr_timeout=0, entry_timeout=0, negative_timeout=0, auto_unmount=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
