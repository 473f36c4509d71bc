"""A STOMP SEND to a topic with history, appended by the bridge itself
before its fanout job (runs under gevent).

Why it is shaped so: docs/design/notes.rst, "gearhorn/stomp/topics/appending.py".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

import gevent

from gearhorn.rules.messages import DEDUP_HEADER
from gearhorn.rules.naming import new_message_id
from gearhorn.stomp.protocol.sendheaders import SendOptions, TopicSend
from gearhorn.stomp.topics.offsetlease import PEN_MS, OffsetLease
from gearhorn.store.history import NO_PEN, Entry, History, PenArgs, Plan
from gearhorn.store.observers import Observer
from gearhorn.store.subscribers import SubscriberCache


class Readers(Protocol):
    """The bridge's readers of topic histories (gearhorn/stomp/topics/feeds.py)."""

    def sending(self, topic: str, messages: list[Entry]) -> bool:
        """Whether live readers here took some of ``messages`` early."""

    def appended(self, topic: str, where: tuple[str, int, int],
                 messages: list[Entry]) -> None:
        """``where``: (epoch, first offset, last offset) of ``messages``."""

    def not_appended(self, topic: str, messages: list[Entry]) -> None: ...

    def worker_appended(self, topic: str) -> None: ...

    def at(self, topic: str) -> tuple[str | None, int | None] | None:
        """(epoch, last offset) of the topic's feed here, when it has one
        that may be handed a SEND's messages now; else None."""


class HistoryFirst:
    """Appends topic SENDs to their history; ``readers`` hear of each (the
    bridge's stream readers), ``observer`` of each that needs no job.

    A SEND is announced first (:meth:`announce`: its ids given, the live
    readers told) and stored after (:meth:`store`), so that the session
    can read on while the connection's outbox appends (gearhorn/stomp/sessions/outbox.py)."""

    def __init__(self, history: History, cache: SubscriberCache | None = None,
                 readers: Readers | None = None, observer: Observer | None = None,
                 caller: str | None = None) -> None:
        """``caller``: this bridge's id, to hold topics' pens with
        (gearhorn/stomp/topics/offsetlease.py); None: offsets always come from Redis."""
        self.history = history
        self.cache = cache
        self.readers = readers
        self.observer = observer or Observer()
        self.caller = caller
        self.pens: dict[str, OffsetLease] = {}
        # Topic -> SENDs announced here without offsets, not yet appended: no
        # pen gives offsets meanwhile, or a later SEND would overtake them.
        self._unstored: dict[str, int] = {}
        self._resets: set[str] = set()  # topics whose pen broke: a new epoch next

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
        if self.readers is None:
            return send
        pen = self.pens.get(topic)
        if (pen is not None and topic not in self._unstored and pen.can_give()
                and self.readers.at(topic) == (pen.epoch, pen.last)):
            entries = _entries(send)
            where = pen.give(len(entries))
            self.readers.appended(topic, where, entries)  # its readers here have it now
            # Queued after the MESSAGEs: the writer wakes after their writes.
            send.tickets.append(pen.write(entries, where[1]))
            send.taken_early = True  # so its outbox lingers too, reading on meanwhile
            return send
        self._unstored[topic] = self._unstored.get(topic, 0) + len(send.bodies)
        send.taken_early = bool(self.readers.sending(topic, _entries(send)))
        return send

    def _stored(self, topic: str, count: int) -> None:
        """``count`` messages announced without offsets were appended (or never will be)."""
        if self.readers is not None and topic in self._unstored:
            self._unstored[topic] -= count
            if self._unstored[topic] <= 0:
                del self._unstored[topic]

    def store(self, send: TopicSend) -> None:
        """Append an announced SEND (sets ``needs_job``); raises what Redis raised."""
        topic, messages = send.topic, _entries(send)
        send.to_append = False
        if send.tickets:
            needs_job = any([ticket.wait() for ticket in send.tickets])
        else:
            try:
                if (pen := self.pens.get(topic)) is not None:  # it writes every append here
                    needs_job = pen.write(messages).wait()
                else:
                    needs_job = self._store(topic, messages)
            except BaseException:
                self._not_appended(topic, messages)
                raise
            finally:
                self._stored(topic, len(messages))
        send.needs_job = needs_job
        if not needs_job:  # what the worker would have recorded: no copies
            self.observer.fanned_out(topic, [(message_id, ()) for message_id, _, _ in messages],
                                     0)

    def _store(self, topic: str, messages: list[Entry]) -> bool:
        """Appended with an offset from Redis, asking for the topic's pen when
        readers here read it; whether a fanout job is needed."""
        pen = NO_PEN
        if self.caller is not None:
            ask = self.readers is not None and self.readers.at(topic) is not None
            pen = PenArgs(self.caller, -1 if topic in self._resets else 0,
                          PEN_MS if ask else 0)
        granted_at = time.monotonic()
        plan = self.history.plan([(topic, messages)], pen=pen)
        (where,), needs_job = self._look_up(topic, plan)
        self._resets.discard(topic)
        if self.readers is not None:
            self.readers.appended(topic, where, messages)
        epoch, _, last = where
        held = self.pens.get(topic)
        if held is not None and held.epoch == epoch:
            # Given the pen by another append in flight with this one: its
            # offsets start after both (no pen gives while one is unstored).
            held.last = max(held.last, last)
        elif plan.pens.get(topic) == "held" and held is None and epoch:
            self.pens[topic] = OffsetLease(self.history, topic, pen.caller, epoch,
                                        last or self.history.position(topic)[2],
                                        self._look_up_calls(topic), self._appended,
                                        self._pen_ended, granted_at)
        return needs_job

    def _look_up(self, topic: str, plan: Plan) -> tuple[list[tuple[str, int, int]], bool]:
        """Run ``plan`` with the topic's subscriber look-up riding along."""
        needs_job, replies = self._look_up_calls(topic)(plan.calls)
        return plan.settle(replies), needs_job

    def _look_up_calls(self, topic: str) -> Callable[[list], tuple[bool, list]]:
        def look_up(calls: list) -> tuple[bool, list]:
            if self.cache is None:
                return True, self.history.direct.run_scripts(calls) if calls else []
            recipients, replies = self.cache.recipients_with([topic], calls)
            return bool(recipients[topic]), replies
        return look_up

    def _appended(self, topic: str, where: tuple[str, int, int],
                  messages: list[Entry]) -> None:
        if self.readers is not None:
            self.readers.appended(topic, where, messages)

    def _not_appended(self, topic: str, messages: list[Entry]) -> None:
        if self.readers is not None:
            self.readers.not_appended(topic, messages)

    def _pen_ended(self, pen: OffsetLease) -> None:
        if self.pens.get(pen.topic) is pen:
            del self.pens[pen.topic]
        if pen.reset_due:
            self._resets.add(pen.topic)

    def abandon(self, send: TopicSend) -> None:
        """An announced SEND that will not be stored (its connection failed
        first). What a pen gave is written all the same: its readers have it."""
        if send.tickets:
            send.to_append = False
            return
        if send.to_append:
            self._stored(send.topic, len(send.bodies))
            send.to_append = False
            if self.readers is not None:
                self.readers.not_appended(send.topic, _entries(send))

    def give_back_pens(self, timeout: float) -> None:
        """Write what the pens here gave, and give them back (the bridge stops)."""
        pens = list(self.pens.values())
        for pen in pens:
            pen.finish()
        gevent.joinall([pen.greenlet for pen in pens], timeout=timeout)

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
