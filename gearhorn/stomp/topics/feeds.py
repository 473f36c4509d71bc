"""A bridge's topic feeds, one per topic read here (runs under gevent): one
blocking XREAD of its history per topic and bridge, handing each new
message to the stream readers live on it (gearhorn/stomp/topics/streams.py),
and the SENDs of this bridge its live readers may take before their append
(gearhorn/stomp/topics/appending.py). :class:`TopicFeeds` says where a
SUBSCRIBE starts reading a topic's history.

Why it is shaped so: docs/design/notes.rst, "gearhorn/stomp/topics/feeds.py".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Protocol

import gevent
import gevent.event

from gearhorn.runtime.background import Fault
from gearhorn.stomp.topics.startoffsets import Kept
from gearhorn.stomp.topics.streamruns import StreamRuns
from gearhorn.stomp.topics.streams import (
    BLOCK_MS,
    IN_FLIGHT_SECONDS,
    PAGE,
    RedisCalls,
    StreamConsumer,
    StreamReader,
)
from gearhorn.store.history import Entry, History, Stored
from gearhorn.store.observers import Observer

log = logging.getLogger(__name__)


class OwnWriter(Protocol):
    """This bridge's pen of a topic (gearhorn/stomp/topics/offsetlease.py)."""

    epoch: str
    last: int  # the last offset it gave or wrote
    released: gevent.event.Event  # set once other callers may append again

    def writes_alone(self) -> bool:
        """Whether no other caller can append to the topic now."""


class TopicFeed:
    """One blocking read of a topic's history per bridge, handing each new
    message to the readers live on it."""

    def __init__(self, history: History, topic: str, on_idle: Callable[[TopicFeed], None],
                 epoch: str | None = None, last: int | None = None,
                 own_pens: Mapping[str, OwnWriter] | None = None) -> None:
        """``epoch`` and ``last``: where the topic's history stood when the
        first reader read it (one read), so that reader joins at once and a
        burst sent right after its RECEIPT reaches it from here, not from a
        history that may have trimmed it meanwhile."""
        self.history = history
        self.topic = topic
        self.live: list[StreamReader] = []
        self.readers = 0  # live or catching up
        self.last: int | None = last  # the last offset read; None until known
        self.epoch: str | None = epoch if last is not None else None
        # SENDs of this bridge its live readers may have taken early, not
        # yet passed here (message id -> when sent), in the order sent.
        self.in_flight: dict[str, float] = {}
        self.hold_until = 0  # no SEND is taken early before this offset is passed
        self._on_idle = on_idle
        self._own_pens = own_pens if own_pens is not None else {}
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
            if (pen := self._own_pen()) is not None:
                pen.released.wait(BLOCK_MS / 1000)
                self._forget_stale()
                continue
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

    def _own_pen(self) -> OwnWriter | None:
        """This bridge's pen of the topic, when it alone writes the topic and
        the feed has passed all it gave: nothing to read meanwhile."""
        pen = self._own_pens.get(self.topic)
        if (pen is not None and pen.writes_alone() and pen.epoch == self.epoch
                and pen.last == self.last):
            return pen
        return None

    def _read(self) -> list[Stored]:
        """What follows the feed's last offset (waiting up to BLOCK_MS)."""
        if self.last is None:
            self.epoch, _, self.last = self.history.position(self.topic)
        found = self.history.wait(self.topic, self.last, BLOCK_MS, PAGE)
        if found and self.epoch is not None and self.history.epoch(self.topic) != self.epoch:
            # A new epoch's offsets start again at 1: what XREAD found past
            # the old epoch's last is the new one's, read from 1 instead. An
            # epoch is never taken twice, so the same epoch after the read
            # says what was read is this epoch's.
            found = []
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


class TopicFeeds:
    """The bridge's feeds, one per topic read here."""

    def __init__(self, history: History, observer: Observer | None = None) -> None:
        self.history = history
        self.observer = observer  # told the runs of offsets each reader gave
        self.feeds: dict[str, TopicFeed] = {}
        # The pens this bridge holds, by topic (HistoryFirst's): a feed whose
        # topic only this bridge writes meanwhile does not read it.
        self.own_pens: Mapping[str, OwnWriter] = {}

    def keeps_history(self, topic: str) -> bool:
        """Whether a subscription may read ``topic``'s history (a real-time
        topic's is kept while it is read: gearhorn/rules/historypolicy.py)."""
        return self.history.policy.readable(topic)

    def always_kept(self, topic: str) -> bool:
        """Whether ``topic`` keeps its history read or not (configured)."""
        return self.history.policy.keeps(topic)

    def linger(self, topic: str) -> int:
        return self.history.linger(topic)

    def kept(self, topic: str) -> Kept:
        return Kept(*self.history.position(topic))

    def offset_at(self, topic: str, at: float) -> int:
        return self.history.offset_at(topic, at)

    def read_stream(self, topic: str, consumer: StreamConsumer, after: int,
                    epoch: str | None, recovered: bool, live: bool = False,
                    last: int | None = None) -> StreamReader:
        """``last``: the topic's last offset, read with ``epoch``."""
        feed = self.feeds.get(topic)
        if feed is None:
            feed = self.feeds[topic] = TopicFeed(self.history, topic, self._idle, epoch, last,
                                                       self.own_pens)
        feed.added()
        spans = None
        if self.observer is not None:
            observer, queue = self.observer, consumer.function
            spans = StreamRuns(lambda span: observer.streamed(queue, span))
        reader = StreamReader(feed, consumer, after, epoch, recovered, spans, live)
        if not feed.join(reader):  # behind the feed (a resume): from history first
            reader.start()
        return reader

    def sending(self, topic: str, messages: list[Entry]) -> bool:
        """A SEND on this bridge is about to append ``messages`` to ``topic``;
        whether live readers here took some of them early."""
        feed = self.feeds.get(topic)
        return feed is not None and feed.sending(messages)

    def not_appended(self, topic: str, messages: list[Entry]) -> None:
        """... and did not (the SEND failed)."""
        feed = self.feeds.get(topic)
        if feed is not None:
            feed.forget([message_id for message_id, _, _ in messages])

    def at(self, topic: str) -> tuple[str | None, int | None] | None:
        """(epoch, last offset) of ``topic``'s feed here, unless it has none
        or must first pass a SEND a worker appended (``hold_until``)."""
        feed = self.feeds.get(topic)
        if feed is None or feed.stopped or (feed.last or 0) < feed.hold_until:
            return None
        return feed.epoch, feed.last

    def worker_appended(self, topic: str) -> None:
        """A SEND on this bridge was appended by a worker (its fanout job
        answered): the bridge's later SENDs wait for the feed to pass it
        before they are taken early, so they cannot overtake it."""
        feed = self.feeds.get(topic)
        if feed is not None:
            feed.hold_until = max(feed.hold_until, self.history.position(topic)[2])

    def appended(self, topic: str, where: tuple[str, int, int], messages: list[Entry]) -> None:
        """A SEND on this bridge appended ``messages`` to ``topic``'s history
        at ``where`` (epoch, first offset, last): its live readers here get
        them now, not after the feed's XREAD wakes, when they come right
        after what the feed has (else the feed reads them in order)."""
        feed = self.feeds.get(topic)
        epoch, first, last = where
        if feed is None or last == 0 or feed.epoch != epoch or feed.last != first - 1:
            return
        for offset, (message_id, body, headers) in enumerate(messages, first):
            feed.hand_over((offset, message_id, body, headers or {}))

    def _idle(self, feed: TopicFeed) -> None:
        if self.feeds.get(feed.topic) is feed:
            del self.feeds[feed.topic]
