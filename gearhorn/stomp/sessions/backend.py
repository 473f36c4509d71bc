"""What a STOMP session needs from the bridge it runs in: one small
collaborator per concern, each declared here as a protocol so that the
session depends on none of their internals.

The real ones are built by the composition root, :mod:`gearhorn.stomp.app`
(coilmq's ``StompEngine(connection, authenticator, queue_manager,
topic_manager)`` is the model); the session's unit tests use one fake that
plays every part (tests/fakes.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from gearhorn import gearman
from gearhorn.rules.auth import Principal
from gearhorn.rules.limits import Limits
from gearhorn.stomp.protocol.rules import Destination
from gearhorn.stomp.protocol.sendheaders import SendOptions, TopicSend
from gearhorn.stomp.queues.dispatchers import QueueConsumer, QueueDispatcher
from gearhorn.stomp.topics.startoffsets import Kept
from gearhorn.stomp.topics.streams import StreamConsumer, StreamReader


class Transport(Protocol):
    """The connection a session writes to (a socket, a WebSocket, a test list)."""

    backlog: int  # bytes queued and not yet written

    def send(self, data: bytes, on_sent: Callable[[], None] | None = None,
             on_dropped: Callable[[], None] | None = None, inline: bool = False) -> None:
        """Queue ``data``; ``on_sent`` once written, ``on_dropped`` if never.
        ``inline``: ``on_sent`` never blocks, so it may run wherever the
        bytes are written (else only where blocking is allowed)."""

    def close(self) -> None: ...


class Authenticates(Protocol):
    """CONNECT's login and passcode -> who connected (None: refused)."""

    def authenticate(self, login: str | None, passcode: str | None) -> Principal | None: ...


class Publishes(Protocol):
    """SEND: background jobs on a queue, fanouts on a topic."""

    def new_client(self) -> gearman.Client: ...

    def send_to_queue(self, client: gearman.Client, function: str,
                      bodies: Sequence[bytes], options: SendOptions = ...) -> None: ...

    def publish(self, client: gearman.Client, topic: str, bodies: Sequence[bytes],
                options: SendOptions = ...) -> dict: ...

    def prepare(self, topic: str, bodies: Sequence[bytes],
                options: SendOptions = ...) -> TopicSend:
        """``publish``'s first step: the SEND given its ids and handed to
        the live readers, when the topic keeps a history."""
        ...

    def append(self, send: TopicSend) -> None:
        """The second: a prepared SEND appended to its topic's history."""
        ...

    def abandon(self, send: TopicSend) -> None:
        """A prepared SEND that will never be appended."""
        ...

    def start(self, client: gearman.Client, send: TopicSend) -> Answered:
        """``publish``'s last step: the fanout job submitted; its answer
        is read later (:meth:`Answered.wait`)."""
        ...


class Answered(Protocol):
    def wait(self) -> dict:
        """The fanout job's result; raises FanoutFailed."""
        ...


class Requests(Protocol):
    """A SEND with ``reply-to: /temp-queue/...``: a job whose answer comes back."""

    def request(self, function: str, body: bytes, options: SendOptions,
                reply_queue: str, done: Callable[[], None] | None = None) -> None: ...


class AttachesQueues(Protocol):
    """The bridge's dispatchers: a subscription reads a Gearman queue through one."""

    def attach(self, function: str, consumer: QueueConsumer,
               shared: bool = True) -> QueueDispatcher: ...

    def bound_queue(self, function: str, limits: Limits) -> None: ...

    def drop_queue(self, function: str) -> None: ...


class Registers(Protocol):
    """What the bridge holds in Redis: topic subscriptions and temp queues."""

    def subscribe_topic(self, pattern: str, client_id: str, durable: bool = False,
                        limits: Limits | None = None, linger: int | None = None
                        ) -> None: ...

    def unsubscribe_topic(self, pattern: str, client_id: str) -> None: ...

    def temp_queue_opened(self, function: str) -> None: ...

    def temp_queue_closed(self, function: str) -> None: ...

    def temp_queue_exists(self, function: str) -> bool: ...


class ServesStreams(Protocol):
    """Stream subscriptions: a topic's history, then its live messages
    (gearhorn/stomp/topics/streams.py)."""

    def keeps_history(self, topic: str) -> bool: ...

    def always_kept(self, topic: str) -> bool: ...

    def linger(self, topic: str) -> int: ...

    def kept(self, topic: str) -> Kept: ...

    def offset_at(self, topic: str, at: float) -> int: ...

    def read_stream(self, topic: str, consumer: StreamConsumer, after: int,
                    epoch: str | None, recovered: bool, live: bool = False,
                    last: int | None = None) -> StreamReader: ...


class Counts(Protocol):
    """``/control/`` destinations: how many messages and subscribers."""

    def answer(self, dest: Destination) -> dict[str, str]: ...


class Durable(Protocol):
    """Acknowledgements after fsync (gearhorn/store/fsync.py): :meth:`wait`
    returns once the Redis servers have synced what the bridge wrote."""

    def wait(self) -> None:
        """Raises BarrierUnavailable (an outage) or FsyncFailed."""
        ...


class Observes(Protocol):
    """What a session tells the ledger (gearhorn/store/observers.py)."""

    def attached(self, queue: str) -> None: ...

    def delivered(self, queue: str, unique: str, redelivered: bool) -> None: ...

    def acked(self, queue: str, unique: str) -> None: ...


@dataclass(frozen=True)
class Backend:
    """The collaborators of every session of one bridge."""

    logins: Authenticates
    publisher: Publishes
    requests: Requests
    queues: AttachesQueues
    registrations: Registers
    counts: Counts
    observer: Observes
    streams: ServesStreams
    durability: Durable
