"""What a SUBSCRIBE to ``/topic/`` registers: a queue of its own (plain or
durable), or a reader of the topic's history (``x-stream-offset``)."""

from __future__ import annotations

import uuid

from gearhorn.messages import queue_name
from gearhorn.naming import durable_client_id, stream_client_id
from gearhorn.stomp.backend import Backend
from gearhorn.stomp.frames import Frame
from gearhorn.stomp.offsets import resume_point
from gearhorn.stomp.rules import durable_name, queue_limits
from gearhorn.stomp.subscription import StompSubscription


def subscribe_queue(backend: Backend, sub: StompSubscription, pattern: str, frame: Frame,
                    client_name: str) -> None:
    """Copies of ``pattern``'s messages go to a queue of ``sub``'s own,
    kept after the connection when the subscription is durable."""
    name = durable_name(frame, sub.id)
    sub.durable = name is not None
    sub.client_id = (durable_client_id(f"{client_name}:{pattern}:{name}")
                     if sub.durable else "s" + uuid.uuid4().hex[:20])
    limits = queue_limits(frame)
    sub.pattern = pattern
    sub.function = queue_name(pattern, sub.client_id)
    backend.registrations.subscribe_topic(pattern, sub.client_id, sub.durable, limits)


def subscribe_stream(backend: Backend, sub: StompSubscription, topic: str,
                     frame: Frame) -> dict[str, str]:
    """``sub`` reads ``topic``'s history from x-stream-offset on, then live
    (gearhorn/stomp/streams.py); listed for presence, with no queue. The
    RECEIPT's headers say where it starts."""
    start = resume_point(backend.streams, topic, frame.headers)
    sub.stream, sub.pattern, sub.client_id = True, topic, stream_client_id()
    sub.function = queue_name(topic, sub.client_id)
    backend.registrations.subscribe_topic(topic, sub.client_id)
    sub.dispatcher = backend.streams.read_stream(topic, sub, start.after, start.epoch,
                                                 start.recovered)
    return start.receipt_headers()
