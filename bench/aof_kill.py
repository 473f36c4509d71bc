"""What a kill -9 of Redis loses of the writes it acknowledged, by
``appendfsync`` setting, while another program keeps the disk busy.

    python bench/aof_kill.py        # about a minute; writes 128 MiB scratch files

For each setting and turn: a Redis with AOF on a free loopback port, two
threads rewriting 64 MiB files and fsyncing them, and a client that SETs
one key after another and asks ``INFO persistence`` after each answer. As
soon as Redis says its AOF buffer still holds what it answered (or after
15 s), Redis is killed with -9 and started again on the same files, and
the keys it acknowledged are counted. docs/reliability.rst has a run.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time

import redis

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from gearhorn.supervision import servers

TURNS = 4


def start(data_dir: str, port: int, fsync: str) -> servers.Managed:
    """Redis as gearhorn starts it (servers.start_redis), but with ``fsync``:
    the later ``--appendfsync`` wins."""
    return servers.start_redis(port, data_dir, appendonly=True,
                               extra=["--appendfsync", fsync])


def busy_disk(folder: str, stop: threading.Event, index: int) -> None:
    block = os.urandom(1 << 20) * 8
    with open(os.path.join(folder, f"busy{index}"), "wb") as fp:
        while not stop.is_set():
            fp.seek(0)  # the same 64 MiB again: the file never grows
            for _ in range(8):
                fp.write(block)
            fp.flush()
            os.fsync(fp.fileno())


def turn(folder: str, fsync: str) -> tuple[int, int, int]:
    """(acknowledged, AOF buffer at the kill, acknowledged and lost)."""
    data_dir = tempfile.mkdtemp(dir=folder)
    port = servers.free_port()
    server = start(data_dir, port, fsync)
    client = redis.Redis(port=port)
    stop = threading.Event()
    busy = [threading.Thread(target=busy_disk, args=(folder, stop, i)) for i in range(2)]
    for thread in busy:
        thread.start()
    acknowledged, buffered, deadline = 0, 0, time.monotonic() + 15
    try:
        while time.monotonic() < deadline and not buffered:
            client.set(f"k{acknowledged}", "x")
            acknowledged += 1
            buffered = client.info("persistence")["aof_buffer_length"]
        server.kill()
    finally:
        stop.set()
        for thread in busy:
            thread.join()
    server = start(data_dir, port, fsync)
    kept = redis.Redis(port=port).dbsize()
    server.stop()
    return acknowledged, buffered, acknowledged - kept


def main() -> None:
    folder = tempfile.mkdtemp(prefix="aof-kill-", dir="/var/tmp")  # a disk, not tmpfs
    try:
        for fsync in ("everysec", "no"):
            runs = [turn(folder, fsync) for _ in range(TURNS)]
            print(f"appendfsync {fsync:8}  (acknowledged, AOF buffer at the kill, "
                  f"acknowledged and lost): {runs}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
