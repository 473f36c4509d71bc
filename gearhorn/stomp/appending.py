"""A STOMP SEND to a topic with history, appended by the bridge itself
before its fanout job (runs under gevent).

The topic's stream subscribers then have the message one Redis round trip
after the SEND, not after gearmand and a worker (docs/design.rst). The
subscriber look-up rides the same round trip, as in the workers (the
cache's version token makes it exact): when every subscriber of the topic
reads its history, the SEND needs no fanout job at all, and the bridge
records the message in the ledger and the metrics itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gearhorn.messages import DEDUP_HEADER
from gearhorn.naming import new_message_id
from gearhorn.observers import Observer
from gearhorn.stomp.sending import SendOptions, TopicSend
from gearhorn.store.history import Entry, History, appended_at
from gearhorn.worker.cache import SubscriberCache

# (topic, (epoch, first offset, last offset), messages): what a SEND appended.
Appended = Callable[[str, tuple[str, int, int], list[Entry]], None]


class HistoryFirst:
    """Appends topic SENDs to their history; ``appended`` hears of each (the
    bridge's stream readers), ``observer`` of each that needs no job."""

    def __init__(self, history: History, cache: SubscriberCache | None = None,
                 appended: Appended | None = None, observer: Observer | None = None) -> None:
        self.history = history
        self.cache = cache
        self.appended = appended
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
        if self.cache is None:
            (where,) = self.history.append([(topic, messages)])
        else:
            recipients, replies = self.cache.recipients_with(
                [topic], self.history.calls([(topic, messages)]))
            where, needs_job = appended_at(replies[0]), bool(recipients[topic])
        if self.appended is not None:
            self.appended(topic, where, messages)
        if not needs_job:  # what the worker would have recorded: no copies
            self.observer.fanned_out(topic, [(message_id, ()) for message_id in ids], 0)
        return TopicSend(topic, list(bodies), options, ids, needs_job)
