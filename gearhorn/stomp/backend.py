"""What a STOMP session needs from the bridge it runs in.

:class:`gearhorn.stomp.broker.Broker` is the real one; the session's unit
tests use a fake with the same methods. Declared here so that neither
depends on the other's internals.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from gearhorn import gearman
from gearhorn.limits import Limits
from gearhorn.stomp.auth import Principal
from gearhorn.stomp.queues import QueueConsumer, QueueDispatcher
from gearhorn.stomp.sending import SendOptions


class Transport(Protocol):
    """The connection a session writes to (a socket, a WebSocket, a test list)."""

    backlog: int  # bytes queued and not yet written

    def send(self, data: bytes, on_sent: Callable[[], None] | None = None,
             on_dropped: Callable[[], None] | None = None) -> None: ...

    def close(self) -> None: ...


class Backend(Protocol):
    """Gearman and Redis as one session sees them."""

    def new_client(self) -> gearman.Client: ...

    def authenticate(self, login: str | None, passcode: str | None) -> Principal | None: ...

    def record(self, event: str, subscriber: str, unique: str = "",
               redelivered: bool = False) -> None: ...

    def send_to_queue(self, client: gearman.Client, function: str,
                      bodies: Sequence[bytes], options: SendOptions = ...) -> None: ...

    def publish(self, client: gearman.Client, topic: str, bodies: Sequence[bytes],
                options: SendOptions = ...) -> dict: ...

    def request(self, function: str, body: bytes, options: SendOptions,
                reply_queue: str, done: Callable[[], None] | None = None) -> None: ...

    def attach(self, function: str, consumer: QueueConsumer,
               shared: bool = True) -> QueueDispatcher: ...

    def bound_queue(self, function: str, limits: Limits) -> None: ...

    def subscribe_topic(self, pattern: str, client_id: str, durable: bool = False,
                        limits: Limits | None = None) -> None: ...

    def unsubscribe_topic(self, pattern: str, client_id: str) -> None: ...

    def temp_queue_opened(self, function: str) -> None: ...

    def temp_queue_closed(self, function: str) -> None: ...

    def temp_queue_exists(self, function: str) -> bool: ...

    def drop_queue(self, function: str) -> None: ...

    def count_messages(self, function: str) -> int: ...

    def count_queue_subscribers(self, function: str) -> int: ...

    def count_topic_subscribers(self, topic: str) -> int: ...
