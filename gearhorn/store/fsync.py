"""Acknowledgements after fsync: the waiting side of the fsync barrier.

Why it is shaped so: docs/design/notes.rst, "gearhorn/store/fsync.py".
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import redis

from gearhorn.errors import GearhornError
from gearhorn.store.redisconn import REDIS_ERRORS, is_cluster_client

log = logging.getLogger(__name__)

TICKET = "gearhorn:fsync:ticket"
WAKE = "gearhorn:fsync:wake"
SYNCED = "gearhorn:fsync:synced"

# The answers of verdict(): what an acknowledgement waits for on one Redis.
BARRIER = "barrier"  # its syncer's fsync
ALWAYS = "always"  # nothing: Redis synced before it answered
VOLATILE = "volatile"  # nothing: it keeps no append-only file
UNSERVED = "unserved"  # nothing: an AOF no syncer serves (durability = auto)
CLUSTER = "cluster"  # nothing: a Redis Cluster, which the barrier does not cover

# How long a verdict holds before Redis is asked again (its settings may change).
VERDICT_TTL = 5.0
# A waiter wakes the syncer again this often while it waits (a lost wake,
# a syncer restarted) and warns once when its fsync takes longer.
NUDGE_EVERY = 1.0
STALL_WARNING = 5.0


class BarrierUnavailable(GearhornError):
    """No acknowledgement can be given now: no syncer serves the Redis, or
    the connection to it broke (its writes may not be on disk). An outage:
    the caller keeps the work and tries again."""

    lost = False  # True: the connection broke since the writes; redo them


class RedisLost(BarrierUnavailable):
    """The connection to a Redis broke after the writes an acknowledgement
    covers: Redis may have restarted without them (its host lost power).
    The work is done again, not acknowledged."""

    lost = True


class FsyncFailed(GearhornError):
    """The syncer's fsync failed: what the acknowledgement covers may never
    reach the disk. The operation fails with this reason."""


ERRORS = (BarrierUnavailable, FsyncFailed)


# -- the messages (pure) ------------------------------------------------------


@dataclass(frozen=True)
class Round:
    """One syncer round as published: tickets after ``first`` up to
    ``last`` synced (``reason`` empty) or failed (``reason`` says why)."""

    first: int
    last: int
    reason: str = ""

    def encode(self) -> bytes:
        if not self.reason:
            return f"ok {self.last}".encode()
        return f"fail {self.first} {self.last} {self.reason}".encode()

    @classmethod
    def decode(cls, data: bytes | str) -> Round:
        """``ok T`` or ``fail A T reason``; raises ValueError otherwise.

        >>> Round.decode(b"ok 7")
        Round(first=0, last=7, reason='')
        >>> Round.decode(b"fail 3 7 [Errno 5] Input/output error").reason
        '[Errno 5] Input/output error'
        """
        text = data.decode() if isinstance(data, bytes) else data
        word, _, rest = text.partition(" ")
        if word == "ok":
            return cls(0, int(rest))
        if word == "fail":
            first, last, reason = rest.split(" ", 2)
            return cls(int(first), int(last), reason or "fsync failed")
        raise ValueError(f"not a syncer round: {text[:80]!r}")


class Progress:
    """What a process has heard of one Redis's syncer: the highest ticket
    synced, and the failed rounds (the last few). Pure; :class:`Watcher`
    feeds it.

    >>> progress = Progress()
    >>> progress.heard(Round(0, 5)); progress.outcome(4)
    ''
    >>> progress.heard(Round(5, 9, "EIO")); progress.outcome(7)
    'EIO'
    >>> progress.outcome(10) is None  # not covered yet
    True
    """

    def __init__(self, remembered: int = 64) -> None:
        self.synced = 0
        self.failures: deque[Round] = deque(maxlen=remembered)

    def heard(self, round_: Round) -> None:
        if round_.reason:
            self.failures.append(round_)
        else:
            self.synced = max(self.synced, round_.last)

    def outcome(self, ticket: int) -> str | None:
        """"" once ``ticket`` is on disk, the reason if its fsync failed,
        None while it waits. A failure wins over a later success: the
        kernel may have dropped the pages a failed fsync did not write."""
        for failed in self.failures:
            if failed.first < ticket <= failed.last:
                return failed.reason
        return "" if ticket <= self.synced else None


def served(client: redis.Redis) -> bool:
    """Does a syncer listen for this Redis's wakes?"""
    return any(count for _, count in client.pubsub_numsub(WAKE))


def verdict(client: redis.Redis) -> str:
    """What an acknowledgement waits for on the Redis of ``client``."""
    try:
        config = client.config_get("append*")
    except redis.ResponseError:  # CONFIG refused (ACL, a managed Redis): a syncer is needed
        return BARRIER
    settings = {_text(k): _text(v) for k, v in config.items()}
    if settings.get("appendonly", "no") != "yes":
        return VOLATILE
    if settings.get("appendfsync") == "always":
        return ALWAYS
    return BARRIER


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# -- the waiting side ---------------------------------------------------------


class Watcher:
    """One connection per process and Redis that hears the syncer's rounds
    and wakes the waiters they cover (a thread; a greenlet in the bridge)."""

    def __init__(self, client: redis.Redis, name: str) -> None:
        self.client, self.name = client, name
        self.progress = Progress()
        self.changed = threading.Condition()
        self.epoch = 0  # +1 whenever the connection broke: what was waited for may be lost
        self.listening = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    def ensure_started(self, timeout: float) -> int:
        """Listening before any ticket is taken (a round published earlier
        is missed); returns the epoch a waiter checks later."""
        with self._start_lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name=f"gearhorn-fsync-{self.name}")
                self._thread.start()
        if not self.listening.wait(timeout):
            raise BarrierUnavailable(f"cannot listen for the fsync barrier of {self.name}")
        return self.epoch

    def stop(self, wait: float = 0.0) -> None:
        """Stop listening; ``wait`` > 0: until the thread ended (before its
        client is closed under it), at most that many seconds."""
        self._stopping.set()
        if wait > 0 and self._thread is not None:
            self._thread.join(wait)

    def _run(self) -> None:
        while not self._stopping.is_set():
            pubsub = self.client.pubsub()
            try:
                pubsub.subscribe(SYNCED)
                self._confirmed(pubsub)
                self.listening.set()
                while not self._stopping.is_set():
                    message = pubsub.get_message(timeout=1.0)
                    if message is not None and message.get("type") == "message":
                        self._heard(message["data"])
            except REDIS_ERRORS as exc:
                log.warning("fsync barrier of %s: connection lost (%s); the waits it held "
                            "are retried", self.name, exc)
            except Exception as exc:  # noqa: BLE001 - a dead listener would hang every wait
                # redis-py raises TypeError when its socket is closed under a read.
                log.warning("fsync barrier of %s: listener failed (%r); listening again",
                            self.name, exc)
            finally:
                self.listening.clear()
                self._broke()
                with contextlib.suppress(Exception):
                    pubsub.close()
            self._stopping.wait(0.2)

    def _confirmed(self, pubsub: redis.client.PubSub) -> None:
        """Wait for Redis to confirm the SUBSCRIBE: only then is every
        round published after a ticket sure to reach us."""
        while not self._stopping.is_set():
            message = pubsub.get_message(timeout=1.0)
            if message is not None and message.get("type") == "subscribe":
                return

    def _heard(self, data: bytes) -> None:
        try:
            round_ = Round.decode(data)
        except ValueError as exc:
            log.warning("fsync barrier of %s: %s", self.name, exc)
            return
        with self.changed:
            self.progress.heard(round_)
            self.changed.notify_all()

    def _broke(self) -> None:
        with self.changed:
            self.epoch += 1
            self.progress = Progress()  # tickets after a restart start where the AOF left off
            self.changed.notify_all()


class FsyncBarrier:
    """The barrier of one Redis, for every thread of one process."""

    def __init__(self, client: redis.Redis, name: str, strict: bool = True,
                 clock: Callable[[], float] = time.monotonic, hint: str = "") -> None:
        self.client, self.name = client, name
        self.hint = hint  # said when the Redis cannot be reached
        # True (durability = fsync): an AOF must have its syncer; False
        # (auto): one without is acknowledged once written, until one is seen.
        self.strict = strict
        self.watcher = Watcher(client, name)
        self._clock = clock
        self._verdict, self._asked = "", float("-inf")
        self._served = False  # a syncer was seen: from then on it is waited for

    def needed(self) -> bool:
        """Must an acknowledgement wait for this Redis's syncer?"""
        return self.verdict() == BARRIER

    def verdict(self) -> str:
        """What an acknowledgement waits for here (asked again after
        VERDICT_TTL); raises Redis's errors when it cannot be asked."""
        if self._clock() - self._asked > VERDICT_TTL:
            self._verdict, self._asked = self._ask(), self._clock()
        return self._verdict

    def _ask(self) -> str:
        if is_cluster_client(self.client):
            return CLUSTER
        found = verdict(self.client)
        if found == BARRIER and not self._served:
            self._served = served(self.client)
            if not self._served and not self.strict:
                return UNSERVED  # said once, at start (gearhorn/store/durability.py)
        return found

    def ticket(self) -> tuple[int, int]:
        """(ticket, epoch) for what this process's writes have made so far;
        raises BarrierUnavailable when no syncer listens."""
        epoch = self.watcher.ensure_started(timeout=10.0)
        pipe = self.client.pipeline(transaction=False)
        pipe.incr(TICKET)
        pipe.publish(WAKE, b"1")
        ticket, listeners = pipe.execute()
        if not listeners:
            raise BarrierUnavailable(
                f"no fsync barrier serves {self.name}: acknowledgements wait until one "
                f"does (gearhorn fsyncd beside it; or appendfsync always; or "
                f"durability = written, which acknowledges before the disk)")
        return int(ticket), epoch

    def mark(self) -> int:
        """Taken before writes: :meth:`Durability.wait` with it fails if the
        connection broke after them."""
        return self.watcher.epoch

    def wait(self, ticket: int, epoch: int) -> None:
        """Return once ``ticket`` is on disk; raises FsyncFailed or
        BarrierUnavailable. A slow disk makes this wait, never lie."""
        watcher, started = self.watcher, self._clock()
        warned = False
        with watcher.changed:
            while True:
                if watcher.epoch != epoch:
                    raise RedisLost(f"connection to {self.name} lost while waiting for "
                                    "its fsync")
                outcome = watcher.progress.outcome(ticket)
                if outcome == "":
                    return
                if outcome is not None:
                    raise FsyncFailed(f"fsync of {self.name} failed: {outcome}")
                if not watcher.changed.wait(NUDGE_EVERY):
                    warned = self._nudge(started, warned)

    def _nudge(self, started: float, warned: bool) -> bool:
        """Wake the syncer again (a wake it missed), and say once that the
        disk is slow; raises BarrierUnavailable when the syncer is gone."""
        waited = self._clock() - started
        if waited >= STALL_WARNING and not warned:
            log.warning("fsync barrier of %s: waited %.1fs for the disk; "
                        "acknowledgements wait for it", self.name, waited)
            warned = True
        try:
            listeners = self.client.publish(WAKE, b"1")
        except REDIS_ERRORS as exc:
            raise BarrierUnavailable(f"{self.name}: {exc}") from None
        if not listeners:
            raise BarrierUnavailable(f"the fsync barrier of {self.name} stopped serving")
        return warned

    def close(self, wait: float = 0.0) -> None:
        self.watcher.stop(wait)
