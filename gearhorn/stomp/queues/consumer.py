"""A SUBSCRIBE of one session: the consumer a QueueDispatcher hands jobs to."""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol

from gearhorn.stomp.protocol.frames import encode, message_frame, message_prefix
from gearhorn.stomp.queues.dispatchers import Delivery, QueueDispatcher


class Owner(Protocol):
    """What a subscription needs from its session (gearhorn/stomp/sessions/session.py)."""

    closed: bool

    def backlogged(self) -> bool:
        """True while the connection has too much written and not yet sent."""
        ...

    def deliver(self, sub: StompSubscription, delivery: Delivery) -> None: ...

    def settled(self, message_id: str) -> None:
        """``message_id`` no longer waits for an ACK."""
        ...


class StompSubscription:
    """A SUBSCRIBE: the consumer a QueueDispatcher hands jobs to."""

    def __init__(self, session: Owner, sub_id: str, destination: str, ack: str,
                 prefetch: int, ack_timeout: float | None) -> None:
        self.session = session
        self.id = sub_id
        self.destination = destination
        self.ack = ack
        self.prefetch = prefetch
        self.ack_timeout = ack_timeout
        self.unacked: OrderedDict[str, Delivery] = OrderedDict()
        self.in_flight = 0  # auto-ack messages queued but not yet written
        self.dispatcher: QueueDispatcher | None = None
        self.function = ""
        # For topic subscriptions: the registry entry behind the queue.
        self.pattern: str | None = None
        self.client_id: str | None = None
        self.durable = False
        self.stream = False  # read from the topic's history (gearhorn/stomp/topics/streams.py)
        self.temporary = False  # a /temp-queue/ reply queue
        self.closed = False
        self.prefix: bytes | None = None  # the start of its MESSAGE frames, made once

    @property
    def shared(self) -> bool:
        """Whether others may read its queue: a ``/queue/`` or a durable
        subscription's; not a temp queue or a non-durable subscription's."""
        return not self.temporary and (self.pattern is None or self.durable)

    def credit(self) -> int:
        if self.closed or self.session.closed:
            return 0
        if self.ack == "auto":
            if self.session.backlogged():
                return 0
            return self.prefetch - self.in_flight
        return self.prefetch - len(self.unacked)

    def deliver(self, delivery: Delivery) -> None:
        self.session.deliver(self, delivery)

    def failed(self, reason: str) -> None:
        """Its stream reader cannot go on: the connection ends with an ERROR
        (the client resumes from the last offset it saw)."""
        self.session.error(f"subscription {self.id}: {reason}")

    def take(self, message_id: str) -> list[Delivery]:
        """The deliveries an ACK or NACK of ``message_id`` settles, in the
        order they were delivered: in ``client`` mode that one and every
        earlier one (cumulative), else that one alone."""
        if message_id not in self.unacked:
            return []
        if self.ack != "client":
            return [self.unacked.pop(message_id)]
        taken = []
        for mid in list(self.unacked):
            taken.append(self.unacked.pop(mid))
            if mid == message_id:
                break
        return taken

    def forget(self, delivery: Delivery) -> None:
        self.unacked.pop(delivery.message_id, None)
        self.session.settled(delivery.message_id)

    def message(self, delivery: Delivery, message_id: str, version: str) -> bytes:
        """The MESSAGE frame of ``delivery``; without headers of its own, from
        a prefix made once per subscription."""
        ack = self.ack != "auto" and version == "1.2"
        if not delivery.headers:
            if self.prefix is None:
                self.prefix = message_prefix(self.id, self.destination, version)
            return message_frame(self.prefix, message_id, delivery.deliveries,
                                 delivery.redelivered, ack, delivery.body, delivery.extra)
        headers = {**delivery.headers, "subscription": self.id, "message-id": message_id,
                   "destination": delivery.headers.get("destination", self.destination),
                   "delivery-count": str(delivery.deliveries),
                   "redelivered": "true" if delivery.redelivered else "false"}
        if ack:
            headers["ack"] = message_id
        return encode("MESSAGE", headers, delivery.body, version)
