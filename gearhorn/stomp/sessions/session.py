"""One STOMP connection's protocol state, independent of the transport.

The session only calls ``transport.send(bytes, on_sent, on_dropped, inline)`` and
``transport.close()``, so tests drive it without sockets. Frames are
dispatched by command to ``on_<command>`` methods. Every protocol violation
ends in an ERROR frame with a ``message`` header, then the connection closes.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from gearhorn import gearman
from gearhorn.errors import BadRequest
from gearhorn.rules.auth import OPEN
from gearhorn.stomp.protocol.batching import send_batches
from gearhorn.stomp.protocol.exchanges import TOPIC_EXCHANGE, canonical
from gearhorn.stomp.protocol.frames import Frame, encode
from gearhorn.stomp.protocol.rules import (
    ACCESS_REFUSED,
    BAD_COMMAND,
    BAD_CONNECT,
    ILLEGAL_COMMAND,
    SERVER_NAME,
    SUPPORTED_VERSIONS,
    ProtocolError,
    SessionSettings,
    Transactions,
    boolean,
    heartbeats,
    negotiate_version,
    require,
    settle_target,
    version_error,
)
from gearhorn.stomp.queues.bounds import QueueFull
from gearhorn.stomp.queues.publisher import FanoutFailed
from gearhorn.stomp.sessions.backend import Backend, Transport
from gearhorn.stomp.sessions.sends import REFUSALS, Sends
from gearhorn.stomp.sessions.subscriptions import Subscriptions
from gearhorn.store.fsync import FsyncFailed

log = logging.getLogger(__name__)

# Frames that need not wait for the topic SENDs in flight (gearhorn/stomp/sessions/outbox.py).
_BESIDE_SENDS = frozenset({"SEND", "ACK", "NACK"})

class Session:
    """Protocol state of one STOMP connection: the frames in, CONNECT,
    transactions and RECEIPTs; its SENDs (gearhorn/stomp/sessions/sends.py) and its
    subscriptions (gearhorn/stomp/sessions/subscriptions.py) are collaborators."""

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
        self.transactions = Transactions(self.settings.max_transaction_frames)
        self.subs = Subscriptions(self)  # SUBSCRIBE, UNSUBSCRIBE, deliveries, acks
        self.subscriptions = self.subs.by_id
        self.acks = self.subs.acks
        self._gearman: gearman.Client | None = None
        self.sends = Sends(self)  # and its outbox: the topic SENDs in flight
        self._handlers = {
            "CONNECT": self.on_connect, "STOMP": self.on_connect, "SEND": self.sends.on_send,
            "SUBSCRIBE": self.subs.subscribe, "UNSUBSCRIBE": self.subs.unsubscribe,
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
        except REFUSALS as exc:
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
        go to Gearman as one batch (gearhorn/stomp/protocol/batching.py)."""
        for frame in frames:
            _name_topics_as_topics(frame)
        for group in send_batches(frames, self.settings.max_payload_bytes):
            if self.closed:
                return
            if len(group) > 1 and self.connected:
                self.sends.batch(group)
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
        # Logged first: the ERROR may leave at once (gearhorn/stomp/transport/server.py),
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
        self.subs.end_all()
        self.sends.outbox.flush()  # what was read before the socket went still goes out
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
        self.sends.outbox.flush()
        return not self.closed

    def check(self, allowed: Callable[[str], bool], destination: str, what: str) -> None:
        if not allowed(destination):
            raise ProtocolError(f"access refused: {self.principal.name} may not {what} "
                                f"{destination}", ACCESS_REFUSED)

    # -- ACK / NACK --------------------------------------------------------------

    def _settle(self, frame: Frame) -> None:
        settle_target(frame, self.version)  # a missing id is an error now, not at COMMIT
        boolean(frame, "requeue", True)  # so is a requeue that is not true or false
        if self.transactions.hold(frame):
            return
        self.subs.settle(frame)
        self.receipt(frame)

    def temp_queue(self, name: str) -> str:
        """The Gearman function behind ``/temp-queue/NAME`` (a SEND's reply-to)."""
        return self.subs.temp_queue(name)

    def on_disk(self, frames: list[Frame]) -> None:
        """The RECEIPTs of ``frames`` wait for an fsync that covers them."""
        self.sends.on_disk(frames)

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
                self.subs.settle(queued)
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
