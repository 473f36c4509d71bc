"""Stream subscriptions (runs under gevent): a ``/topic/`` SUBSCRIBE with
``x-stream-offset`` reads the topic's history (gearhorn/store/history.py)
instead of a gearmand queue of its own.

Each subscription has a :class:`StreamReader`, its position in the
topic's history. It starts by reading history from its start a page at a
time (catching up), then joins the topic's :class:`TopicFeed`, the one
blocking XREAD per topic and bridge that hands each new message to every
reader live on it. The seam is exact: a reader joins only once its
position has reached the feed's, and takes no offset at or below its own,
so it gets every message once, in order. A reader whose client cannot
take more (no credit) leaves the feed and catches up again later from
history: a slow client never holds the others back, and what it missed
while history still had it, it gets; what history trimmed first, it is
told of (``x-recovered:false``).

At most once across a disconnect, as RabbitMQ's non-durable topic
subscriptions; resuming from the last offset seen covers the gap.

A plain SUBSCRIBE (no ``x-stream-offset``) is a *live* reader: the SENDs
of this bridge's own producers reach it before they are appended
(:meth:`TopicFeed.sending`), one Redis round trip sooner, so its MESSAGEs
carry no offset. It still follows the feed, which gives it everything
else in order and skips, by message id, what it got early. A producer's
order holds because a live reader takes a SEND early only when it owes
none of the earlier ones sent here (``owed``: they reach it through the
feed first).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Protocol, TypeVar

import gevent
import gevent.event

from gearhorn.background import Backoff, Fault, Outage
from gearhorn.stomp.spans import Spans
from gearhorn.store.history import Entry, History, Stored
from gearhorn.store.redisconn import REDIS_ERRORS

log = logging.getLogger(__name__)

PAGE = 500  # messages read from history at a time
BLOCK_MS = 1000  # a feed's XREAD waits this long, then checks the topic's epoch
# A SEND taken early whose append the feed has not seen after this long
# was lost with its history (Redis wiped): its readers stop waiting for it.
IN_FLIGHT_SECONDS = 60.0
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

    def __init__(self, feed: TopicFeed, consumer: StreamConsumer, after: int,
                 epoch: str | None, recovered: bool, spans: Spans | None = None,
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
        self._wake = gevent.event.Event()
        self._catching_up: gevent.Greenlet | None = None

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
            if hold or self.owed or self.closed or self.consumer.credit() <= 0:
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
        if self.early and stored[1] in self.early:
            self._take(stored)
            if self.closed and not self.early:
                self._end()
            return
        if self.closed:
            return
        if self.consumer.credit() <= 0:
            self.feed.leave(self)  # it catches up from history when it can take more
            self._catch_up_later()
            return
        self._take(stored)

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


class TopicFeed:
    """One blocking read of a topic's history per bridge, handing each new
    message to the readers live on it."""

    def __init__(self, history: History, topic: str, on_idle: Callable[[TopicFeed], None]
                 ) -> None:
        self.history = history
        self.topic = topic
        self.live: list[StreamReader] = []
        self.readers = 0  # live or catching up
        self.last: int | None = None  # the last offset read; None until known
        self.epoch: str | None = None
        # SENDs of this bridge its live readers may have taken early, not
        # yet passed here (message id -> when sent), in the order sent.
        self.in_flight: dict[str, float] = {}
        self.hold_until = 0  # no SEND is taken early before this offset is passed
        self._on_idle = on_idle
        self.stopped = False
        gevent.spawn(self._run)

    def added(self) -> None:
        self.readers += 1

    def join(self, reader: StreamReader) -> bool:
        """Make ``reader`` live if it has caught up with the feed."""
        if reader.closed or self.last is None or reader.position < self.last:
            return False
        if reader.epoch != self.epoch:
            if self.epoch is None:
                return False
            reader.epoch_changed(self.epoch)
            return False
        if reader not in self.live:
            reader.joined(self.in_flight)
            self.live.append(reader)
        return True

    def sending(self, messages: list[Entry]) -> bool:
        """SENDs of this bridge about to be appended: to its live readers
        now; whether any took some."""
        now = time.monotonic()
        for message_id, _, _ in messages:
            self.in_flight[message_id] = now
        hold = self.last is None or self.last < self.hold_until
        took = False
        for reader in list(self.live):
            if reader.early is not None:
                try:
                    took = reader.take_early(messages, hold) or took
                except Exception:  # noqa: BLE001 - one subscription's fault, not the topic's
                    reader.failed()
        return took

    def forget(self, message_ids: list[str]) -> None:
        """SENDs taken early that will not be passed here (never appended)."""
        for message_id in message_ids:
            self.in_flight.pop(message_id, None)
        for reader in list(self.live):
            reader.forget(message_ids)

    def leave(self, reader: StreamReader) -> None:
        if reader in self.live:
            self.live.remove(reader)
        if reader.closed:
            self.readers -= 1
            if self.readers <= 0:
                # Not killed: a greenlet killed inside a Redis call would
                # hand its connection back with the reply still unread.
                self.stopped = True
                self._on_idle(self)

    def _run(self) -> None:
        redis_calls = RedisCalls(f"feed of {self.topic}")
        fault = Fault(log, f"feed of {self.topic}")
        while not self.stopped:
            try:
                found = redis_calls.attempt(self._read)
                fault.succeeded()
            except Exception as exc:  # noqa: BLE001 - not a Redis error: log it, go on
                fault.failed(exc)
                gevent.sleep(redis_calls.backoff.failed())
                continue
            for stored in found or ():
                if stored[0] > self.last:  # not handed over already (appended)
                    self.hand_over(stored)

    def _read(self) -> list[Stored]:
        """What follows the feed's last offset (waiting up to BLOCK_MS)."""
        if self.last is None:
            self.epoch, _, self.last = self.history.position(self.topic)
        found = self.history.wait(self.topic, self.last, BLOCK_MS, PAGE)
        if not found or self.epoch is None:
            self._check_epoch()
        self._forget_stale()
        return found

    def _forget_stale(self) -> None:
        stale = time.monotonic() - IN_FLIGHT_SECONDS
        gone = []
        for message_id, sent in self.in_flight.items():  # oldest first
            if sent > stale:
                break
            gone.append(message_id)
        if gone:
            self.forget(gone)

    def hand_over(self, stored: Stored) -> None:
        self.last = stored[0]
        if self.in_flight:
            self.in_flight.pop(stored[1], None)
        for reader in list(self.live):
            try:
                reader.offer(stored)
            except Exception:  # noqa: BLE001 - one subscription's fault, not the topic's
                reader.failed()

    def _check_epoch(self) -> None:
        epoch, _, last = self.history.position(self.topic)
        if epoch is not None and epoch != self.epoch:
            lost = self.epoch is not None
            self.epoch, self.last = epoch, 0 if lost else self.last
            for reader in list(self.live):
                reader.epoch_changed(epoch)
            log.info("topic %s: history epoch %s", self.topic, epoch)
