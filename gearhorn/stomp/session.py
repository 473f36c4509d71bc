"""One STOMP connection's protocol state, independent of the transport.

The session only calls ``transport.send(bytes, on_sent, on_dropped)`` and
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
from gearhorn.events import Event
from gearhorn.limits import Limits, limits_from_headers
from gearhorn.messages import (
    MAX_BATCH,
    BadRequest,
    queue_name,
    validate_queue,
)
from gearhorn.naming import TEMP_FUNCTION_PREFIX, durable_client_id, temp_queue
from gearhorn.stomp.auth import OPEN
from gearhorn.stomp.backend import Backend, Transport
from gearhorn.stomp.bounds import QueueFull
from gearhorn.stomp.broker import FanoutFailed
from gearhorn.stomp.frames import Frame, encode, message_frame, message_prefix
from gearhorn.stomp.queues import Delivery
from gearhorn.stomp.rules import (
    ACCESS_REFUSED,
    ACK_MODES,
    BAD_COMMAND,
    BAD_CONNECT,
    DUPLICATED_SUBSCRIPTION,
    ILLEGAL_COMMAND,
    INVALID_DESTINATION,
    INVALID_HEADER,
    MISSING_HEADER,
    NO_SUBSCRIPTION,
    SERVER_NAME,
    Destination,
    ProtocolError,
    SessionSettings,
    Transactions,
    ack_timeout,
    boolean,
    heartbeat_header,
    negotiate_version,
    parse_destination,
    plain,
    prefetch,
    require,
    settle_target,
    version_error,
)
from gearhorn.stomp.sending import TEMP_QUEUE, SendOptions, send_options
from gearhorn.stomp.subscription import StompSubscription
from gearhorn.store.redisconn import REDIS_ERRORS

log = logging.getLogger(__name__)

class Session:
    """Protocol state of one STOMP connection."""

    def __init__(self, broker: Backend, transport: Transport,
                 settings: SessionSettings | None = None) -> None:
        self.broker = broker
        self.transport = transport
        self.settings = settings or SessionSettings()
        self.id = uuid.uuid4().hex[:16]
        self.version = "1.0"
        self.connected = False
        self.closed = False
        self.heartbeat = (0, 0)  # (we send every ms, we expect every ms)
        self.client_name = ""
        self.principal = OPEN
        self.pending_requests = 0
        self.subscriptions: dict[str, StompSubscription] = {}
        self.acks: dict[str, StompSubscription] = {}
        self.transactions = Transactions(self.settings.max_transaction_frames)
        self._counter = itertools.count(1)
        self._gearman: gearman.Client | None = None
        self._handlers = {
            "CONNECT": self.on_connect, "STOMP": self.on_connect, "SEND": self.on_send,
            "SUBSCRIBE": self.on_subscribe, "UNSUBSCRIBE": self.on_unsubscribe,
            "ACK": self.on_ack, "NACK": self.on_nack, "BEGIN": self.on_begin,
            "COMMIT": self.on_commit, "ABORT": self.on_abort, "DISCONNECT": self.on_disconnect,
        }

    @property
    def gearman(self) -> gearman.Client:
        if self._gearman is None:
            self._gearman = self.broker.new_client()
        return self._gearman

    # -- entry points ------------------------------------------------------------

    def handle(self, frame: Frame) -> None:
        """Process one frame from the client."""
        if self.closed:
            return
        try:
            handler = self._handlers.get(frame.command)
            if handler is None:
                raise ProtocolError(f"unknown command {frame.command}", BAD_COMMAND)
            if not self.connected and handler != self.on_connect:
                raise ProtocolError(f"{frame.command} before CONNECT", ILLEGAL_COMMAND)
            handler(frame)
        except ProtocolError as exc:
            self.error(exc.title, frame, str(exc))
        except BadRequest as exc:
            self.error(str(exc), frame)
        except (FanoutFailed, QueueFull) as exc:
            log.warning("session %s: %s", self.id, exc)
            self.error(str(exc), frame)
        except (gearman.GearmanError, *REDIS_ERRORS) as exc:
            log.warning("session %s: %s failed: %s", self.id, frame.command, exc)
            self.error(f"service unavailable: {exc}", frame)

    def handle_frames(self, frames: list[Frame]) -> None:
        """Process frames read together; consecutive SENDs to one destination
        go to Gearman as one batch (one round trip), in order, each still
        answered with its own receipt."""
        batch: list[Frame] = []
        size = 0
        for frame in frames:
            if self.closed:
                return
            if self._joins(batch, size, frame):
                batch.append(frame)
                size += len(frame.body)
                continue
            self._flush(batch)
            batch, size = [], 0
            if self._joins(batch, size, frame):
                batch, size = [frame], len(frame.body)
            else:
                self.handle(frame)
        self._flush(batch)

    def _joins(self, batch: list[Frame], size: int, frame: Frame) -> bool:
        if (not self.connected or frame.command != "SEND" or "transaction" in frame.headers
                or len(batch) >= MAX_BATCH):
            return False
        dest = frame.headers.get("destination", "")
        if not plain(frame):
            return False
        if batch:
            return dest == batch[0].headers["destination"] and \
                size + len(frame.body) <= self.settings.max_payload_bytes
        return dest.startswith(("/queue/", "/topic/")) and not dest.endswith("*")

    def _flush(self, batch: list[Frame]) -> None:
        if len(batch) <= 1:
            for frame in batch:
                self.handle(frame)
            return
        if self.closed:
            return
        try:
            dest = parse_destination(batch[0].headers["destination"])
            self._check_send(dest)
            bodies = [f.body for f in batch]
            if dest.kind == "queue":
                self.broker.send_to_queue(self.gearman, dest.name, bodies)
            else:
                self.broker.publish(self.gearman, dest.name, bodies)
        except ProtocolError as exc:
            self.error(exc.title, batch[0], str(exc))
            return
        except (BadRequest, FanoutFailed, QueueFull) as exc:
            self.error(str(exc), batch[0])
            return
        except (gearman.GearmanError, *REDIS_ERRORS) as exc:
            self.error(f"service unavailable: {exc}", batch[0])
            return
        for frame in batch:
            self._receipt(frame)

    def error(self, message: str, frame: Frame | None = None, detail: str = "") -> None:
        """Send ERROR (with ``message``) and close the connection."""
        if self.closed:
            return
        headers = {"message": message.replace("\n", " ")[:1000], "content-type": "text/plain"}
        if frame is not None and "receipt" in frame.headers:
            headers["receipt-id"] = frame.headers["receipt"]
        body = (detail or message).encode()
        self.transport.send(encode("ERROR", headers, body, self.version))
        log.info("session %s: ERROR %s%s", self.id, message,
                 f" ({detail})" if detail and detail != message else "")
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
                self._end(sub, remove=False)
            except (*REDIS_ERRORS, gearman.GearmanError) as exc:
                log.warning("session %s: cleanup of %s failed: %s", self.id, sub.id, exc)
        self.subscriptions.clear()
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
        principal = self.broker.authenticate(frame.get("login"), frame.get("passcode"))
        if principal is None:
            # Never the passcode, in the ERROR or the log.
            raise ProtocolError("access refused: unknown login, wrong passcode, or no "
                                "login where anonymous access is not allowed", BAD_CONNECT)
        self.principal = principal
        cx, cy = heartbeat_header(frame.get("heart-beat", "0,0"))
        sx, sy = self.settings.heartbeat_send_ms, self.settings.heartbeat_receive_ms
        self.heartbeat = (max(sx, cy) if sx and cy else 0, max(cx, sy) if cx and sy else 0)
        self.client_name = frame.get("client-id", "")
        headers = {"session": self.id, "server": SERVER_NAME}
        if self.version != "1.0":
            headers.update({"version": self.version, "heart-beat": f"{sx},{sy}"})
        self.connected = True
        self.transport.send(encode("CONNECTED", headers, b"", self.version))

    # -- SEND --------------------------------------------------------------------

    def on_send(self, frame: Frame) -> None:
        require(frame, "destination")
        if self._in_transaction(frame):
            return
        extra = self._send(frame)
        self._receipt(frame, extra)

    def _send(self, frame: Frame) -> dict[str, str]:
        dest = parse_destination(frame.headers["destination"])
        if len(frame.body) > self.settings.max_payload_bytes:
            raise ProtocolError(f"message body is {len(frame.body)} bytes, over the limit of "
                                f"{self.settings.max_payload_bytes} bytes")
        if dest.kind == "control":
            self._check(self.principal.may_read, f"/{dest.target}/{dest.name}", "read")
            return self._control(dest)
        if dest.kind == "topic" and dest.name.endswith("*"):
            raise ProtocolError("cannot send to a wildcard topic", INVALID_DESTINATION)
        self._check_send(dest)
        try:
            options = send_options(frame.headers)
        except BadRequest as exc:
            raise ProtocolError(str(exc), INVALID_HEADER) from None
        reply_queue = None
        if options.temp_reply is not None:
            reply_queue = self._temp_queue(options.temp_reply)
            options = SendOptions(options.priority, options.delay,
                                  {**options.headers, "reply-to": f"/queue/{reply_queue}"})
        if dest.kind == "topic":
            self.broker.publish(self.gearman, dest.name, [frame.body], options)
        elif reply_queue is not None and options.delay is None:
            if self.pending_requests >= self.settings.max_pending_requests:
                raise ProtocolError(f"more than {self.settings.max_pending_requests} requests "
                                    "waiting for their reply on one connection")
            self.pending_requests += 1
            self.broker.request(dest.name, frame.body, options, reply_queue,
                                self._request_done)
        else:
            self.broker.send_to_queue(self.gearman, dest.name, [frame.body], options)
        return {}

    def _check_send(self, dest: Destination) -> None:
        """May this connection SEND to ``dest`` (a queue or topic)?"""
        if dest.kind == "queue" and dest.name.startswith(TEMP_FUNCTION_PREFIX):
            # A reply needs no right (only its reply-to names the queue), but the
            # queue must be live: no one makes queues of their own this way.
            if not self.broker.temp_queue_exists(dest.name):
                raise ProtocolError(f"no temporary queue {dest.name[:80]!r} (its connection "
                                    "is gone, or it never existed)")
        else:
            self._check(self.principal.may_write, f"/{dest.kind}/{dest.name}", "send to")

    def _check(self, allowed: Callable[[str], bool], destination: str, what: str) -> None:
        if not allowed(destination):
            raise ProtocolError(f"access refused: {self.principal.name} may not {what} "
                                f"{destination}", ACCESS_REFUSED)

    def _request_done(self) -> None:
        self.pending_requests -= 1

    def _temp_queue(self, name: str) -> str:
        """The Gearman function behind this connection's ``/temp-queue/NAME``,
        made (with its implicit auto-ack subscription) on first use. RabbitMQ's
        convention: the subscription id is ``/temp-queue/NAME``."""
        sub_id = TEMP_QUEUE + name
        sub = self.subscriptions.get(sub_id)
        if sub is None:
            if len(self.subscriptions) >= self.settings.max_subscriptions:
                raise ProtocolError(f"more than {self.settings.max_subscriptions} "
                                    "subscriptions on one connection")
            function = validate_queue(temp_queue(self.id, name))
            sub = StompSubscription(self, sub_id, f"/queue/{function}", "auto",
                                    self.settings.auto_ack_window, None)
            sub.function, sub.temporary = function, True
            self.broker.temp_queue_opened(function)
            self.subscriptions[sub_id] = sub
            sub.dispatcher = self.broker.attach(function, sub, shared=False)
        return sub.function

    def _control(self, dest: Destination) -> dict[str, str]:
        if dest.control == "count-msgs":
            return {"num-messages": str(self.broker.count_messages(dest.name))}
        if dest.target == "queue":
            return {"num-subscribers": str(self.broker.count_queue_subscribers(dest.name))}
        return {"num-subscribers": str(self.broker.count_topic_subscribers(dest.name))}

    # -- SUBSCRIBE / UNSUBSCRIBE -------------------------------------------------

    def on_subscribe(self, frame: Frame) -> None:
        destination = require(frame, "destination")
        sub_id = frame.get("id") or (destination if self.version == "1.0" else None)
        if sub_id is None:
            raise ProtocolError("SUBSCRIBE needs an id header", MISSING_HEADER)
        if sub_id in self.subscriptions:
            raise ProtocolError(f"subscription id {sub_id!r} is already in use",
                                DUPLICATED_SUBSCRIPTION)
        if len(self.subscriptions) >= self.settings.max_subscriptions:
            raise ProtocolError(f"more than {self.settings.max_subscriptions} subscriptions "
                                "on one connection")
        dest = parse_destination(destination)
        if dest.kind == "control":
            raise ProtocolError("cannot subscribe to a control destination",
                                INVALID_DESTINATION)
        if dest.kind == "queue" and dest.name.startswith(TEMP_FUNCTION_PREFIX):
            raise ProtocolError("a temporary queue belongs to the connection that made it: "
                                "use reply-to:/temp-queue/NAME on SEND", INVALID_DESTINATION)
        self._check(self.principal.may_read, f"/{dest.kind}/{dest.name}", "subscribe to")
        ack = frame.get("ack", "auto")
        if ack not in ACK_MODES:
            raise ProtocolError(f"unknown ack mode {ack!r}: use auto, client or client-individual",
                                INVALID_HEADER)
        sub = StompSubscription(self, sub_id, destination, ack, prefetch(frame, ack, self.settings),
                                ack_timeout(frame))
        if dest.kind == "topic":
            self._subscribe_topic(sub, dest.name, frame)
        else:
            sub.function = dest.name
            limits = _limits(frame)
            if limits is not None:
                self.broker.bound_queue(sub.function, limits)
        self.subscriptions[sub_id] = sub
        sub.dispatcher = self.broker.attach(sub.function, sub, sub.shared)
        self.broker.record(Event.ATTACHED, sub.function)
        self._receipt(frame)

    def _subscribe_topic(self, sub: StompSubscription, pattern: str, frame: Frame) -> None:
        name = frame.get("activemq.subscriptionName")
        if name is None and (boolean(frame, "durable", False)
                             or boolean(frame, "persistent", False)):
            name = sub.id  # RabbitMQ names a durable subscription by its id
        if name is not None:
            owner = self.client_name or ""
            sub.client_id = durable_client_id(f"{owner}:{pattern}:{name}")
            sub.durable = True
        else:
            sub.client_id = "s" + uuid.uuid4().hex[:20]
        limits = _limits(frame)
        sub.pattern = pattern
        sub.function = queue_name(pattern, sub.client_id)
        self.broker.subscribe_topic(pattern, sub.client_id, sub.durable, limits)

    def on_unsubscribe(self, frame: Frame) -> None:
        sub_id = frame.get("id")
        if sub_id is None and self.version == "1.0":
            sub_id = frame.get("destination")
        if sub_id is None:
            raise ProtocolError("UNSUBSCRIBE needs an id header", MISSING_HEADER)
        sub = self.subscriptions.pop(sub_id, None)
        if sub is None:
            raise ProtocolError(f"no subscription with id {sub_id!r}", NO_SUBSCRIPTION)
        remove = boolean(frame, "durable", False) or "activemq.subscriptionName" in frame.headers
        self._end(sub, remove=remove or not sub.durable)
        self._receipt(frame)

    def _end(self, sub: StompSubscription, remove: bool) -> None:
        """Stop a subscription; ``remove`` also deletes its topic registration."""
        sub.closed = True
        if sub.pattern is not None and (remove or not sub.durable):
            # First stop new copies, then hand back what we hold.
            self.broker.unsubscribe_topic(sub.pattern, sub.client_id)
        unacked = list(sub.unacked.values())
        for message_id in sub.unacked:
            self.acks.pop(message_id, None)
        sub.unacked.clear()
        if sub.dispatcher is not None:
            forgotten = not sub.shared or (sub.pattern is not None and remove)
            sub.dispatcher.remove(sub, unacked, give_back=not forgotten)
            if forgotten and not sub.dispatcher.consumers:
                self.broker.drop_queue(sub.function)
        if sub.temporary:
            self.broker.temp_queue_closed(sub.function)

    # -- delivery ----------------------------------------------------------------

    def backlogged(self) -> bool:
        return self.transport.backlog >= self.settings.max_backlog

    def settled(self, message_id: str) -> None:
        self.acks.pop(message_id, None)

    def deliver(self, sub: StompSubscription, delivery: Delivery) -> None:
        message_id = f"{self.id}-{next(self._counter)}"
        delivery.message_id = message_id
        data = self._message(sub, delivery, message_id)
        self.broker.record(Event.DELIVERED, sub.function, delivery.unique, delivery.redelivered)
        if sub.ack == "auto":
            sub.in_flight += 1

            def sent() -> None:
                sub.in_flight -= 1
                delivery.ack()
                self.broker.record(Event.ACKED, sub.function, delivery.unique)

            def dropped() -> None:
                sub.in_flight -= 1
                delivery.nack()

            self.transport.send(data, sent, dropped)
        else:
            sub.unacked[message_id] = delivery
            self.acks[message_id] = sub
            self.transport.send(data)

    def _message(self, sub: StompSubscription, delivery: Delivery, message_id: str) -> bytes:
        ack = sub.ack != "auto" and self.version == "1.2"
        if not delivery.headers:
            if sub.prefix is None:
                sub.prefix = message_prefix(sub.id, sub.destination, self.version)
            return message_frame(sub.prefix, message_id, delivery.deliveries,
                                 delivery.redelivered, ack, delivery.body)
        headers = {**delivery.headers, "subscription": sub.id, "message-id": message_id,
                   "destination": delivery.headers.get("destination", sub.destination),
                   "delivery-count": str(delivery.deliveries),
                   "redelivered": "true" if delivery.redelivered else "false"}
        if ack:
            headers["ack"] = message_id
        return encode("MESSAGE", headers, delivery.body, self.version)

    # -- ACK / NACK --------------------------------------------------------------

    def on_ack(self, frame: Frame) -> None:
        self._settle(frame)

    def on_nack(self, frame: Frame) -> None:
        # Not in STOMP 1.0, but RabbitMQ and ActiveMQ take it there too.
        self._settle(frame)

    def _settle(self, frame: Frame) -> None:
        settle_target(frame, self.version)  # a missing id is an error now, not at COMMIT
        boolean(frame, "requeue", True)  # so is a requeue that is not true or false
        if self._in_transaction(frame):
            return
        self._apply_settle(frame)
        self._receipt(frame)

    def _apply_settle(self, frame: Frame) -> None:
        message_id = settle_target(frame, self.version)
        sub = self.acks.get(message_id)
        if sub is None:
            # Already settled, or taken back after its ack-timeout: nothing to do.
            log.debug("session %s: ack for unknown message %s", self.id, message_id)
            return
        settled = sub.take(message_id)
        for delivery in settled:
            self.acks.pop(delivery.message_id, None)
        if frame.command == "ACK":
            for delivery in settled:
                delivery.ack()
                self.broker.record(Event.ACKED, sub.function, delivery.unique)
        elif not boolean(frame, "requeue", True):
            sub.dispatcher.reject(settled)
        else:
            sub.dispatcher.give_back(settled)

    # -- transactions ------------------------------------------------------------

    def _in_transaction(self, frame: Frame) -> bool:
        """Held for COMMIT; its RECEIPT comes when COMMIT made it take effect."""
        return self.transactions.hold(frame)

    def on_begin(self, frame: Frame) -> None:
        self.transactions.begin(require(frame, "transaction"))
        self._receipt(frame)

    def on_commit(self, frame: Frame) -> None:
        frames = self.transactions.end(require(frame, "transaction"))
        for queued in frames:  # in order; a failure ends the connection there
            extra = None
            if queued.command == "SEND":
                extra = self._send(queued)
            else:
                self._apply_settle(queued)
            self._receipt(queued, extra)
        self._receipt(frame)

    def on_abort(self, frame: Frame) -> None:
        tx = require(frame, "transaction")
        for queued in self.transactions.end(tx):
            self._receipt(queued, {"transaction-aborted": tx})  # discarded, and said so
        self._receipt(frame)

    # -- DISCONNECT --------------------------------------------------------------

    def on_disconnect(self, frame: Frame) -> None:
        self._receipt(frame)
        self.close()

    def _receipt(self, frame: Frame, extra: dict[str, str] | None = None) -> None:
        receipt = frame.get("receipt")
        if receipt is not None:
            headers = {"receipt-id": receipt, **(extra or {})}
            self.transport.send(encode("RECEIPT", headers, b"", self.version))


def _limits(frame: Frame) -> Limits | None:
    """RabbitMQ's queue arguments on a SUBSCRIBE: x-max-length and the rest
    (gearhorn/limits.py)."""
    try:
        return limits_from_headers(frame.headers)
    except BadRequest as exc:
        raise ProtocolError(str(exc), INVALID_HEADER) from None
