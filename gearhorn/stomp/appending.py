"""A STOMP SEND to a topic with history, appended by the bridge itself
before its fanout job (runs under gevent).

The topic's stream subscribers then have the message one Redis round trip
after the SEND, not after gearmand and a worker (docs/design.rst); its
live subscribers on this bridge (plain SUBSCRIBEs) have it before the
append, with no round trip at all (gearhorn/stomp/streams.py). The
subscriber look-up rides the same round trip, as in the workers (the
cache's version token makes it exact): when every subscriber of the topic
reads its history, the SEND needs no fanout job at all, and the bridge
records the message in the ledger and the metrics itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gearhorn.messages import DEDUP_HEADER
from gearhorn.naming import new_message_id
from gearhorn.observers import Observer
from gearhorn.stomp.sending import SendOptions, TopicSend
from gearhorn.store.history import Entry, History, appended_at
from gearhorn.worker.cache import SubscriberCache


class Readers(Protocol):
    """The bridge's readers of topic histories (gearhorn/stomp/topicstreams.py)."""

    def sending(self, topic: str, messages: list[Entry]) -> None: ...

    def appended(self, topic: str, where: tuple[str, int, int],
                 messages: list[Entry]) -> None:
        """``where``: (epoch, first offset, last offset) of ``messages``."""

    def not_appended(self, topic: str, messages: list[Entry]) -> None: ...

    def worker_appended(self, topic: str) -> None: ...


class HistoryFirst:
    """Appends topic SENDs to their history; ``readers`` hear of each (the
    bridge's stream readers), ``observer`` of each that needs no job."""

    def __init__(self, history: History, cache: SubscriberCache | None = None,
                 readers: Readers | None = None, observer: Observer | None = None) -> None:
        self.history = history
        self.cache = cache
        self.readers = readers
        self.observer = observer or Observer()

    def takes(self, topic: str, options: SendOptions) -> bool:
        """Whether the bridge appends this SEND: not a delayed or
        deduplicated one (those are the worker's to decide on)."""
        return (self.history.policy.keeps(topic) and options.delay is None
                and DEDUP_HEADER not in options.headers)

    def append(self, topic: str, bodies: Sequence[bytes], options: SendOptions) -> TopicSend:
        """Append ``bodies`` under new message ids; the SEND, ready for its job."""
        ids = [new_message_id() for _ in bodies]
        messages = [(message_id, body, options.headers or None)
                    for message_id, body in zip(ids, bodies, strict=True)]
        needs_job = True
        if self.readers is not None:
            self.readers.sending(topic, messages)
        try:
            if self.cache is None:
                (where,) = self.history.append([(topic, messages)])
            else:
                recipients, replies = self.cache.recipients_with(
                    [topic], self.history.calls([(topic, messages)]))
                where, needs_job = appended_at(replies[0]), bool(recipients[topic])
        except BaseException:
            if self.readers is not None:
                self.readers.not_appended(topic, messages)
            raise
        if self.readers is not None:
            self.readers.appended(topic, where, messages)
        if not needs_job:  # what the worker would have recorded: no copies
            self.observer.fanned_out(topic, [(message_id, ()) for message_id in ids], 0)
        return TopicSend(topic, list(bodies), options, ids, needs_job)

    def appended_by_worker(self, topic: str) -> None:
        """A SEND to ``topic`` it did not take was appended by its fanout job."""
        if self.readers is not None and self.history.policy.keeps(topic):
            self.readers.worker_appended(topic)
