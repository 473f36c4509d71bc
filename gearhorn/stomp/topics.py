"""What a SUBSCRIBE to ``/topic/`` registers: a queue of its own (plain or
durable), or a reader of the topic's history (``x-stream-offset``); and
how any subscription ends."""

from __future__ import annotations

import uuid

from gearhorn.messages import queue_name
from gearhorn.naming import durable_client_id, stream_client_id
from gearhorn.stomp.backend import Backend
from gearhorn.stomp.frames import Frame
from gearhorn.stomp.offsets import resume_point
from gearhorn.stomp.rules import durable_name, queue_limits
from gearhorn.stomp.subscription import StompSubscription


def reads_history(backend: Backend, pattern: str, frame: Frame) -> bool:
    """Whether a SUBSCRIBE to ``pattern`` reads the topic's history: when it
    asks to (``x-stream-offset``), or when it is a plain, non-durable one to a
    topic that keeps a history (a live reader, from the next message: no
    queue of its own to fill)."""
    if "x-stream-offset" in frame.headers:
        return True
    return (not pattern.endswith("*") and durable_name(frame, "") is None
            and backend.streams.keeps_history(pattern))


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
    RECEIPT's headers say where it starts. Without x-stream-offset (a plain
    SUBSCRIBE) it is a live reader from the next message: this bridge's
    SENDs reach it before they are appended, and no MESSAGE (or RECEIPT)
    carries an offset."""
    live = "x-stream-offset" not in frame.headers
    start = resume_point(backend.streams, topic, {"x-stream-offset": "next", **frame.headers})
    sub.stream, sub.pattern, sub.client_id = True, topic, stream_client_id()
    sub.function = queue_name(topic, sub.client_id)
    backend.registrations.subscribe_topic(topic, sub.client_id)
    sub.dispatcher = backend.streams.read_stream(topic, sub, start.after, start.epoch,
                                                 start.recovered, live)
    return {} if live else start.receipt_headers()


def end_subscription(backend: Backend, sub: StompSubscription, acks: dict[str, object],
                     remove: bool) -> None:
    """Stop ``sub`` (its session's ``acks`` forget its messages); ``remove``
    also deletes its topic registration."""
    sub.closed = True
    if sub.temporary:
        # First: a reply whose requester left is dropped from here on
        # (gearhorn/stomp/replies.py), not queued where nobody reads.
        backend.registrations.temp_queue_closed(sub.function)
    if sub.pattern is not None and (remove or not sub.durable):
        # First stop new copies, then hand back what we hold.
        backend.registrations.unsubscribe_topic(sub.pattern, sub.client_id)
    unacked = list(sub.unacked.values())
    for message_id in sub.unacked:
        acks.pop(message_id, None)
    sub.unacked.clear()
    if sub.dispatcher is not None:
        forgotten = not sub.shared or (sub.pattern is not None and remove)
        sub.dispatcher.remove(sub, unacked, give_back=not forgotten)
        if forgotten and not sub.dispatcher.consumers and not sub.stream:
            backend.queues.drop_queue(sub.function)
