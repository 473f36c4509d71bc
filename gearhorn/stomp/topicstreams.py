"""The bridge's topic feeds, one per topic read here (runs under gevent):
where a SUBSCRIBE starts reading a topic's history, and what the bridge's
own SENDs tell the feed of their topic (gearhorn/stomp/streams.py; the
SENDs: gearhorn/stomp/appending.py)."""

from __future__ import annotations

from collections.abc import Mapping

from gearhorn.stomp.feed import OwnWriter, TopicFeed
from gearhorn.stomp.offsets import Kept
from gearhorn.stomp.spans import Spans
from gearhorn.stomp.streams import StreamConsumer, StreamReader
from gearhorn.store.history import Entry, History
from gearhorn.store.observers import Observer


class TopicStreams:
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
            spans = Spans(lambda span: observer.streamed(queue, span))
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
