"""The syncer: serves the fsync barrier of one Redis, beside it.

The Redis servers gearhorn starts run ``appendfsync no``: Redis writes
every command to its append-only file before it answers, and leaves the
sync to disk to us (``everysec`` answers up to two seconds ahead of the
file when the disk is slow; ``always`` syncs once per event-loop turn, in
Redis's only thread). This thread syncs the files when a waiter asks
(gearhorn/store/fsync.py has the protocol): it reads the ticket counter,
fsyncs, and publishes the round, so one fsync covers every acknowledgement
waiting at that moment, from every process (group commit). While nobody
asks it still syncs once a second, for what arrives without a ticket (a
job a client submits straight into gearmand).

It must run on the host of its Redis: ``gearhorn up`` runs one per Redis
it starts; ``gearhorn fsyncd`` runs one beside a Redis you run yourself.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import redis

from gearhorn.background import Backoff, Outage
from gearhorn.store.fsync import SYNCED, TICKET, WAKE, Round
from gearhorn.store.redisconn import REDIS_ERRORS

log = logging.getLogger(__name__)

# The longest the files go unsynced while nobody asks (seconds).
INTERVAL = 1.0


def aof_files(data_dir: str, folder_name: str = "appendonlydir") -> list[str]:
    """The append-only files Redis keeps in ``data_dir``: Redis 7's
    ``appendonlydir/`` (base, increments, manifest, and the folder itself, so
    that a new increment's name is on disk too) or Redis 6's one file."""
    found = []
    folder = os.path.join(data_dir, folder_name)
    if os.path.isdir(folder):
        found += [os.path.join(folder, name) for name in sorted(os.listdir(folder))]
        found.append(folder)
    single = os.path.join(data_dir, "appendonly.aof")
    if os.path.isfile(single):
        found.append(single)
    return found


def sync(data_dir: str, folder_name: str = "appendonlydir") -> int:
    """fsync every AOF file in ``data_dir`` (a file Redis removed meanwhile,
    after a rewrite, is skipped); returns how many were synced. An fsync
    that fails raises OSError."""
    synced = 0
    for path in aof_files(data_dir, folder_name):
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


def data_dir_of(client: redis.Redis) -> tuple[str, str]:
    """Where the Redis of ``client`` keeps its AOF: (dir, appenddirname)."""
    config = client.config_get("dir")
    folder = client.config_get("appenddirname").get("appenddirname", "appendonlydir")
    return config["dir"], folder


class AofSyncer:
    """A thread serving the fsync barrier of the Redis at ``url``, whose
    files are in ``data_dir`` (asked of Redis when not given)."""

    def __init__(self, url: str, data_dir: str | None = None, *,
                 interval: float = INTERVAL, fsync=sync) -> None:
        self.url = url
        self.data_dir = data_dir
        self.folder = "appendonlydir"
        self.interval = interval
        self.rounds = 0  # fsyncs made (tests, the benchmark)
        self.covered = 0  # tickets those fsyncs covered
        self._fsync = fsync
        self._done = 0  # the last ticket synced (or failed)
        self._last_sync = float("-inf")
        self.serving = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gearhorn-aof-sync", daemon=True)

    def start(self) -> AofSyncer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():  # not started when start-up failed before it
            self._thread.join(timeout=self.interval + 10)

    def _run(self) -> None:
        outage, backoff = Outage(log, f"fsync barrier of {self.url}"), Backoff(0.1, cap=2.0)
        while not self._stopping.is_set():
            client = redis.Redis.from_url(self.url, socket_timeout=10, socket_connect_timeout=5)
            try:
                self._serve(client)
            except REDIS_ERRORS as exc:
                outage.failed(exc)
                self._stopping.wait(backoff.failed())
            else:
                outage.succeeded()
            finally:
                self.serving.clear()
                client.close()

    def _serve(self, client: redis.Redis) -> None:
        if self.data_dir is None:
            self.data_dir, self.folder = data_dir_of(client)
        if not os.path.isdir(self.data_dir):  # an fsync here would cover nothing: never say ok
            log.error("the Redis at %s keeps its files in %s, which is not on this host: "
                      "no fsync barrier served (run the syncer where Redis runs)",
                      self.url, self.data_dir)
            self._stopping.wait(10)
            return
        pubsub = client.pubsub()
        try:
            pubsub.subscribe(WAKE)
            self.serving.set()
            while not self._stopping.is_set():
                asked = self._woken(pubsub)
                ticket = int(client.get(TICKET) or 0)
                due = time.monotonic() - self._last_sync >= self.interval
                if ticket != self._done or due:
                    self._round(client, ticket)
                elif asked:  # a waiter that missed the last round asks again
                    client.publish(SYNCED, Round(0, self._done).encode())
        finally:
            pubsub.close()

    def _woken(self, pubsub: redis.client.PubSub) -> bool:
        """Wait for a wake (at most ``interval``); swallow the others
        already queued: this round covers them all."""
        message = pubsub.get_message(timeout=self.interval)
        asked = message is not None and message.get("type") == "message"
        while (message := pubsub.get_message(timeout=0)) is not None:
            asked = asked or message.get("type") == "message"
        return asked

    def _round(self, client: redis.Redis, ticket: int) -> None:
        """fsync, then tell the waiters which tickets it covered."""
        first = self._done if ticket >= self._done else 0  # lower: Redis started again
        try:
            self._fsync(self.data_dir, self.folder)
        except OSError as exc:
            log.error("fsync of Redis's append-only files in %s failed: %s", self.data_dir, exc)
            round_ = Round(first, ticket, f"{exc}")
        else:
            round_ = Round(first, ticket)
            self.rounds += 1
            self.covered += ticket - first
        self._done, self._last_sync = ticket, time.monotonic()
        client.publish(SYNCED, round_.encode())
