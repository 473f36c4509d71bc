"""The delivery ledger: events in a bounded Redis Stream (exported to files
by gearhorn/store/ledgerexport.py).

Why it is shaped so: docs/design/notes.rst, "gearhorn/store/ledger.py".
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections import deque
from collections.abc import Sequence

import redis

from gearhorn.rules import auditcounts
from gearhorn.rules.auditcounts import Counts, bucket_of
from gearhorn.rules.events import Event
from gearhorn.runtime.background import Outage, StoppableThread
from gearhorn.store.keys import Keys
from gearhorn.store.ledgerentries import (
    BATCH,
    PUBLISHED_BATCH,
    batch_entry,
    newest,
    published_line,
)
from gearhorn.store.redisconn import REDIS_ERRORS

log = logging.getLogger(__name__)

# Events a writer keeps while Redis is away (the newest entries that hold
# no more than this many; a batch entry holds a flush's worth).
MAX_UNWRITTEN = 100_000


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Ledger:
    """Buffers events and writes them in batches; a disabled ledger does nothing.

    Appending never waits for Redis: ``flush`` (called by the owner's timer,
    or a ``Flusher`` thread) writes everything buffered in one round trip.
    """

    def __init__(self, client: redis.Redis, keys: Keys, maxlen: int = 1_000_000,
                 enabled: bool = True, source: str = "", shards: int = 1,
                 held: bool = True) -> None:
        self.redis = client
        # One stream per writer keeps its events in order; writers spread
        # over ``shards`` streams (and so over a cluster's nodes).
        shard = zlib.crc32(source.encode()) % shards
        self.stream = keys.ledger(shard)
        self.maxlen = max(1, maxlen // shards)
        # The live audit's counts (gearhorn/rules/auditcounts.py), written
        # with each flush. With held copies (``held``) the holder counts
        # the copies it keeps and their answers; else this ledger counts
        # the copies gearmand accepted, and the bridge's deliveries.
        self.counts = Counts()
        self.counts_stream = keys.audit_counts(shard)
        self.counts_maxlen = max(1000, self.maxlen // 10)
        self._counts_due = 0.0
        self.held = held
        self.enabled = enabled
        self.source = source
        # deques: append and popleft are atomic, so threads (the workers'
        # flusher) need no lock, and the bridge's greenlets pay for none (a
        # lock under gevent cost 6% of the bridge's time, py-spy).
        self._buffer: deque[dict[str, str]] = deque()
        self._lines: deque[str] = deque()
        self._published: deque[str] = deque()  # JSON lines of a published-batch
        # Entries Redis refused, written first by the next flush: an outage
        # (a restart, a cluster failover) delays the ledger, it does not
        # lose it, up to MAX_UNWRITTEN events; beyond that the oldest go.
        self._unwritten: list[dict[str, str]] = []
        self.lost = 0  # events dropped because Redis stayed away too long
        self._outage = Outage(log, "redis (ledger)")
        # A worker flushes from its flusher thread and, before it answers
        # jobs, from its main thread: one flush at a time (appends need none).
        self._flushing = threading.Lock()

    def published(self, topic: str, message_id: str, copies: Sequence[tuple[str, str]],
                  width: int | None = None) -> None:
        """``message_id`` of ``topic`` was meant for ``width`` subscribers (the
        look-up's answer) and went to ``copies`` (queue, unique) that gearmand
        accepted; the reconciliation checks the one against the other."""
        if self.enabled:
            ts = now_ms()
            self._published.append(published_line(
                ts, message_id, topic, len(copies) if width is None else width, copies))
            if not self.held:
                for queue, _ in copies:
                    self.counts.enqueued(queue, bucket_of(ts))

    def failed(self, reason: str, topic: str = "", subscriber: str = "", unique: str = "",
               message_id: str = "") -> None:
        self._add({"e": Event.FAILED.value, "ts": str(now_ms()), "reason": reason[:500],
                   "topic": topic, "sub": subscriber, "u": unique, "mid": message_id})

    def dropped(self, reason: str, topic: str, queue: str, unique: str,
                message_id: str = "") -> None:
        """A copy the queue's limits did not keep (``message_id``: only for
        one never made, ``full``; the reconciliation counts it in the width)."""
        if self.enabled and not message_id:  # one never made was never counted made
            self.counts.settled(queue, None, now_ms())
        self._add({"e": Event.DROPPED.value, "ts": str(now_ms()), "reason": reason,
                   "topic": topic, "sub": queue, "u": unique, "mid": message_id})

    def record(self, event: str, subscriber: str, unique: str = "",
               redelivered: bool = False, reason: str = "",
               generation: int | None = None, handle: str = "") -> None:
        """A bridge event (attached, delivered, acked) or a held copy's
        answer (answered, ``reason`` its status, ``generation`` the one it
        was handed in, ``handle`` gearmand's of the job). These are many
        (two per message and subscriber), so they travel as lines of one
        ``batch`` entry per flush instead of an entry each."""
        if self.enabled:
            ts = now_ms()
            if event == Event.STREAMED:
                self.counts.streamed(subscriber, unique, ts)
            elif event == Event.DELIVERED and not (self.held or redelivered):
                self.counts.settled(subscriber, None, ts)
            line = f"{event}\t{ts}\t{subscriber}\t{unique}\t{'1' if redelivered else ''}"
            if generation is not None:
                line = f"{line}\t{reason}\t{generation}\t{handle}"
            elif reason:
                line = f"{line}\t{reason}"
            self._lines.append(line)

    def _add(self, fields: dict[str, str]) -> None:
        if self.enabled:
            if self.source:
                fields["src"] = self.source
            self._buffer.append(fields)

    @property
    def buffered(self) -> int:
        return (len(self._buffer) + len(self._lines) + len(self._published)
                + len(self._unwritten) + len(self.counts))

    def flush(self, everything: bool = False) -> None:
        """Write what is buffered in one round trip, all or nothing (one
        stream, so one MULTI even on a cluster). On a Redis error the
        entries wait for the next flush; it is logged, never raised. The
        audit's counts go once a second, or now with ``everything``."""
        with self._flushing:
            self._flush(everything)

    def _flush(self, everything: bool = False) -> None:
        published, events, lines = (_take(self._published), _take(self._buffer),
                                     _take(self._lines))
        if published:  # first: a fanout's failed entries follow its message
            events.insert(0, batch_entry(PUBLISHED_BATCH, published, self.source))
        if lines:
            events.append(batch_entry(BATCH, lines, self.source))
        if self.enabled and (everything or time.monotonic() >= self._counts_due):
            self._counts_due = time.monotonic() + auditcounts.COUNTS_EVERY
            if counted := self.counts.take():
                events.append(auditcounts.entry(counted, self.source))
        events, self._unwritten = self._unwritten + events, []
        if not events:
            return
        pipe = self.redis.pipeline(transaction=True)
        for fields in events:
            if fields.get("e") == auditcounts.COUNTS:
                pipe.xadd(self.counts_stream, fields, maxlen=self.counts_maxlen,
                          approximate=True)
            else:
                pipe.xadd(self.stream, fields, maxlen=self.maxlen, approximate=True)
        try:
            pipe.execute()
        except REDIS_ERRORS as exc:
            self._unwritten, lost = newest(events, MAX_UNWRITTEN)
            self.lost += lost
            self._outage.failed(exc, f"; {len(self._unwritten)} ledger entries wait")
        else:
            if self._outage.down:
                self._outage.succeeded(f"; ledger written, {self.lost} events lost since start")


def _take(queue: deque) -> list:
    """What ``queue`` holds now; what others append meanwhile stays."""
    return [queue.popleft() for _ in range(len(queue))]


class Flusher(StoppableThread):
    """Flushes buffers (the ledger, the metrics' counters) ``interval``
    seconds after :meth:`poke` says something was buffered, at the latest
    every ``idle`` seconds, and once more when stopped (worker processes).

    Waiting for a poke, not polling every ``interval``, lets an idle worker
    sleep: polling woke each worker process ten times a second to find
    nothing to write, on cores the bridge and its clients share. ``idle``
    bounds how late something buffered without a poke is written.
    """

    def __init__(self, *buffers, interval: float = 0.1, idle: float = 2.0) -> None:
        super().__init__("gearhorn-flusher")
        self.buffers = buffers
        self.interval = interval
        self.idle = idle
        self.poked = threading.Event()

    def poke(self) -> None:
        """Something was buffered: flush within ``interval``."""
        if not self.poked.is_set():  # a read, not the Event's lock, when set already
            self.poked.set()

    def run(self) -> None:
        while not self.stopping.is_set():
            self.poked.wait(self.idle)
            if self.stopping.wait(self.interval):  # what comes meanwhile joins this flush
                break
            self.poked.clear()  # before the flush: a poke during it is not lost
            self._flush()
        self._flush(everything=True)  # what the last jobs before the stop buffered

    def _flush(self, everything: bool = False) -> None:
        for buffer in self.buffers:
            if everything and isinstance(buffer, Ledger):
                buffer.flush(everything=True)
            else:
                buffer.flush()

    def stop(self, timeout: float | None = 5.0) -> None:
        self.stopping.set()
        self.poked.set()
        super().stop(timeout)  # waits for the last flush
