"""What a SUBSCRIBE to ``/topic/`` registers: a queue of its own (plain or
durable), or a reader of the topic's history (``x-stream-offset``); and
how any subscription ends."""

from __future__ import annotations

import uuid

from gearhorn.rules.limits import STOMP_HEADERS
from gearhorn.rules.naming import durable_client_id, queue_name, stream_client_id
from gearhorn.stomp.protocol.frames import Frame
from gearhorn.stomp.protocol.rules import durable_name, queue_limits
from gearhorn.stomp.queues.consumer import StompSubscription
from gearhorn.stomp.sessions.backend import Backend
from gearhorn.stomp.topics.startoffsets import resume_point


def reads_history(backend: Backend, pattern: str, frame: Frame) -> bool:
    """Whether a SUBSCRIBE to ``pattern`` reads the topic's history: when it
    asks to (``x-stream-offset``), or when it is a plain, non-durable one to a
    topic whose history it may read (every topic with real-time topics on,
    the default: no queue of its own to fill). Prefix subscriptions keep a
    queue: an offset counts one topic's messages (docs/design/index.rst)."""
    if "x-stream-offset" in frame.headers:
        return True
    return (not pattern.endswith("*") and durable_name(frame, "") is None
            and not asks_for_a_queue(frame) and backend.streams.keeps_history(pattern))


def asks_for_a_queue(frame: Frame) -> bool:
    """A SUBSCRIBE that sets a queue's limits (RabbitMQ's queue arguments:
    x-max-length and the rest) gets a queue, as it asks."""
    return any(header in frame.headers for header in STOMP_HEADERS) or any(
        header.startswith("x-dead-letter") for header in frame.headers)


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
    """``sub`` reads ``topic``'s history from x-stream-offset on (a plain
    SUBSCRIBE: from the next message), then live (gearhorn/stomp/topics/streams.py);
    listed for presence, with no queue. Registered before its start is
    read: a real-time topic's history is kept from then on. The RECEIPT's
    headers say where it starts. A plain SUBSCRIBE to a topic that keeps a
    history of its own (history_size, history_topics) is a live reader:
    this bridge's SENDs reach it before they are appended, and no MESSAGE
    (or RECEIPT) carries an offset."""
    streams = backend.streams
    live = "x-stream-offset" not in frame.headers and streams.always_kept(topic)
    headers = {"x-stream-offset": "next", **frame.headers}
    resume_point(streams, topic, headers, check_only=True)  # a bad header registers nothing
    sub.stream, sub.pattern, sub.client_id = True, topic, stream_client_id()
    sub.function = queue_name(topic, sub.client_id)
    backend.registrations.subscribe_topic(topic, sub.client_id, linger=streams.linger(topic))
    start = resume_point(streams, topic, headers)
    sub.dispatcher = streams.read_stream(topic, sub, start.after, start.epoch,
                                         start.recovered, live, start.last)
    return {} if live else start.receipt_headers()


def end_subscription(backend: Backend, sub: StompSubscription, acks: dict[str, object],
                     remove: bool) -> None:
    """Stop ``sub`` (its session's ``acks`` forget its messages); ``remove``
    also deletes its topic registration."""
    sub.closed = True
    if sub.temporary:
        # First: a reply whose requester left is dropped from here on
        # (gearhorn/stomp/queues/replies.py), not queued where nobody reads.
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
