"""What an ACK or NACK does to the messages a connection holds."""

from __future__ import annotations

import logging

from gearhorn.stomp.protocol.frames import Frame
from gearhorn.stomp.protocol.rules import boolean, settle_target
from gearhorn.stomp.queues.consumer import StompSubscription
from gearhorn.stomp.sessions.backend import Observes
from gearhorn.store.observers import Observer

log = logging.getLogger(__name__)

# A stream subscription's messages are no copies: the ledger has them as
# runs of offsets (gearhorn/stomp/topics/streamruns.py), not delivery by delivery.
QUIET = Observer()


def observer_for(sub: StompSubscription, observer: Observes) -> Observes:
    """Who hears of ``sub``'s deliveries and acks."""
    return QUIET if sub.stream else observer


def settle(frame: Frame, version: str, acks: dict[str, StompSubscription],
           observer: Observes) -> None:
    """ACK: done with the message (and, in ``client`` mode, those before it).
    NACK: given back to its queue, or with ``requeue:false`` dead-lettered."""
    message_id = settle_target(frame, version)
    sub = acks.get(message_id)
    if sub is None:
        # Already settled, or taken back after its ack-timeout: nothing to do.
        log.debug("ack for unknown message %s", message_id)
        return
    settled = sub.take(message_id)
    for delivery in settled:
        acks.pop(delivery.message_id, None)
    if frame.command == "ACK":
        observer = observer_for(sub, observer)
        for delivery in settled:
            delivery.ack()
            observer.acked(sub.function, delivery.unique)
    elif not boolean(frame, "requeue", True):
        sub.dispatcher.reject(settled)
    else:
        sub.dispatcher.give_back(settled)
