"""The syncer: serves the fsync barrier of one Redis, beside it.

Why it is shaped so: docs/design/notes.rst, "gearhorn/supervision/aofsync.py".
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass

import redis

from gearhorn.runtime.background import Backoff, Outage
from gearhorn.store.fsync import SYNCED, TICKET, WAKE, Round
from gearhorn.store.redisconn import REDIS_ERRORS, SILENCE_WATCHED

log = logging.getLogger(__name__)

# The longest the files go unsynced while nobody asks (seconds).
INTERVAL = 1.0


@dataclass(frozen=True)
class AofLayout:
    """Where a Redis keeps its append-only file: its ``dir``, and in it
    Redis 7's ``appenddirname`` folder or Redis 6's ``appendfilename``."""

    data_dir: str
    folder: str = "appendonlydir"
    filename: str = "appendonly.aof"


def layout_of(client: redis.Redis, data_dir: str | None = None) -> AofLayout:
    """Ask Redis where its AOF is (``data_dir`` given: that folder, as on
    this host); raises Redis's errors when it will not say."""
    names = {**client.config_get("appenddirname"), **client.config_get("appendfilename")}
    names = {_text(k): _text(v) for k, v in names.items()}
    return AofLayout(data_dir or _text(client.config_get("dir")["dir"]),
                     names.get("appenddirname", "appendonlydir"),
                     names.get("appendfilename", "appendonly.aof"))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def aof_files(layout: AofLayout) -> list[str]:
    """The append-only files of ``layout``: Redis 7's folder (base,
    increments, manifest) or Redis 6's one file."""
    found = []
    folder = os.path.join(layout.data_dir, layout.folder)
    if os.path.isdir(folder):
        found += [os.path.join(folder, name) for name in sorted(os.listdir(folder))]
    single = os.path.join(layout.data_dir, layout.filename)
    if os.path.isfile(single):
        found.append(single)
    return found


def folders(layout: AofLayout) -> list[str]:
    """The folders whose entries name those files: a new increment's, a
    renamed manifest's or Redis 6's renamed file's name is on disk only
    once its folder is synced (and a new ``appendonlydir`` once ``dir`` is)."""
    folder = os.path.join(layout.data_dir, layout.folder)
    return [folder, layout.data_dir] if os.path.isdir(folder) else [layout.data_dir]


def ancestors(data_dir: str) -> list[str]:
    """The folders above ``data_dir`` on its file system, nearest first:
    a ``dir`` made just before Redis started (``gearhorn up`` makes its
    own) is on disk only once each of them is synced."""
    found, path = [], os.path.abspath(data_dir)
    while not os.path.ismount(path):
        path = os.path.dirname(path)
        found.append(path)
    return found


def sync(layout: AofLayout) -> int:
    """fsync every AOF file of ``layout`` and the folders that name them (a
    file Redis removed meanwhile, after a rewrite, is skipped); returns how
    many files were synced. An fsync that fails raises OSError."""
    synced = 0
    for path in aof_files(layout):
        synced += _fsync(path)
    for folder in folders(layout):
        _fsync(folder)
    return synced


def _fsync(path: str) -> int:
    """1 once ``path`` is synced, 0 when it is gone."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return 0
    try:
        os.fsync(fd)
        return 1
    finally:
        os.close(fd)


class AofSyncer:
    """A thread serving the fsync barrier of the Redis at ``url``, whose
    files are in ``data_dir`` (asked of Redis when not given; the names of
    its AOF are always asked: ``CONFIG GET appenddirname appendfilename``)."""

    def __init__(self, url: str, data_dir: str | None = None, *,
                 interval: float = INTERVAL, fsync=sync) -> None:
        self.url = url
        self.data_dir = data_dir
        self.layout: AofLayout | None = None  # found when it starts serving
        self.refused = ""  # why it does not serve, when it cannot
        self.interval = interval
        self.rounds = 0  # fsyncs made (tests, the benchmark)
        self.covered = 0  # tickets those fsyncs covered
        self.waited_on = 0  # fsyncs that covered a ticket (the idle ones not)
        self._fsync = fsync
        self._done = 0  # the last ticket synced (or failed)
        self._last_sync = float("-inf")
        self._missing = Outage(log, f"the append-only files of {url}")
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
        outage, backoff = Outage(log, f"fsync barrier of {self.url}"), Backoff(0.1)
        while not self._stopping.is_set():
            client = redis.Redis.from_url(self.url, socket_timeout=10, **SILENCE_WATCHED)
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
        try:
            self.layout = layout_of(client, self.data_dir)
        except redis.ResponseError as exc:  # CONFIG refused: the files cannot be found
            self._refuse(f"it will not say where its append-only file is ({exc})")
            return
        self.data_dir = self.layout.data_dir
        if not os.path.isdir(self.data_dir):  # an fsync here would cover nothing: never say ok
            self._refuse(f"it keeps its files in {self.data_dir}, which is not on this host "
                         f"(run the syncer where Redis runs)")
            return
        for folder in ancestors(self.data_dir):  # once: they change no more
            _fsync(folder)
        # A Redis (re)connected to may have restarted with a lower ticket
        # counter: what was synced before says nothing of its tickets now.
        self._done = 0
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

    def _refuse(self, reason: str) -> None:
        self.refused = reason
        log.error("the Redis at %s: %s: no fsync barrier served", self.url, reason)
        self._stopping.wait(10)

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
        round_ = Round(first, ticket, self._sync())
        if not round_.reason:
            self.rounds += 1
            self.covered += ticket - first
            self.waited_on += ticket > first
        self._done, self._last_sync = ticket, time.monotonic()
        client.publish(SYNCED, round_.encode())

    def _sync(self) -> str:
        """"" once the files are synced, else why not: a round that synced
        no file is never reported as synced."""
        layout = self.layout
        try:
            synced = self._fsync(layout)
        except OSError as exc:
            log.error("fsync of Redis's append-only files in %s failed: %s", layout.data_dir, exc)
            return f"{exc}"
        if not synced:
            reason = (f"no append-only file found in {layout.data_dir} ({layout.folder}/ or "
                      f"{layout.filename}): nothing was synced")
            self._missing.failed(reason)  # logged once: idle rounds find the same
            return reason
        self._missing.succeeded()
        return ""
