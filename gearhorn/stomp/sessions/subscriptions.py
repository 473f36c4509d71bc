"""A session's subscriptions: SUBSCRIBE and UNSUBSCRIBE, its
``/temp-queue/`` destinations, the messages it delivers and the ones that
wait for an ACK (the session, gearhorn/stomp/sessions/session.py, keeps the
connection's state and reads the frames)."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import Protocol

from gearhorn import gearman
from gearhorn.rules.auth import Principal
from gearhorn.rules.messages import validate_queue
from gearhorn.rules.naming import temp_queue
from gearhorn.stomp.protocol.frames import Frame
from gearhorn.stomp.protocol.rules import (
    DUPLICATED_SUBSCRIPTION,
    NO_SUBSCRIPTION,
    ProtocolError,
    SessionSettings,
    ack_mode,
    ack_timeout,
    durable_flag,
    prefetch,
    queue_limits,
    require,
    subscribable,
    subscription_id,
)
from gearhorn.stomp.protocol.sendheaders import TEMP_QUEUE
from gearhorn.stomp.queues.consumer import StompSubscription
from gearhorn.stomp.queues.dispatchers import Delivery
from gearhorn.stomp.sessions.acks import observer_for, settle
from gearhorn.stomp.sessions.backend import Backend, Transport
from gearhorn.stomp.sessions.topicsubscriptions import (
    end_subscription,
    reads_history,
    subscribe_queue,
    subscribe_stream,
)
from gearhorn.store.redisconn import REDIS_ERRORS

log = logging.getLogger(__name__)


class SubscribingSession(Protocol):
    """What :class:`Subscriptions` uses of its session."""

    backend: Backend
    transport: Transport
    settings: SessionSettings
    principal: Principal
    id: str
    version: str
    client_name: str
    closed: bool

    def error(self, message: str, frame: Frame | None = None, detail: str = "") -> None: ...

    def check(self, allowed: Callable[[str], bool], destination: str, what: str) -> None: ...

    def receipt(self, frame: Frame, extra: dict[str, str] | None = None) -> None: ...

    def on_disk(self, frames: list[Frame]) -> None: ...


class Subscriptions:
    """One session's subscriptions by id, and its messages waiting for an
    ACK by message id; the owner (gearhorn/stomp/queues/consumer.py's Owner)
    of each of its subscriptions."""

    def __init__(self, session: SubscribingSession) -> None:
        self.session = session
        self.by_id: dict[str, StompSubscription] = {}
        self.acks: dict[str, StompSubscription] = {}
        self._counter = itertools.count(1)

    @property
    def closed(self) -> bool:
        return self.session.closed

    def error(self, message: str) -> None:
        self.session.error(message)

    # -- SUBSCRIBE / UNSUBSCRIBE -------------------------------------------------

    def subscribe(self, frame: Frame) -> None:
        s = self.session
        destination = require(frame, "destination")
        sub_id = subscription_id(frame, s.version)
        if sub_id in self.by_id:
            raise ProtocolError(f"A subscription identified by '{sub_id}' already exists.",
                                DUPLICATED_SUBSCRIPTION)
        self._room_for_one_more()
        dest = subscribable(destination)
        s.check(s.principal.may_read, f"/{dest.kind}/{dest.name}", "subscribe to")
        ack = ack_mode(frame)
        sub = StompSubscription(self, sub_id, destination, ack, prefetch(frame, ack, s.settings),
                                ack_timeout(frame))
        if dest.kind == "topic" and reads_history(s.backend, dest.name, frame):
            self.by_id[sub_id] = sub  # before its first message
            s.receipt(frame, subscribe_stream(s.backend, sub, dest.name, frame))
            return
        if dest.kind == "topic":
            subscribe_queue(s.backend, sub, dest.name, frame, s.client_name)
            kept = sub.durable
        else:
            sub.function = dest.name
            limits = queue_limits(frame)
            if limits is not None:
                s.backend.queues.bound_queue(sub.function, limits)
            kept = limits is not None
        if kept:  # a registration that outlives the connection: on disk before the RECEIPT
            s.on_disk([frame])
        self.by_id[sub_id] = sub
        sub.dispatcher = s.backend.queues.attach(sub.function, sub, sub.shared)
        s.backend.observer.attached(sub.function)
        s.receipt(frame)

    def unsubscribe(self, frame: Frame) -> None:
        s = self.session
        sub_id = subscription_id(frame, s.version)
        sub = self.by_id.pop(sub_id, None)
        if sub is None:
            raise ProtocolError(f"no subscription with id {sub_id!r}", NO_SUBSCRIPTION)
        remove = durable_flag(frame) or "activemq.subscriptionName" in frame.headers
        end_subscription(s.backend, sub, self.acks, remove=remove or not sub.durable)
        if sub.durable and remove:
            s.on_disk([frame])
        s.receipt(frame)

    def temp_queue(self, name: str) -> str:
        """The Gearman function behind this connection's ``/temp-queue/NAME``,
        made (with its implicit auto-ack subscription) on first use. RabbitMQ's
        convention: the subscription id is ``/temp-queue/NAME``."""
        s = self.session
        sub_id = TEMP_QUEUE + name
        sub = self.by_id.get(sub_id)
        if sub is None:
            self._room_for_one_more()
            function = validate_queue(temp_queue(s.id, name))
            sub = StompSubscription(self, sub_id, f"/queue/{function}", "auto",
                                    s.settings.auto_ack_window, None)
            sub.function, sub.temporary = function, True
            s.backend.registrations.temp_queue_opened(function)
            self.by_id[sub_id] = sub
            sub.dispatcher = s.backend.queues.attach(function, sub, shared=False)
        return sub.function

    def _room_for_one_more(self) -> None:
        most = self.session.settings.max_subscriptions
        if len(self.by_id) >= most:
            raise ProtocolError(f"more than {most} subscriptions on one connection")

    def end_all(self) -> None:
        """The connection is gone: every unacked message back, every
        subscription ended (a durable one kept)."""
        for sub in list(self.by_id.values()):
            try:
                end_subscription(self.session.backend, sub, self.acks, remove=False)
            except (*REDIS_ERRORS, gearman.GearmanError) as exc:
                log.warning("session %s: cleanup of %s failed: %s", self.session.id, sub.id, exc)
        self.by_id.clear()

    # -- delivery ----------------------------------------------------------------

    def backlogged(self) -> bool:
        s = self.session
        return s.transport.backlog >= s.settings.max_backlog

    def settled(self, message_id: str) -> None:
        self.acks.pop(message_id, None)

    def deliver(self, sub: StompSubscription, delivery: Delivery) -> None:
        s = self.session
        message_id = f"{s.id}-{next(self._counter)}"
        delivery.message_id = message_id
        data = sub.message(delivery, message_id, s.version)
        observer = observer_for(sub, s.backend.observer)
        observer.delivered(sub.function, delivery.unique, delivery.redelivered)
        if sub.ack == "auto":
            sub.in_flight += 1

            def sent() -> None:
                sub.in_flight -= 1
                delivery.ack()
                observer.acked(sub.function, delivery.unique)

            def dropped() -> None:
                sub.in_flight -= 1
                delivery.nack()

            # A stream's ack only frees credit: it never blocks.
            s.transport.send(data, sent, dropped, inline=sub.stream)
        else:
            sub.unacked[message_id] = delivery
            self.acks[message_id] = sub
            s.transport.send(data)

    def settle(self, frame: Frame) -> None:
        """An ACK or NACK (now, or at its transaction's COMMIT)."""
        settle(frame, self.session.version, self.acks, self.session.backend.observer)
