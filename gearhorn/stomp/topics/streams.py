"""Stream subscriptions (runs under gevent): a ``/topic/`` SUBSCRIBE with
``x-stream-offset`` reads the topic's history (gearhorn/store/history.py)
instead of a gearmand queue of its own.

Why it is shaped so: docs/design/notes.rst, "gearhorn/stomp/topics/streams.py".
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Iterable
from functools import partial
from typing import Protocol, TypeVar

import gevent
import gevent.event

from gearhorn.runtime.background import Backoff, Outage
from gearhorn.stomp.topics.streamruns import StreamRuns
from gearhorn.store.history import Entry, History, Stored
from gearhorn.store.redisconn import REDIS_ERRORS

log = logging.getLogger(__name__)

PAGE = 500  # messages read from history at a time
BLOCK_MS = 1000  # a feed's XREAD waits this long, then checks the topic's epoch
# A SEND taken early whose append the feed has not seen after this long
# was lost with its history (Redis wiped): its readers stop waiting for it.
IN_FLIGHT_SECONDS = 60.0
# A reader that cannot take more (no credit: its client reads slower than
# messages come) stays on the feed, the messages it is behind by held here
# (shared with the other readers: references), up to these bounds (a
# subscriber queue's defaults, queue_max_length and queue_max_bytes); then
# it leaves the feed and catches up from history, told what was trimmed.
LAG_MESSAGES = 10_000
LAG_BYTES = 16 * 1024 * 1024
T = TypeVar("T")


class RedisCalls:
    """A loop's Redis calls: an outage logged once, and a growing pause
    between failed attempts."""

    def __init__(self, what: str) -> None:
        self.outage = Outage(log, f"redis ({what})")
        self.backoff = Backoff()

    def attempt(self, call: Callable[[], T]) -> T | None:
        """``call()``'s result; None (after the pause) if Redis failed it."""
        try:
            result = call()
        except REDIS_ERRORS as exc:
            self.outage.failed(exc)
            gevent.sleep(self.backoff.failed())
            return None
        self.outage.succeeded()
        self.backoff.succeeded()
        return result


class Feed(Protocol):
    """What a reader needs of its topic's feed (gearhorn/stomp/topics/feeds.py)."""

    topic: str
    history: History
    live: list[StreamReader]

    def join(self, reader: StreamReader) -> bool: ...

    def leave(self, reader: StreamReader) -> None: ...


class StreamConsumer(Protocol):
    """What a reader needs from its STOMP subscription."""

    function: str  # <topic>_<client_id>, as the ledger names it

    def credit(self) -> int: ...

    def deliver(self, delivery: StreamDelivery) -> None: ...

    def failed(self, reason: str) -> None:
        """Its messages can no longer be delivered: end the subscription, and say so."""


class StreamDelivery:
    """One message of a topic's history on its way to a subscriber; plays
    the part of a queue's Delivery for the session (acks free credit only:
    nothing is given back, the history keeps it)."""

    __slots__ = ("reader", "body", "headers", "extra", "unique", "message_id", "redelivered",
                 "deliveries", "timer", "done")

    def __init__(self, reader: StreamReader, body: bytes, headers: dict[str, str],
                 unique: str, extra: bytes) -> None:
        self.reader = reader
        self.body = body
        self.headers = headers  # the sender's, with ``extra`` in them when there are any
        self.extra = extra  # x-stream-offset and the rest, as header lines
        self.unique = unique  # the message's id, as the ledger knows it
        self.message_id = ""  # set by the session at each delivery
        self.redelivered = False
        self.deliveries = 1
        self.timer = None
        self.done = False

    def ack(self) -> None:
        self.reader.settled()

    def nack(self) -> None:
        self.reader.settled()


class StreamReader:
    """One subscription's position in its topic's history."""

    def __init__(self, feed: Feed, consumer: StreamConsumer, after: int,
                 epoch: str | None, recovered: bool, spans: StreamRuns | None = None,
                 live: bool = False) -> None:
        self.feed = feed
        self.consumer = consumer
        self.spans = spans  # what it was given, for the ledger
        self.position = after  # the last offset it was given (or passed, taken early)
        self.epoch = epoch
        self.unrecovered = not recovered  # said on the next MESSAGE
        self.closed = False
        # A live reader's: the ids of SENDs it took early, not yet passed on
        # the feed; and those sent here that it must get from the feed first.
        self.early: set[str] | None = set() if live else None
        self.owed: set[str] = set()
        self.lagging: collections.deque[Stored] = collections.deque()  # behind, on the feed
        self._lag_bytes = 0
        self._wake = gevent.event.Event()
        self._catching_up: gevent.Greenlet | None = None
        self._draining: gevent.Greenlet | None = None

    @property
    def consumers(self) -> list[StreamConsumer]:
        return [] if self.closed else [self.consumer]

    def start(self) -> None:
        self._catch_up_later()

    # -- what the session calls, as on a queue's dispatcher ------------------------

    def remove(self, consumer: object, unacked: list, give_back: bool = True) -> None:
        self.close()

    def give_back(self, deliveries: list) -> None:
        self.settled()  # a NACK: history keeps the message; no redelivery

    def reject(self, deliveries: list) -> None:
        self.settled()

    def settled(self) -> None:
        self._wake.set()

    def failed(self) -> None:
        """Delivering to it raised: it ends, and its client is told (rather
        than the topic's feed dying and every reader on it going silent)."""
        log.exception("topic %s: delivery to %s failed", self.feed.topic,
                      self.consumer.function)
        self.close()
        self.consumer.failed("internal error while delivering this subscription's "
                             "messages (logged by the bridge)")

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._drop_lag()
        self._wake.set()
        if not (self.early and self in self.feed.live):
            self._end()
        # else it stays on the feed until what it took early is passed
        # there, so the ledger has those offsets too (offer ends it).

    def _end(self) -> None:
        self.feed.leave(self)
        if self.spans is not None:
            self.spans.end()

    # -- a live reader's early SENDs --------------------------------------------

    def take_early(self, messages: list[Entry], hold: bool) -> bool:
        """SENDs of this bridge on their way to the history: delivered now
        unless it owes earlier ones (or cannot take them, or ``hold``: the
        feed has yet to pass a SEND appended by a worker). Whether it took any."""
        assert self.early is not None
        took = False
        for message_id, body, headers in messages:
            if (hold or self.owed or self.lagging or self.closed
                    or self.consumer.credit() <= 0):
                self.owed.add(message_id)
                continue
            self.early.add(message_id)
            self._send(message_id, body, headers or {}, b"")
            took = True
        return took

    def forget(self, message_ids: Iterable[str]) -> None:
        """SENDs that will never be passed on the feed (their append failed)."""
        if self.early is not None:
            self.early.difference_update(message_ids)
            self.owed.difference_update(message_ids)
            if self.closed and not self.early:
                self._end()

    def joined(self, in_flight: Iterable[str]) -> None:
        """On the feed again: owes what was sent here and not yet passed."""
        if self.early is not None:
            self.early.intersection_update(in_flight)
            self.owed = set(in_flight) - self.early

    # -- reading ---------------------------------------------------------------

    def offer(self, stored: Stored) -> None:
        """A new message from the feed, to a reader live on it."""
        if stored[0] <= self.position:  # read while catching up, ahead of the feed
            self.owed.discard(stored[1])
            return
        if self.lagging and not self.closed:  # behind: in order, after those
            self._lag(stored)
            return
        if self.early and stored[1] in self.early:
            self._take(stored)
            if self.closed and not self.early:
                self._end()
            return
        if self.closed:
            return
        if self.consumer.credit() <= 0:
            self._lag(stored)
            return
        self._take(stored)

    def _lag(self, stored: Stored) -> None:
        """``stored`` waits here for credit; too far behind, the reader leaves
        the feed and catches up from history when it can take more."""
        if len(self.lagging) >= LAG_MESSAGES or self._lag_bytes >= LAG_BYTES:
            self._drop_lag()
            self.feed.leave(self)
            self._catch_up_later()
            return
        self.lagging.append(stored)
        self._lag_bytes += len(stored[2])
        if self._draining is None:
            self._draining = gevent.spawn(self._drain)

    def _drop_lag(self) -> None:
        self.lagging.clear()
        self._lag_bytes = 0

    def _drain(self) -> None:
        """Hand what it is behind by to the reader as credit comes back."""
        try:
            while self.lagging and not self.closed:
                if self.consumer.credit() <= 0:
                    self._wake.clear()
                    self._wake.wait(5)
                    continue
                stored = self.lagging.popleft()
                self._lag_bytes -= len(stored[2])
                self._take(stored)
        except Exception:  # noqa: BLE001 - this reader's fault, told to its client
            self.failed()
        finally:
            self._draining = None

    def epoch_changed(self, epoch: str) -> None:
        """The topic's history was lost (Redis wiped, or expired): offsets
        start again from 1 in a new epoch, and the client is told."""
        if self.epoch is not None:
            self.unrecovered = True
        self.epoch, self.position = epoch, 0

    def _catch_up_later(self) -> None:
        if self._catching_up is None and not self.closed:
            self._catching_up = gevent.spawn(self._catch_up)

    def _catch_up(self) -> None:
        redis_calls = RedisCalls(f"history of {self.feed.topic}")
        try:
            while not self.closed:
                credit = self.consumer.credit()
                if credit <= 0:
                    self._wake.clear()
                    self._wake.wait(5)
                    continue
                page = redis_calls.attempt(partial(self.feed.history.entries, self.feed.topic,
                                                   self.position, min(credit, PAGE)))
                if page is None:
                    continue
                epoch, found = page
                if epoch is not None and epoch != self.epoch:
                    lost = self.epoch is not None  # else: the topic's first messages
                    self.epoch_changed(epoch)
                    if lost:
                        continue  # read again, from the new epoch's start
                try:
                    for stored in found:
                        if not self.closed:
                            self._take(stored)
                except Exception:  # noqa: BLE001 - this reader's fault, told to its client
                    self.failed()
                    return
                if not found:
                    if self.feed.join(self):
                        return
                    gevent.sleep(0.05)  # the feed is not there yet
        finally:
            self._catching_up = None

    def _take(self, stored: Stored) -> None:
        """``stored``, next in the history, to this reader: delivered, or
        passed when it was taken early."""
        offset, message_id = stored[0], stored[1]
        if offset > self.position + 1:
            self.unrecovered = True  # trimmed before it could read them
        self.position = offset
        if self.spans is not None:
            self.spans.given(self.epoch or "", offset, self.unrecovered)
        if self.early is not None:
            self.owed.discard(message_id)
            if message_id in self.early:
                self.early.discard(message_id)
                return
            self._send(message_id, stored[2], stored[3], b"")
            return
        self._send(message_id, stored[2], stored[3],
                   b"x-stream-offset:%d\nx-stream-epoch:%s\n" % (offset,
                                                                (self.epoch or "").encode()))

    def _send(self, message_id: str, body: bytes, headers: dict[str, str],
              extra: bytes) -> None:
        if self.unrecovered:
            extra += b"x-recovered:false\n"
            self.unrecovered = False
        if headers and extra:  # the sender's: the MESSAGE is encoded header by header
            headers = {**headers, **dict(line.decode().split(":", 1)
                                         for line in extra.splitlines())}
        self.consumer.deliver(StreamDelivery(self, body, headers, message_id, extra))
