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
from gearhorn.store.history import Entry, History
from gearhorn.store.subscribers import SubscriberCache


class Readers(Protocol):
    """The bridge's readers of topic histories (gearhorn/stomp/topicstreams.py)."""

    def sending(self, topic: str, messages: list[Entry]) -> bool:
        """Whether live readers here took some of ``messages`` early."""

    def appended(self, topic: str, where: tuple[str, int, int],
                 messages: list[Entry]) -> None:
        """``where``: (epoch, first offset, last offset) of ``messages``."""

    def not_appended(self, topic: str, messages: list[Entry]) -> None: ...

    def worker_appended(self, topic: str) -> None: ...


class HistoryFirst:
    """Appends topic SENDs to their history; ``readers`` hear of each (the
    bridge's stream readers), ``observer`` of each that needs no job.

    A SEND is announced first (:meth:`announce`: its ids given, the live
    readers told) and stored after (:meth:`store`), so that the session
    can read on while the connection's outbox appends (gearhorn/stomp/outbox.py)."""

    def __init__(self, history: History, cache: SubscriberCache | None = None,
                 readers: Readers | None = None, observer: Observer | None = None) -> None:
        self.history = history
        self.cache = cache
        self.readers = readers
        self.observer = observer or Observer()

    def takes(self, topic: str, options: SendOptions) -> bool:
        """Whether the bridge appends this SEND: not a delayed or
        deduplicated one (those are the worker's to decide on)."""
        return (self.history.policy.readable(topic) and options.delay is None
                and DEDUP_HEADER not in options.headers)

    def append(self, topic: str, bodies: Sequence[bytes], options: SendOptions) -> TopicSend:
        """Append ``bodies`` under new message ids; the SEND, ready for its job."""
        send = self.announce(topic, bodies, options)
        self.store(send)
        return send

    def announce(self, topic: str, bodies: Sequence[bytes], options: SendOptions) -> TopicSend:
        """``bodies`` under new message ids, handed to the live readers
        here; the SEND, to be stored before its job."""
        send = TopicSend(topic, list(bodies), options, [new_message_id() for _ in bodies],
                         to_append=True)
        if self.readers is not None:
            send.taken_early = bool(self.readers.sending(topic, _entries(send)))
        return send

    def store(self, send: TopicSend) -> None:
        """Append an announced SEND (sets ``needs_job``); raises what Redis raised."""
        topic, messages = send.topic, _entries(send)
        send.to_append = False
        needs_job = True
        try:
            if self.cache is None:
                (where,) = self.history.append([(topic, messages)])
            else:
                plan = self.history.plan([(topic, messages)])
                recipients, replies = self.cache.recipients_with([topic], plan.calls)
                (where,), needs_job = plan.settle(replies), bool(recipients[topic])
        except BaseException:
            if self.readers is not None:
                self.readers.not_appended(topic, messages)
            raise
        if self.readers is not None:
            self.readers.appended(topic, where, messages)
        send.needs_job = needs_job
        if not needs_job:  # what the worker would have recorded: no copies
            self.observer.fanned_out(topic, [(message_id, ()) for message_id, _, _ in messages],
                                     0)

    def abandon(self, send: TopicSend) -> None:
        """An announced SEND that will not be stored (its connection failed first)."""
        if send.to_append:
            send.to_append = False
            if self.readers is not None:
                self.readers.not_appended(send.topic, _entries(send))

    def appended_by_worker(self, topic: str) -> None:
        """A SEND to ``topic`` it did not take was appended by its fanout job."""
        if self.readers is not None and self.history.policy.readable(topic):
            self.readers.worker_appended(topic)


def _entries(send: TopicSend) -> list[Entry]:
    """The history entries of an announced SEND: (id, body, headers)."""
    assert send.message_ids is not None
    headers = send.options.headers or None
    return [(message_id, body, headers)
            for message_id, body in zip(send.message_ids, send.bodies, strict=True)]
