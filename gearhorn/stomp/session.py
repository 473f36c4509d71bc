"""One STOMP connection's protocol state, independent of the transport.

The session only calls ``transport.send(bytes, on_sent, on_dropped, inline)`` and
``transport.close()``, so tests drive it without sockets. Frames are
dispatched by command to ``on_<command>`` methods. Every protocol violation
ends in an ERROR frame with a ``message`` header, then the connection closes.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import Callable

from gearhorn import gearman
from gearhorn.auth import OPEN
from gearhorn.messages import BadRequest, validate_queue
from gearhorn.naming import temp_queue
from gearhorn.stomp.acks import observer_for, settle
from gearhorn.stomp.backend import Backend, FanoutFailed, Transport
from gearhorn.stomp.batching import send_batches
from gearhorn.stomp.bounds import QueueFull
from gearhorn.stomp.exchanges import TOPIC_EXCHANGE, canonical
from gearhorn.stomp.frames import Frame, encode
from gearhorn.stomp.outbox import Outbox
from gearhorn.stomp.queues import Delivery
from gearhorn.stomp.rules import (
    ACCESS_REFUSED,
    BAD_COMMAND,
    BAD_CONNECT,
    DUPLICATED_SUBSCRIPTION,
    ILLEGAL_COMMAND,
    NO_SUBSCRIPTION,
    SERVER_NAME,
    SUPPORTED_VERSIONS,
    ProtocolError,
    SessionSettings,
    Transactions,
    ack_mode,
    ack_timeout,
    boolean,
    durable_flag,
    heartbeats,
    negotiate_version,
    prefetch,
    queue_limits,
    require,
    settle_target,
    subscribable,
    subscription_id,
    version_error,
)
from gearhorn.stomp.sending import TEMP_QUEUE
from gearhorn.stomp.sends import Sends
from gearhorn.stomp.subscription import StompSubscription
from gearhorn.stomp.topics import (
    end_subscription,
    reads_history,
    subscribe_queue,
    subscribe_stream,
)
from gearhorn.store.fsync import BarrierUnavailable, FsyncFailed
from gearhorn.store.redisconn import REDIS_ERRORS

log = logging.getLogger(__name__)

# What a frame may fail with; each ends the connection with an ERROR (_refused).
_REFUSALS = (ProtocolError, BadRequest, FanoutFailed, QueueFull, FsyncFailed,
             BarrierUnavailable, gearman.GearmanError, *REDIS_ERRORS)
# Frames that need not wait for the topic SENDs in flight (gearhorn/stomp/outbox.py).
_BESIDE_SENDS = frozenset({"SEND", "ACK", "NACK"})

class Session:
    """Protocol state of one STOMP connection."""

    def __init__(self, backend: Backend, transport: Transport,
                 settings: SessionSettings | None = None) -> None:
        self.backend = backend
        self.transport = transport
        self.settings = settings or SessionSettings()
        self.id = uuid.uuid4().hex[:16]
        self.version = "1.0"
        self.connected = False
        self.closed = False
        self.heartbeat = (0, 0)  # (we send every ms, we expect every ms)
        self.client_name = ""
        self.principal = OPEN
        self.subscriptions: dict[str, StompSubscription] = {}
        self.acks: dict[str, StompSubscription] = {}
        self.transactions = Transactions(self.settings.max_transaction_frames)
        self._counter = itertools.count(1)
        self._gearman: gearman.Client | None = None
        self.sends = Sends(self)
        self.outbox = Outbox(backend.publisher, lambda: self.gearman,
                             lambda frames, result: self.sends.answered(frames, result, _REFUSALS),
                             self.refused, self.settings.max_payload_bytes)
        self._handlers = {
            "CONNECT": self.on_connect, "STOMP": self.on_connect, "SEND": self.sends.on_send,
            "SUBSCRIBE": self.on_subscribe, "UNSUBSCRIBE": self.on_unsubscribe,
            # NACK is not in STOMP 1.0, but RabbitMQ and ActiveMQ take it there too.
            "ACK": self._settle, "NACK": self._settle, "BEGIN": self.on_begin,
            "COMMIT": self.on_commit, "ABORT": self.on_abort, "DISCONNECT": self.on_disconnect,
        }

    @property
    def gearman(self) -> gearman.Client:
        if self._gearman is None:
            self._gearman = self.backend.publisher.new_client()
        return self._gearman

    # -- entry points ------------------------------------------------------------

    def handle(self, frame: Frame) -> None:
        """Process one frame from the client."""
        if self.closed:
            return
        _name_topics_as_topics(frame)
        try:
            handler = self._handlers.get(frame.command)
            if handler is None:
                raise ProtocolError(f'Could not interpret command "{frame.command[:40]}"\n',
                                    BAD_COMMAND)
            if not self.connected and handler != self.on_connect:
                raise ProtocolError(f"{frame.command} before CONNECT", ILLEGAL_COMMAND)
            if frame.command not in _BESIDE_SENDS and not self.flushed():
                return
            handler(frame)
        except _REFUSALS as exc:
            self.refused(frame, exc)

    def refused(self, frame: Frame, exc: Exception) -> None:
        """The ERROR a failed frame ends the connection with."""
        if isinstance(exc, ProtocolError):
            self.error(exc.title, frame, str(exc))
        elif isinstance(exc, BadRequest):
            self.error(str(exc), frame)
        elif isinstance(exc, (FanoutFailed, QueueFull, FsyncFailed)):
            log.warning("session %s: %s", self.id, exc)
            self.error(str(exc), frame)
        else:
            log.warning("session %s: %s failed: %s", self.id, frame.command, exc)
            self.error(f"service unavailable: {exc}", frame)

    def handle_frames(self, frames: list[Frame]) -> None:
        """Process frames read together; consecutive SENDs to one destination
        go to Gearman as one batch (gearhorn/stomp/batching.py)."""
        for frame in frames:
            _name_topics_as_topics(frame)
        for group in send_batches(frames, self.settings.max_payload_bytes):
            if self.closed:
                return
            if len(group) > 1 and self.connected:
                self.sends.batch(group, _REFUSALS)
            else:
                for frame in group:
                    self.handle(frame)

    def error(self, message: str, frame: Frame | None = None, detail: str = "") -> None:
        """Send ERROR (with ``message``) and close the connection."""
        if self.closed:
            return
        headers = {"message": message.replace("\n", " ")[:1000], "content-type": "text/plain"}
        if message == BAD_COMMAND:  # as RabbitMQ: maybe a newer protocol's command
            headers["version"] = ",".join(SUPPORTED_VERSIONS)
        if frame is not None and "receipt" in frame.headers:
            headers["receipt-id"] = frame.headers["receipt"]
        body = (detail or message).encode()
        # Logged first: the ERROR may leave at once (gearhorn/stomp/server.py),
        # and whoever reads the log after the client saw it finds the reason.
        log.info("session %s: ERROR %s%s", self.id, message,
                 f" ({detail})" if detail and detail != message else "")
        self.transport.send(encode("ERROR", headers, body, self.version))
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.transport.close()

    def connection_lost(self) -> None:
        """The socket is gone: give back every unacked message, end subscriptions."""
        self.closed = True
        for sub in list(self.subscriptions.values()):
            try:
                end_subscription(self.backend, sub, self.acks, remove=False)
            except (*REDIS_ERRORS, gearman.GearmanError) as exc:
                log.warning("session %s: cleanup of %s failed: %s", self.id, sub.id, exc)
        self.subscriptions.clear()
        self.outbox.flush()  # what was read before the socket went still goes out
        if self._gearman is not None:
            self._gearman.close()

    # -- CONNECT -----------------------------------------------------------------

    def on_connect(self, frame: Frame) -> None:
        if self.connected:
            raise ProtocolError("already connected")
        version = negotiate_version(frame.get("accept-version", "1.0"))
        if version is None:
            self.transport.send(version_error())
            self.close()
            return
        self.version = version
        principal = self.backend.logins.authenticate(frame.get("login"), frame.get("passcode"))
        if principal is None:
            # RabbitMQ's words; never the passcode, nor which of the two was wrong.
            login = frame.get("login")
            raise ProtocolError(f"Access refused for user '{login[:100]}'" if login else
                                "Access refused: this bridge allows no anonymous login",
                                BAD_CONNECT)
        self.principal = principal
        sx, sy = self.settings.heartbeat_send_ms, self.settings.heartbeat_receive_ms
        self.heartbeat = heartbeats(frame.get("heart-beat", "0,0"), sx, sy)
        self.client_name = frame.get("client-id", "")
        # STOMP 1.0 has no heart-beating: "0,0" says so (and RabbitMQ sends
        # both headers on every version; clients of 1.0 ignore them).
        beats = f"{sx},{sy}" if self.version != "1.0" else "0,0"
        headers = {"session": self.id, "server": SERVER_NAME, "version": self.version,
                   "heart-beat": beats}
        self.connected = True
        self.transport.send(encode("CONNECTED", headers, b"", self.version))

    # -- SEND --------------------------------------------------------------------

    def flushed(self) -> bool:
        """Wait for the topic SENDs in flight; False if one failed (the
        connection is ending)."""
        self.outbox.flush()
        return not self.closed

    def check(self, allowed: Callable[[str], bool], destination: str, what: str) -> None:
        if not allowed(destination):
            raise ProtocolError(f"access refused: {self.principal.name} may not {what} "
                                f"{destination}", ACCESS_REFUSED)

    def temp_queue(self, name: str) -> str:
        """The Gearman function behind this connection's ``/temp-queue/NAME``,
        made (with its implicit auto-ack subscription) on first use. RabbitMQ's
        convention: the subscription id is ``/temp-queue/NAME``."""
        sub_id = TEMP_QUEUE + name
        sub = self.subscriptions.get(sub_id)
        if sub is None:
            self._room_for_one_more()
            function = validate_queue(temp_queue(self.id, name))
            sub = StompSubscription(self, sub_id, f"/queue/{function}", "auto",
                                    self.settings.auto_ack_window, None)
            sub.function, sub.temporary = function, True
            self.backend.registrations.temp_queue_opened(function)
            self.subscriptions[sub_id] = sub
            sub.dispatcher = self.backend.queues.attach(function, sub, shared=False)
        return sub.function

    # -- SUBSCRIBE / UNSUBSCRIBE -------------------------------------------------

    def on_subscribe(self, frame: Frame) -> None:
        destination = require(frame, "destination")
        sub_id = subscription_id(frame, self.version)
        if sub_id in self.subscriptions:
            raise ProtocolError(f"A subscription identified by '{sub_id}' already exists.",
                                DUPLICATED_SUBSCRIPTION)
        self._room_for_one_more()
        dest = subscribable(destination)
        self.check(self.principal.may_read, f"/{dest.kind}/{dest.name}", "subscribe to")
        ack = ack_mode(frame)
        sub = StompSubscription(self, sub_id, destination, ack, prefetch(frame, ack, self.settings),
                                ack_timeout(frame))
        if dest.kind == "topic" and reads_history(self.backend, dest.name, frame):
            self.subscriptions[sub_id] = sub  # before its first message
            self.receipt(frame, subscribe_stream(self.backend, sub, dest.name, frame))
            return
        if dest.kind == "topic":
            subscribe_queue(self.backend, sub, dest.name, frame, self.client_name)
            kept = sub.durable
        else:
            sub.function = dest.name
            limits = queue_limits(frame)
            if limits is not None:
                self.backend.queues.bound_queue(sub.function, limits)
            kept = limits is not None
        if kept:  # a registration that outlives the connection: on disk before the RECEIPT
            self.sends.on_disk([frame])
        self.subscriptions[sub_id] = sub
        sub.dispatcher = self.backend.queues.attach(sub.function, sub, sub.shared)
        self.backend.observer.attached(sub.function)
        self.receipt(frame)

    def _room_for_one_more(self) -> None:
        if len(self.subscriptions) >= self.settings.max_subscriptions:
            raise ProtocolError(f"more than {self.settings.max_subscriptions} subscriptions "
                                "on one connection")

    def on_unsubscribe(self, frame: Frame) -> None:
        sub_id = subscription_id(frame, self.version)
        sub = self.subscriptions.pop(sub_id, None)
        if sub is None:
            raise ProtocolError(f"no subscription with id {sub_id!r}", NO_SUBSCRIPTION)
        remove = durable_flag(frame) or "activemq.subscriptionName" in frame.headers
        end_subscription(self.backend, sub, self.acks, remove=remove or not sub.durable)
        if sub.durable and remove:
            self.sends.on_disk([frame])
        self.receipt(frame)

    # -- delivery ----------------------------------------------------------------

    def backlogged(self) -> bool:
        return self.transport.backlog >= self.settings.max_backlog

    def settled(self, message_id: str) -> None:
        self.acks.pop(message_id, None)

    def deliver(self, sub: StompSubscription, delivery: Delivery) -> None:
        message_id = f"{self.id}-{next(self._counter)}"
        delivery.message_id = message_id
        data = sub.message(delivery, message_id, self.version)
        observer = observer_for(sub, self.backend.observer)
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
            self.transport.send(data, sent, dropped, inline=sub.stream)
        else:
            sub.unacked[message_id] = delivery
            self.acks[message_id] = sub
            self.transport.send(data)

    # -- ACK / NACK --------------------------------------------------------------

    def _settle(self, frame: Frame) -> None:
        settle_target(frame, self.version)  # a missing id is an error now, not at COMMIT
        boolean(frame, "requeue", True)  # so is a requeue that is not true or false
        if self.transactions.hold(frame):
            return
        settle(frame, self.version, self.acks, self.backend.observer)
        self.receipt(frame)

    # -- transactions ------------------------------------------------------------

    def on_begin(self, frame: Frame) -> None:
        self.transactions.begin(require(frame, "transaction"))
        self.receipt(frame)

    def on_commit(self, frame: Frame) -> None:
        frames = self.transactions.end(require(frame, "transaction"))
        extras = []
        for queued in frames:  # in order; a failure ends the connection there
            extra = None
            if queued.command == "SEND":
                extra = self.sends.send(queued, on_disk=False)
            else:
                settle(queued, self.version, self.acks, self.backend.observer)
            extras.append(extra)
        # One fsync for the transaction's SENDs, before any of its RECEIPTs.
        self.sends.on_disk([frame, *(f for f in frames if f.command == "SEND")])
        for queued, extra in zip(frames, extras, strict=True):
            self.receipt(queued, extra)
        self.receipt(frame)

    def on_abort(self, frame: Frame) -> None:
        tx = require(frame, "transaction")
        for queued in self.transactions.end(tx):
            self.receipt(queued, {"transaction-aborted": tx})  # discarded, and said so
        self.receipt(frame)

    # -- DISCONNECT --------------------------------------------------------------

    def on_disconnect(self, frame: Frame) -> None:
        self.receipt(frame)
        self.close()

    def receipt(self, frame: Frame, extra: dict[str, str] | None = None) -> None:
        receipt = frame.get("receipt")
        if receipt is not None and not self.closed:  # never a RECEIPT after an ERROR
            headers = {"receipt-id": receipt, **(extra or {})}
            self.transport.send(encode("RECEIPT", headers, b"", self.version))


def _name_topics_as_topics(frame: Frame) -> None:
    """RabbitMQ's ``/exchange/amq.topic/K`` is ``/topic/K``: batched with
    it, and named so on the MESSAGE frames (exchanges.py)."""
    destination = frame.headers.get("destination")
    if destination is not None and destination.startswith(TOPIC_EXCHANGE):
        frame.headers["destination"] = canonical(destination)
