"""What STOMP clients SEND, onto Gearman (runs under gevent): background
jobs on a ``/queue/``, ``fanout`` jobs for a ``/topic/``, and the bridge's
own messages (replies, dead letters)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import gevent.lock

from gearhorn import gearman
from gearhorn.errors import GearhornError
from gearhorn.rules import messages
from gearhorn.rules.naming import new_message_id, queue_copy_unique, stomp_unique
from gearhorn.stomp.protocol.sendheaders import PLAIN, SendOptions, TopicSend
from gearhorn.stomp.queues.bounds import QueueBounds
from gearhorn.stomp.topics.appending import HistoryFirst
from gearhorn.store.delayed import DelayedItem, Scheduler
from gearhorn.store.headers import HeaderStore
from gearhorn.store.holding import HoldingClient


class FanoutFailed(GearhornError):
    """A fanout job the bridge submitted failed or timed out (not the
    client's fault: its request was valid); the message says why."""

class Publisher:
    """Submits what sessions send. With ``holding`` (``copies = held``)
    background jobs are held copies: kept in Redis by this bridge and handed
    to gearmand as foreground jobs it holds open, as the pool's fanout
    copies are (docs/design/index.rst)."""

    def __init__(self, servers: Sequence[tuple[str, int]], tls: gearman.TlsFiles | None,
                 headers: HeaderStore, scheduler: Scheduler, bounds: QueueBounds,
                 fanout_timeout: float,
                 history_first: HistoryFirst | None = None,
                 holding: HoldingClient | None = None) -> None:
        self.servers, self.tls = tuple(servers), tls
        self.holding = holding
        self.headers = headers
        self.scheduler = scheduler
        self.bounds = bounds
        self.fanout_timeout = fanout_timeout
        self.history_first = history_first  # topics with history: appended first
        # The bridge's own jobs share one client, one at a time.
        self._own = self.new_client()
        self._own_lock = gevent.lock.Semaphore()

    def new_client(self) -> gearman.Client:
        """A Gearman client for one connection's jobs (its background jobs
        held copies, with ``holding``)."""
        client = gearman.Client(self.servers, tls=self.tls)
        return client if self.holding is None else self.holding.beside(client)

    def send_to_queue(self, client: gearman.Client, function: str,
                      bodies: Sequence[bytes], options: SendOptions = PLAIN) -> None:
        """Background jobs on ``function``, in order, in one pipelined write;
        returns once gearmand accepted them all (or, delayed, Redis kept them)."""
        self.bounds.admit(function)
        if options.plain:
            copies = [gearman.Copy(function, stomp_unique(new_message_id()), body)
                      for body in bodies]
            client.submit_background(copies)
            self.bounds.sent(copies)
            return
        (body,) = bodies  # a SEND with options is never batched
        message_id = new_message_id()
        unique = stomp_unique(message_id)
        header_ids: tuple[str, ...] = ()
        if options.headers:
            self.headers.put(message_id, options.headers)
            unique, header_ids = queue_copy_unique(message_id), (message_id,)
        if options.delay is not None:
            item = DelayedItem(time.time() + options.delay, (message_id,), (body,),
                               queue=function, unique=unique, priority=options.priority,
                               header_ids=header_ids)
            if self.scheduler.schedule(item):
                return
        copies = [gearman.Copy(function, unique, body)]
        client.submit_background(copies, options.priority)
        self.bounds.sent(copies)

    def publish(self, client: gearman.Client, topic: str, bodies: Sequence[bytes],
                options: SendOptions = PLAIN) -> dict:
        """One ``fanout`` job for ``bodies`` (in order); returns once the copies are queued."""
        send = self.prepare(topic, bodies, options)
        self.append(send)
        result = self.start(client, send).wait()
        if send.message_ids is None and self.history_first is not None:
            self.history_first.appended_by_worker(topic)
        return result

    def prepare(self, topic: str, bodies: Sequence[bytes],
                options: SendOptions = PLAIN) -> TopicSend:
        """A SEND to ``topic``: when the topic keeps a history, given its ids
        and handed to this bridge's live readers, to be appended (:meth:`append`)
        before its fanout job (gearhorn/stomp/topics/appending.py)."""
        if self.history_first is None or not self.history_first.takes(topic, options):
            return TopicSend(topic, list(bodies), options)
        return self.history_first.announce(topic, bodies, options)

    def append(self, send: TopicSend) -> None:
        """A prepared SEND appended to its topic's history, if it is to be."""
        if send.to_append and self.history_first is not None:
            self.history_first.store(send)

    def abandon(self, send: TopicSend) -> None:
        """A prepared SEND that will not be appended: its live readers forget it."""
        if send.to_append and self.history_first is not None:
            self.history_first.abandon(send)

    def start(self, client: gearman.Client, send: TopicSend) -> Pending:
        """Submit ``send``'s fanout job; :meth:`Pending.wait` has its answer.
        Until then ``client`` is for nothing else (the answer comes on it)."""
        copy = gearman.Copy("fanout", gearman.call_unique(), fanout_job(send))
        return Pending(send.topic, client.start_foreground([copy], send.options.priority),
                       self.fanout_timeout)

    def send_own(self, function: str, body: bytes, headers: dict[str, str]) -> str:
        """A background job of the bridge's own, with headers; returns its header id."""
        message_id = new_message_id()
        self.headers.put(message_id, headers)
        with self._own_lock:
            self._own.submit_background(
                [gearman.Copy(function, queue_copy_unique(message_id), body)])
        return message_id


class Pending:
    """A fanout job gearmand accepted, its answer still to come."""

    def __init__(self, topic: str, placed: gearman.Placed, timeout: float) -> None:
        self.topic, self.placed, self.timeout = topic, placed, timeout

    def wait(self) -> dict:
        """The job's result; raises FanoutFailed."""
        outcome = self.placed.wait(self.timeout)[0]
        if not outcome.ok:
            raise FanoutFailed(f"fanout to {self.topic} failed: {outcome.reason}")
        return json.loads(outcome.data)


def fanout_job(send: TopicSend) -> bytes:
    """The ``fanout`` job of SENDs to ``/topic/<topic>`` (messages.fanout_job)."""
    options = send.options
    return messages.fanout_job(send.topic, send.bodies, priority=options.priority,
                               delay=options.delay, headers=options.headers,
                               message_ids=send.message_ids)
