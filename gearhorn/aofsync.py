"""Syncing the append-only files of the Redis servers ``gearhorn up`` starts.

Redis with ``appendfsync everysec`` answers a write before writing it to its
AOF whenever its last second's fsync is still running (a busy disk): it
postpones the write for up to two seconds, so a kill -9 then loses writes
it acknowledged (measured: docs/reliability.rst). With ``appendfsync no`` it
writes every command to the AOF before it answers, and leaves the sync to
disk to the kernel, which may wait half a minute. So the servers gearhorn
starts run with ``no``, and this syncs their files to disk once a second
instead: a kill -9 loses nothing acknowledged, a power cut about a second.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger(__name__)

INTERVAL = 1.0


def aof_files(data_dir: str) -> list[str]:
    """The append-only files Redis keeps in ``data_dir``: Redis 7's
    ``appendonlydir/`` (base, increments, manifest, and the folder itself, so
    that a new increment's name is on disk too) or Redis 6's one file."""
    found = []
    folder = os.path.join(data_dir, "appendonlydir")
    if os.path.isdir(folder):
        found += [os.path.join(folder, name) for name in sorted(os.listdir(folder))]
        found.append(folder)
    single = os.path.join(data_dir, "appendonly.aof")
    if os.path.isfile(single):
        found.append(single)
    return found


def sync(data_dir: str) -> int:
    """fsync every AOF file in ``data_dir`` (a file Redis removed meanwhile,
    after a rewrite, is skipped); returns how many were synced."""
    synced = 0
    for path in aof_files(data_dir):
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            os.fsync(fd)
            synced += 1
        finally:
            os.close(fd)
    return synced


class AofSyncer:
    """A thread syncing the AOF files of some data directories every ``interval``."""

    def __init__(self, data_dirs: list[str], interval: float = INTERVAL) -> None:
        self.data_dirs = data_dirs
        self.interval = interval
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gearhorn-aof-sync",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():  # not started when start-up failed before it
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stopping.wait(self.interval):
            for data_dir in list(self.data_dirs):
                try:
                    sync(data_dir)
                except OSError as exc:
                    log.error("could not sync Redis's append-only files in %s: %s",
                              data_dir, exc)
