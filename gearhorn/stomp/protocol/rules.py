"""What STOMP frames and destinations mean to the bridge: pure, no I/O.

The versions and ack modes it speaks, its settings per connection, how a
destination and the headers of SUBSCRIBE and CONNECT are read, and the
error a client's mistake becomes.
"""

from __future__ import annotations

from dataclasses import dataclass

from gearhorn.errors import BadRequest
from gearhorn.rules.limits import Limits, limits_from_headers
from gearhorn.rules.messages import DEFAULT_MAX_PAYLOAD, validate_queue, validate_topic
from gearhorn.rules.naming import TEMP_FUNCTION_PREFIX
from gearhorn.stomp.protocol.exchanges import ExchangeError, exchange_topic
from gearhorn.stomp.protocol.frames import Frame, encode
from gearhorn.stomp.protocol.sendheaders import SendOptions, send_options

SUPPORTED_VERSIONS = ("1.0", "1.1", "1.2")
ACK_MODES = ("auto", "client", "client-individual")
SERVER_NAME = "gearhorn/0.1.0"


# The ERROR ``message`` of a kind of mistake, in the words RabbitMQ's STOMP
# plugin uses (what people grep their logs for); the detail goes in the body.
# docs/stomp.rst has the table.
MISSING_HEADER = "Missing header"
MISSING_DESTINATION = "Missing destination"
# RabbitMQ's capital H for a durable SUBSCRIBE without an id (its suite checks it).
MISSING_ID_FOR_DURABLE = "Missing Header"
INVALID_HEADER = "Invalid header"
INVALID_DESTINATION = "Invalid destination"
UNKNOWN_DESTINATION = "Unknown destination"
BAD_CONNECT = "Bad CONNECT"
ACCESS_REFUSED = "Access refused"
BAD_COMMAND = "Bad command"
ILLEGAL_COMMAND = "Illegal command"
DUPLICATED_SUBSCRIPTION = "Duplicated subscription identifier"
NO_SUBSCRIPTION = "No subscription found"
BAD_TRANSACTION = "Bad transaction"


class ProtocolError(Exception):
    """A client broke the protocol: ERROR with ``title`` as its ``message``
    (the detail itself when there is no common wording) and the detail as
    its body."""

    def __init__(self, detail: str, title: str | None = None) -> None:
        super().__init__(detail)
        self.title = title or detail


@dataclass(frozen=True)
class SessionSettings:
    heartbeat_send_ms: int = 10_000  # what the bridge offers to send
    heartbeat_receive_ms: int = 10_000  # what it asks the client to send
    max_subscriptions: int = 100
    max_transaction_frames: int = 10_000
    auto_ack_window: int = 256  # messages in flight to an auto-ack subscription
    max_backlog: int = 1024 * 1024  # bytes queued to a slow client before we stop
    max_prefetch: int = 100_000
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD  # a SEND's body at most
    # Requests (SEND with a temp reply-to) awaiting their answer: each holds a
    # gearmand connection, so a flood must not exhaust the bridge's sockets.
    max_pending_requests: int = 100


@dataclass(frozen=True, slots=True)
class Destination:
    kind: str  # queue, topic, control
    name: str
    control: str = ""  # count-msgs, count-subscribers
    target: str = ""  # queue or topic, for control destinations


def parse_destination(text: str) -> Destination:
    """``/queue/Q``, ``/topic/T``, ``/control/count-msgs/queue/Q`` and the like;
    RabbitMQ's ``/exchange/amq.topic/K`` and kin name topics (exchanges.py)."""
    if text == "/exchange" or text.startswith("/exchange/"):
        try:
            text = "/topic/" + exchange_topic(text[len("/exchange"):])
        except ExchangeError as exc:
            raise ProtocolError(str(exc), exc.title) from None
    for kind in ("queue", "topic"):
        if text in (f"/{kind}", f"/{kind}/"):  # RabbitMQ's words for a missing name
            raise ProtocolError(f"'' is not a valid {kind} destination\n", INVALID_DESTINATION)
        prefix = f"/{kind}/"
        if text.startswith(prefix):
            name = text[len(prefix):]
            try:
                if kind == "queue":
                    validate_queue(name)
                else:
                    validate_topic(name, allow_prefix=True)
            except BadRequest as exc:
                raise ProtocolError(str(exc), INVALID_DESTINATION) from None
            return Destination(kind, name)
    parts = text.split("/", 4)
    if (len(parts) == 5 and parts[:2] == ["", "control"]
            and parts[2] in ("count-msgs", "count-subscribers") and parts[3] in ("queue", "topic")
            and not (parts[2] == "count-msgs" and parts[3] == "topic")):
        inner = parse_destination(f"/{parts[3]}/{parts[4]}")
        return Destination("control", inner.name, parts[2], parts[3])
    raise ProtocolError(f"unknown destination {text[:80]!r}: use /queue/NAME or /topic/NAME",
                        UNKNOWN_DESTINATION)


def sendable(frame: Frame, max_payload_bytes: int) -> Destination:
    """A SEND's destination, once its body fits and it names no wildcard topic."""
    dest = parse_destination(frame.headers["destination"])
    if len(frame.body) > max_payload_bytes:
        raise ProtocolError(f"message body is {len(frame.body)} bytes, over "
                            f"max_payload_bytes ({max_payload_bytes} bytes)")
    if dest.kind == "topic" and dest.name.endswith("*"):
        raise ProtocolError("cannot send to a wildcard topic", INVALID_DESTINATION)
    return dest


def options_of(frame: Frame) -> SendOptions:
    """A SEND's priority, delay and headers (gearhorn/stomp/protocol/sendheaders.py)."""
    try:
        return send_options(frame.headers)
    except BadRequest as exc:
        raise ProtocolError(str(exc), INVALID_HEADER) from None


def plain(frame: Frame) -> bool:
    try:
        return send_options(frame.headers).plain
    except BadRequest:
        return False  # handled alone, so its ERROR names it


def require(frame: Frame, header: str) -> str:
    value = frame.get(header)
    if value is None:
        title = MISSING_DESTINATION if header == "destination" else MISSING_HEADER
        raise ProtocolError(f"{frame.command} needs a {header} header", title)
    return value


def boolean(frame: Frame, header: str, default: bool) -> bool:
    """A true/false header in any case (stomp.py writes Python's ``False``);
    anything else is refused rather than read as the default."""
    raw = frame.get(header)
    if raw is None:
        return default
    word = raw.lower()
    if word not in ("true", "false"):
        raise ProtocolError(f"invalid {header} header {raw[:20]!r}: true or false",
                            INVALID_HEADER)
    return word == "true"


def negotiate_version(accept_version: str) -> str | None:
    """The highest version both sides speak, or None."""
    offered = {v.strip() for v in accept_version.split(",")}
    common = [v for v in SUPPORTED_VERSIONS if v in offered]
    return common[-1] if common else None


def version_error() -> bytes:
    """The ERROR for a CONNECT with no version in common: the ``version``
    header the spec asks for, and RabbitMQ's words in the body (its own
    STOMP test suite checks them; the spec gives its wording as an example)."""
    return encode("ERROR", {"version": ",".join(SUPPORTED_VERSIONS),
                            "content-type": "text/plain",
                            "message": "no STOMP version in common"},
                  f"Supported versions are {','.join(SUPPORTED_VERSIONS)}\n".encode(),
                  "1.0")


# Headers the broker sets on a MESSAGE, which a SEND may not carry
# (RabbitMQ refuses these before it looks at the destination).
NOT_ON_SEND = ("message-id",)


def refuse_broker_headers(frame: Frame) -> None:
    """ERROR ``Invalid header`` for a SEND carrying a header only a MESSAGE has."""
    for name in NOT_ON_SEND:
        if name in frame.headers:
            raise ProtocolError(f"'{name}' is not allowed on 'SEND'.\n", INVALID_HEADER)


def settle_target(frame: Frame, version: str) -> str:
    """The message an ACK or NACK names: ``id`` in STOMP 1.2 (the MESSAGE's
    ``ack`` header), ``message-id`` before."""
    header = "id" if version == "1.2" else "message-id"
    value = frame.get(header)
    if value is None:
        raise ProtocolError(f"{frame.command} needs an {header} header (STOMP {version})",
                            MISSING_HEADER)
    return value


def heartbeat_header(value: str) -> tuple[int, int]:
    parts = value.split(",")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ProtocolError(f"invalid heart-beat header {value[:40]!r}", INVALID_HEADER)
    return int(parts[0]), int(parts[1])


def ack_timeout(frame: Frame) -> float | None:
    raw = frame.get("ack-timeout")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= 86_400:
        raise ProtocolError(f"invalid ack-timeout {raw[:20]!r}: seconds, above 0",
                            INVALID_HEADER)
    return value


def prefetch(frame: Frame, ack: str, settings: SessionSettings) -> int:
    """A SUBSCRIBE's ``prefetch-count`` (RabbitMQ) or ``prefetch`` (ocamlmq):
    unacknowledged messages it may hold."""
    raw = frame.get("prefetch-count", frame.get("prefetch"))
    if raw is None:
        return settings.auto_ack_window if ack == "auto" else 1
    if not raw.isdigit() or not 0 < int(raw) <= settings.max_prefetch:
        raise ProtocolError(f"invalid prefetch {raw[:20]!r}: a whole number from 1 to "
                            f"{settings.max_prefetch}", INVALID_HEADER)
    return int(raw)


def subscription_id(frame: Frame, version: str) -> str:
    """A SUBSCRIBE's or UNSUBSCRIBE's id; STOMP 1.0 falls back on the destination."""
    sub_id = frame.get("id") or (frame.get("destination") if version == "1.0" else None)
    if sub_id is None:
        raise ProtocolError(f"{frame.command} needs an id header", MISSING_HEADER)
    return sub_id


def subscribable(destination: str) -> Destination:
    """A SUBSCRIBE's destination: a queue or topic, not a control or temp queue."""
    dest = parse_destination(destination)
    if dest.kind == "control":
        raise ProtocolError("cannot subscribe to a control destination", INVALID_DESTINATION)
    if dest.kind == "queue" and dest.name.startswith(TEMP_FUNCTION_PREFIX):
        raise ProtocolError("a temporary queue belongs to the connection that made it: "
                            "use reply-to:/temp-queue/NAME on SEND", INVALID_DESTINATION)
    return dest


def durable_name(frame: Frame, sub_id: str) -> str | None:
    """The name of a durable topic subscription, None for a plain one:
    ActiveMQ's ``activemq.subscriptionName``, or RabbitMQ's ``durable`` (or
    ``persistent``) ``true``, which names it by its id."""
    name = frame.get("activemq.subscriptionName")
    if name is None and durable_flag(frame):
        if "id" not in frame.headers:  # STOMP 1.0's fallback id would name it by destination
            raise ProtocolError("a durable subscription needs an id header", MISSING_ID_FOR_DURABLE)
        return sub_id
    return name


def durable_flag(frame: Frame) -> bool:
    """RabbitMQ's ``durable: true`` or its older spelling ``persistent: true``."""
    return boolean(frame, "durable", False) or boolean(frame, "persistent", False)


def ack_mode(frame: Frame) -> str:
    ack = frame.get("ack", "auto")
    if ack not in ACK_MODES:
        raise ProtocolError(f"unknown ack mode {ack!r}: use auto, client or client-individual",
                            INVALID_HEADER)
    return ack


def heartbeats(client_header: str, send_ms: int, receive_ms: int) -> tuple[int, int]:
    """(we send every ms, we expect every ms) from the client's ``heart-beat``
    and what we offer; 0 is never."""
    cx, cy = heartbeat_header(client_header)
    return (max(send_ms, cy) if send_ms and cy else 0,
            max(cx, receive_ms) if cx and receive_ms else 0)


def queue_limits(frame: Frame) -> Limits | None:
    """RabbitMQ's queue arguments on a SUBSCRIBE: x-max-length and the rest
    (gearhorn/rules/limits.py)."""
    try:
        return limits_from_headers(frame.headers)
    except BadRequest as exc:
        raise ProtocolError(str(exc), INVALID_HEADER) from None


class Transactions:
    """The frames each open transaction holds until COMMIT or ABORT."""

    def __init__(self, max_frames: int) -> None:
        self.max_frames = max_frames
        self.open: dict[str, list[Frame]] = {}

    def begin(self, tx: str) -> None:
        if tx in self.open:
            raise ProtocolError(f"transaction {tx!r} already begun", BAD_TRANSACTION)
        self.open[tx] = []

    def hold(self, frame: Frame) -> bool:
        """Keep ``frame`` if it names a transaction; False if it names none."""
        tx = frame.get("transaction")
        if tx is None:
            return False
        frames = self.open.get(tx)
        if frames is None:
            raise ProtocolError(f"transaction {tx!r} was not begun", BAD_TRANSACTION)
        if len(frames) >= self.max_frames:
            raise ProtocolError(f"more than {self.max_frames} frames in one transaction")
        frames.append(frame)
        return True

    def end(self, tx: str) -> list[Frame]:
        """COMMIT or ABORT: the frames ``tx`` held, in order."""
        if tx not in self.open:
            raise ProtocolError(f"transaction {tx!r} was not begun", BAD_TRANSACTION)
        return self.open.pop(tx)
