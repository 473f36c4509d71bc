"""What a process's acknowledgements wait for, and what they promise.

Why it is shaped so: docs/design/notes.rst, "gearhorn/store/durability.py".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import redis

from gearhorn.errors import GearhornError
from gearhorn.runtime.background import Backoff
from gearhorn.store import redisconn
from gearhorn.store.fsync import (
    ALWAYS,
    BARRIER,
    CLUSTER,
    UNSERVED,
    VOLATILE,
    BarrierUnavailable,
    FsyncBarrier,
    RedisLost,
    served,
)
from gearhorn.store.redisconn import REDIS_ERRORS
from gearhorn.store.replicas import ReplicaWait

if TYPE_CHECKING:
    from gearhorn.config import Config

log = logging.getLogger(__name__)

# Seconds an outage of a barrier is waited out (the config's barrier_timeout).
PATIENCE = 5.0


class SetupError(GearhornError):
    """A durability setting that cannot be kept in the setup found: the
    start stops with this one line."""

    exit_code = 2


class Durability:
    """Every barrier an acknowledgement of this process waits for (the
    registry's Redis): :meth:`wait` after the writes
    it covers were answered, before the acknowledgement is sent."""

    def __init__(self, barriers: Sequence[FsyncBarrier] = (), patience: float = PATIENCE,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic,
                 replicas: ReplicaWait | None = None) -> None:
        self.barriers = list(barriers)
        self.replicas = replicas  # min_replicas > 0: the replica wait of each commit
        self.patience = patience  # seconds an outage is waited out
        self._sleep, self._clock = sleep, clock
        self.waits = 0  # acknowledgements that waited for a disk (tests, metrics)

    def marks(self) -> tuple[int, ...]:
        """Before the writes an acknowledgement will cover (see :meth:`wait`)."""
        return tuple(b.mark() for b in self.barriers)

    def wait(self, marks: tuple[int, ...] | None = None) -> None:
        """Return once every barrier covers what was written before the call.

        Raises FsyncFailed; RedisLost when a connection broke since
        ``marks`` were taken (raised once that Redis answers again: the
        work is to be done again); BarrierUnavailable when an outage lasted
        ``patience`` seconds (the reason says which barrier and why)."""
        backoff, given_up_at = Backoff(0.05), None
        while True:
            try:
                self._wait_once(marks)
                return
            except RedisLost as exc:
                self._until_answered(exc)
                raise
            except BarrierUnavailable as exc:
                now = self._clock()
                given_up_at = given_up_at or now + self.patience
                if now >= given_up_at:
                    raise BarrierUnavailable(f"{exc} (waited {self.patience:g}s for it)") from None
                self._sleep(min(backoff.failed(), given_up_at - now))

    def _wait_once(self, marks: tuple[int, ...] | None) -> None:
        needed = [b for b in self.barriers if _needed(b)]
        if not needed and self.replicas is None:
            return
        try:
            tickets = [(b, *b.ticket()) for b in needed]  # every syncer woken first
            if self.replicas is not None:  # while the syncers fsync
                self.replicas.wait()
        except REDIS_ERRORS as exc:
            raise RedisLost(f"acknowledgement: {exc}") from None
        if marks is not None:
            for barrier, mark in zip(self.barriers, marks, strict=True):
                if barrier in needed and barrier.mark() != mark:
                    raise RedisLost(f"connection to {barrier.name} lost since the writes")
        for barrier, ticket, epoch in tickets:
            barrier.wait(ticket, epoch)
        self.waits += 1

    def _until_answered(self, lost: RedisLost) -> None:
        """Wait (``patience`` at most) until every barrier's Redis answers
        again, so that the work done again can be acknowledged; raises
        BarrierUnavailable when one stays away."""
        backoff, give_up = Backoff(0.05), self._clock() + self.patience
        while True:
            try:
                for client in self._clients():
                    client.ping()
                return
            except REDIS_ERRORS as exc:
                if self._clock() >= give_up:
                    raise BarrierUnavailable(f"{lost}; still unreachable after "
                                             f"{self.patience:g}s: {exc}") from None
                self._sleep(backoff.failed())

    def _clients(self) -> list:
        replicas = [self.replicas.client] if self.replicas is not None else []
        return [b.client for b in self.barriers] + replicas

    def close(self) -> None:
        for barrier in self.barriers:
            barrier.close()


def _needed(barrier: FsyncBarrier) -> bool:
    try:
        return barrier.needed()
    except REDIS_ERRORS as exc:
        raise BarrierUnavailable(f"fsync barrier: cannot ask {barrier.name}: {exc}"
                                 f"{barrier.hint}") from None


NO_DURABILITY = Durability()


def for_config(config: Config, registry: redis.Redis | None = None) -> Durability:
    """The barrier of one process: the registry's Redis (``registry``, or
    a client of its own). None with ``durability = written``; with
    ``auto``, an AOF no syncer serves is not waited for. gearmand's own
    queue is never waited for: what it keeps is its business."""
    if config.durability == "written" and not config.min_replicas:
        return NO_DURABILITY
    strict = config.durability == "fsync"
    registry = registry or redisconn.for_config(config, socket_timeout=10,
                                                socket_connect_timeout=5)
    name = f"the registry's Redis ({redisconn.safe(config.redis_url)})"
    barriers = [] if config.durability == "written" else [FsyncBarrier(registry, name, strict)]
    return Durability(barriers, config.barrier_timeout, replicas=_replica_wait(
        config, registry, name))


def _replica_wait(config: Config, registry: redisconn.AnyRedis, name: str) -> ReplicaWait | None:
    if not config.min_replicas:
        return None
    if redisconn.is_cluster_client(registry):
        raise SetupError("min_replicas waits for the replicas of one master (a single Redis, "
                         "or the master Sentinel names): a Redis Cluster's writes go to several "
                         "masters; set min_replicas = 0 there (docs/reliability.rst)")
    return ReplicaWait(registry, name, config.min_replicas, config.replica_timeout)


# -- what an acknowledgement covers, in words (pure) --------------------------

WRITTEN = "written"  # durability = written: no barrier is asked

COVERS = {
    BARRIER: "on disk: after an fsync by its syncer (a power cut loses nothing "
             "acknowledged)",
    ALWAYS: "on disk: appendfsync always syncs before Redis answers",
    UNSERVED: "written, not fsynced: no syncer serves its append-only file, so its "
              "appendfsync decides (everysec: a power cut may lose the last second or two; "
              "gearhorn fsyncd beside it makes acknowledgements wait for the disk)",
    VOLATILE: "in memory only: it keeps no append-only file, so a restart of it loses what "
              "it holds (appendonly yes keeps it)",
    CLUSTER: "written: a Redis Cluster's masters reach the disk as their appendfsync says "
             "(always: before they answer)",
    WRITTEN: "written, not fsynced (durability = written): a kill -9 loses nothing, a power "
             "cut the last second",
}


QUEUED = "copies queued in gearmand"
# With copies = held, what gearmand keeps itself: its own jobs only.
QUEUED_BESIDE_HELD = "jobs submitted straight to gearmand (gearman -b, other producers)"


def gearmand_covers(persistence: str, what: str = QUEUED) -> str:
    """What ``what`` (queued in gearmand) survives, as ``persistence`` says.

    >>> gearmand_covers("none")
    "copies queued in gearmand: in gearmand's memory, lost when it stops"
    """
    if persistence == "redis":  # a gearmand of the operator's, run with -q redis
        return (f"{what}: background ones in its redis queue, as durable as that Redis "
                f"(not waited for), foreground ones in its memory")
    if persistence == "sqlite":
        return (f"{what}: background ones in its sqlite queue on gearmand's host, foreground "
                f"ones in its memory")
    if persistence == "none":
        return f"{what}: in gearmand's memory, lost when it stops"
    return (f"{what}: kept as that gearmand keeps its queue; with its memory queue (started "
            f"without -q) a restart of it loses them (persistence = sqlite or redis says "
            f"how yours keeps them: docs/operations.rst)")


HELD_COVERS = ("fanout copies and the bridge's SENDs (copies = held): in the registry's Redis "
               "until their receivers answer, as that Redis keeps them (above); a crash of "
               "gearmand loses none, it only dispatches them")


def promises(config: Config, found: Sequence[tuple[str, str]]) -> list[str]:
    """A line for each (store, verdict) of :func:`verdicts`, one for held
    copies (``copies = held``), one for what gearmand queues and one for
    the replicas waited for."""
    held = config.copies == "held"
    return [f"{name}: {COVERS[verdict]}" for name, verdict in found] + [HELD_COVERS] * held + [
        gearmand_covers(config.persistence, QUEUED_BESIDE_HELD if held else QUEUED),
        replicas_cover(config.min_replicas, config.replica_timeout)]


def replicas_cover(needed: int, timeout: float) -> str:
    """What the replica wait adds to an acknowledgement (min_replicas).

    >>> replicas_cover(0, 1.0)[:40]
    'replicas: none waited for (min_replicas '
    """
    if not needed:
        # Not "survives a power cut": a Redis without AOF does not (said above).
        return ("replicas: none waited for (min_replicas = 0): what that Redis holds is lost "
                "with its disk, whatever the line above says it survives")
    return (f"replicas: also on {needed} replica(s) of that Redis (WAITAOF where the server "
            f"has it: fsynced there; WAIT before Redis 7.2: received), refused with the "
            f"reason when fewer confirm within {timeout:g}s for barrier_timeout")


# -- asking the servers ------------------------------------------------------


def verdicts(config: Config, durability: Durability) -> list[tuple[str, str]]:
    """(store, verdict) for every Redis an acknowledgement covers, asked
    now; raises SetupError when a setting cannot be kept."""
    if not durability.barriers:
        return [(f"the registry's Redis ({redisconn.safe(config.redis_url)})", WRITTEN)]
    return [(b.name, _verdict(b, config.durability)) for b in durability.barriers]


def _verdict(barrier: FsyncBarrier, durability: str) -> str:
    try:
        found = barrier.verdict()
    except REDIS_ERRORS as exc:
        raise SetupError(f"cannot reach {barrier.name}: {exc}{barrier.hint}") from None
    if durability != "fsync":
        return found
    if found == VOLATILE:
        raise SetupError(f"durability = fsync, but {barrier.name} keeps no append-only file: "
                         "turn on appendonly, or set durability = auto")
    if found == BARRIER and not _serving(barrier):
        raise SetupError(f"durability = fsync, but no syncer serves {barrier.name}: run "
                         "gearhorn fsyncd beside it, or set its appendfsync to always, or "
                         "durability = auto")
    return found


def _serving(barrier: FsyncBarrier) -> bool:
    try:
        return served(barrier.client)
    except REDIS_ERRORS:
        return False


def check_at_start(config: Config) -> list[str]:
    """What acknowledgements promise here, said in one log line before a
    worker pool or a bridge serves; raises SetupError (the start stops)."""
    try:
        barriers = for_config(config)
    except REDIS_ERRORS as exc:
        raise SetupError(f"cannot reach the registry's Redis "
                         f"({redisconn.safe(config.redis_url)}): {exc}") from None
    try:
        found = verdicts(config, barriers)
        _warn_if_too_few_replicas(barriers.replicas)
    finally:
        barriers.close()
    lines = promises(config, found)
    on_disk = all(v in (BARRIER, ALWAYS) for _, v in found)
    log.log(logging.INFO if on_disk else logging.WARNING, "acknowledgements: %s",
            "; ".join(lines))
    return lines


def _warn_if_too_few_replicas(replicas: ReplicaWait | None) -> None:
    connected = replicas.connected() if replicas is not None else None
    if replicas is not None and connected is not None and connected < replicas.needed:
        log.warning("min_replicas = %d, but %s has %d replica(s) connected: acknowledgements "
                    "are refused until enough are", replicas.needed, replicas.name, connected)
