"""Job payloads: parsing, validation, naming rules and error texts.

Pure functions only (no sockets, no Redis), so every rule is unit tested.

Naming rules (docs/design/index.rst):
- topic and client id: printable ASCII without whitespace, 1..128 bytes;
- a client id has no ``_``, so ``<topic>_<client_id>`` splits at the last ``_``;
- a topic has no ``*``; a subscription topic may *end* with one ``*``, which
  makes it a prefix subscription (``news.*`` receives ``news.sports``).
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from gearhorn.errors import BadRequest
from gearhorn.rules.fanoutoptions import (
    Answering,
    parse_answering,
    parse_priority,
    parse_schedule,
)
from gearhorn.rules.limits import Limits, limits_from_job
from gearhorn.rules.naming import (
    MAX_UNIQUE_BYTES,
    STREAM_CLIENT_MARK,
    given_message_ids,
    message_ids_for,
    shorten,
)

MAX_NAME_BYTES = 128
# gearmand 1.1.20 answers ERROR ARGUMENT_TOO_LARGE to a unique key over 64
# bytes, and a key of exactly 64 comes back to the worker cut to 63 bytes with
# a NUL that lands in front of the job's data (measured). So 63 at most.
DEFAULT_MAX_PAYLOAD = 1024 * 1024
# A job bigger than this multiple of the payload limit is refused before
# json.loads, so a huge job never costs its parse (JSON escaping can at most
# sextuple a string: "\u0000").
_RAW_FACTOR = 6
_RAW_SLACK = 4096

_NAME = re.compile(rf"[!-~]{{1,{MAX_NAME_BYTES}}}")  # printable, no space
_QUEUE = re.compile(rf"[!-~]{{1,{2 * MAX_NAME_BYTES + 1}}}")
PREFIX_WILDCARD = "*"
# A producer's message id: ``dedup_id`` in a fanout, this header on a STOMP
# SEND (the name RabbitMQ's message-deduplication plugin reads). Long enough
# for a SHA-256 in hex; it is a Redis key, never a Gearman unique key.
DEDUP_HEADER = "x-deduplication-header"
MAX_DEDUP_ID = 200


@dataclass(frozen=True, slots=True)
class Subscription:
    """A ``subscribe_fanout`` / ``unsubscribe_fanout`` request."""

    topic: str
    client_id: str
    # Limits given with the request (gearhorn/rules/limits.py); None: keep the ones
    # it has, or the defaults. Not part of what makes two subscriptions equal.
    limits: Limits | None = field(default=None, compare=False)
    # Where it was made, for presence: a STOMP bridge's id ("": by a
    # subscribe_fanout job), and whether it outlives its connection.
    bridge: str = field(default="", compare=False)
    durable: bool = field(default=False, compare=False)

    @property
    def is_prefix(self) -> bool:
        return self.topic.endswith(PREFIX_WILDCARD)


@dataclass(frozen=True, slots=True)
class PresenceQuery:
    """A ``topic_presence`` request: a page of a topic's subscribers."""

    topic: str
    limit: int = 1000
    cursor: int = 0


# A topic_presence or topic_history page at most.
MAX_PAGE = 10_000


@dataclass(frozen=True, slots=True)
class HistoryQuery:
    """A ``topic_history`` request: messages after offset ``since``."""

    topic: str
    since: int = 0
    limit: int = 100
    epoch: str | None = None


@dataclass(frozen=True, slots=True)
class Fanout:
    """A ``fanout`` request; each of ``bodies`` is one message, copied to every
    subscriber in order."""

    topic: str
    bodies: tuple[bytes, ...]
    unique: str | None
    background: bool
    priority: str = "normal"  # Gearman precedence of every copy
    deliver_at: float | None = None  # epoch seconds; None = now
    headers: dict[str, str] = field(default_factory=dict)  # for STOMP consumers
    # The producer's id of this message: the same again within dedup_window
    # is a duplicate (gearhorn/store/dedup.py).
    dedup_id: str | None = None
    # Already in the topic's history: the bridge appended it itself, so its
    # stream subscribers need not wait for a worker (gearhorn/stomp/queues/publisher.py).
    in_history: bool = False
    # The messages' ids, when the sender named them (the bridge, for what it
    # appended); else they derive from the job's unique key (naming.py).
    message_ids: tuple[str, ...] = ()
    # Foreground: the tries of a copy, and whether answers are gathered.
    answering: Answering = Answering()

    @property
    def data(self) -> bytes:
        """The body of a single-message fanout."""
        return self.bodies[0]

    def ids(self, job_unique: str) -> list[str]:
        """The ids the sender gave the messages, else ids derived from the
        JSON ``unique`` (the same message, as Gearman coalesces it), else from
        the job's unique key: either way the same when the job runs again."""
        if self.message_ids:
            return list(self.message_ids)
        if self.unique:
            return message_ids_for(f"{self.topic}/{self.unique}", len(self.bodies))
        return message_ids_for(job_unique, len(self.bodies))


def validate_topic(topic: object, *, allow_prefix: bool = False) -> str:
    """Return ``topic`` if it is a valid topic name, else raise BadRequest."""
    name = _validate_name("topic", topic)
    body = name[:-1] if allow_prefix and name.endswith(PREFIX_WILDCARD) else name
    if PREFIX_WILDCARD in body:
        where = "only as the last character of a subscription" if allow_prefix else "in a topic"
        raise BadRequest(f"invalid topic {name!r}: '*' is allowed {where}")
    return name


def validate_client_id(client_id: object) -> str:
    """Return ``client_id`` if valid, else raise BadRequest."""
    name = _validate_name("client_id", client_id)
    if "_" in name:
        raise BadRequest(
            f"invalid client_id {name!r}: '_' is not allowed "
            "(copies go to <topic>_<client_id>, split at the last '_')"
        )
    if name.startswith(STREAM_CLIENT_MARK):
        raise BadRequest(f"invalid client_id {name!r}: a leading {STREAM_CLIENT_MARK!r} is "
                         "kept for the bridge's stream subscriptions")
    return name


def _validate_name(field: str, value: object) -> str:
    if not isinstance(value, str):
        raise BadRequest(f"{field} must be a string, not {_json_type(value)}")
    if not _NAME.fullmatch(value):
        raise BadRequest(
            f"invalid {field} {shorten(value)}: use 1 to {MAX_NAME_BYTES} printable "
            "ASCII characters without whitespace"
        )
    return value


def validate_queue(name: object) -> str:
    """A Gearman function name a STOMP client may send to or work (``/queue/Q``)."""
    if not isinstance(name, str) or not _QUEUE.fullmatch(name):
        raise BadRequest(f"invalid queue name {shorten(str(name))}: use 1 to "
                         f"{2 * MAX_NAME_BYTES + 1} printable ASCII characters without whitespace")
    return name


def parse_subscription(data: bytes) -> Subscription:
    """Parse a ``{"topic": T, "client_id": C}`` job payload."""
    obj = _load_object(data, limit=_RAW_SLACK)
    topic = validate_topic(_require(obj, "topic"), allow_prefix=True)
    client_id = validate_client_id(_require(obj, "client_id"))
    return Subscription(topic, client_id, limits_from_job(obj))


def parse_presence(data: bytes) -> PresenceQuery:
    """Parse ``{"topic": T, "limit"?: N, "cursor"?: C}``: up to about N client
    ids from C on (0: the first page; the answer's ``cursor`` is the next)."""
    obj = _load_object(data, limit=_RAW_SLACK)
    topic = validate_topic(_require(obj, "topic"), allow_prefix=True)
    return PresenceQuery(topic, _whole(obj, "limit", 1000, 1, MAX_PAGE),
                         _whole(obj, "cursor", 0, 0))


def parse_history(data: bytes) -> HistoryQuery:
    """Parse ``{"topic": T, "since"?: N, "limit"?: N, "epoch"?: E}``."""
    obj = _load_object(data, limit=_RAW_SLACK)
    topic = validate_topic(_require(obj, "topic"))
    epoch = obj.get("epoch")
    if epoch is not None and not isinstance(epoch, str):
        raise BadRequest(f"epoch must be a string, not {_json_type(epoch)}")
    return HistoryQuery(topic, _whole(obj, "since", 0, 0),
                        _whole(obj, "limit", 100, 1, MAX_PAGE), epoch)


def _whole(obj: dict, key: str, default: int, least: int, most: int | None = None) -> int:
    """``obj[key]``, a whole number from ``least`` (to ``most``), else BadRequest."""
    value = obj.get(key, default)
    if type(value) is not int or value < least or (most is not None and value > most):
        span = f"from {least}" if most is None else f"from {least} to {most}"
        raise BadRequest(f"{key} must be a whole number {span}, got {json.dumps(value)[:40]}")
    return value


def presence_event(prefix: str, sub: Subscription, joined: bool, at: float) -> bytes | None:
    """The background ``fanout`` job telling ``<prefix><topic>`` that ``sub``
    joined or left; None when that topic would not be a valid name (a prefix
    subscription's pattern, or a topic too long for the prefix)."""
    try:
        topic = validate_topic(prefix + sub.topic)
    except BadRequest:
        return None
    event = {"event": "join" if joined else "leave", "topic": sub.topic,
             "client_id": sub.client_id, "via": "stomp" if sub.bridge else "gearman",
             "bridge": sub.bridge, "durable": sub.durable, "at": at}
    return fanout_job(topic, [encode_payload(event)])


def fanout_job(topic: str, bodies: Sequence[bytes], *, background: bool = True,
               priority: str = "normal", delay: float | None = None,
               deliver_at: float | str | None = None, headers: dict[str, str] | None = None,
               unique: str | None = None, dedup_id: str | None = None,
               message_ids: Sequence[str] | None = None) -> bytes:
    """A ``fanout`` job as :func:`parse_fanout` reads it: the one encoder (the
    bridge, the Python client, presence events). Text bodies travel as they
    are, others in base64; several as a list; ``message_ids``: the bridge
    appended them to the topic's history already."""
    job: dict[str, object] = {"topic": topic, "background": background}
    try:
        texts = [body.decode("utf-8") for body in bodies]
        job.update({"payload": texts[0]} if len(texts) == 1 else {"payloads": texts})
    except UnicodeDecodeError:
        coded = [base64.b64encode(body).decode() for body in bodies]
        job.update({"payload_base64": coded[0]} if len(coded) == 1 else {"payloads_base64": coded})
    optional = {"priority": None if priority == "normal" else priority, "delay": delay,
                "deliver_at": deliver_at, "headers": headers or None, "unique": unique,
                "dedup_id": dedup_id}
    job.update({k: v for k, v in optional.items() if v is not None})
    if message_ids is not None:
        job.update(in_history=True, message_ids=list(message_ids))
    return json.dumps(job).encode()


def parse_fanout(data: bytes, max_payload: int = DEFAULT_MAX_PAYLOAD,
                 now: float | None = None) -> Fanout:
    """Parse a ``{"topic": T, "payload": P, "unique"?: U, "background"?: B}`` payload.

    Optional too: ``priority`` (high, normal, low), ``deliver_at`` (epoch
    seconds or RFC 3339) or ``delay`` (seconds), ``headers`` (an object
    of strings that STOMP consumers receive; Gearman consumers get the
    payload alone), and ``dedup_id`` (the producer's id of the message;
    the header ``x-deduplication-header`` stands for it).

    Instead of ``payload``: ``payload_base64`` (bytes that are not UTF-8
    text), or ``payloads`` / ``payloads_base64``, a list of up to
    ``MAX_BATCH`` messages fanned out in order by one job (the STOMP bridge
    batches a producer's consecutive SENDs so). ``max_payload`` bounds the
    bytes of all messages of the job together.
    """
    obj = _load_object(data, limit=max_payload * _RAW_FACTOR + _RAW_SLACK,
                       payload_limit=max_payload)
    topic = validate_topic(_require(obj, "topic"))
    bodies = _bodies(obj)
    size = sum(len(b) for b in bodies)
    if size > max_payload:
        what = "payload is" if len(bodies) == 1 else f"{len(bodies)} payloads total"
        raise BadRequest(f"{what} {size} bytes, over max_payload_bytes ({max_payload} bytes)")
    unique = _parse_unique(obj.get("unique"))
    headers = parse_headers(obj.get("headers", {}))
    dedup_id = _parse_unique(obj.get("dedup_id", headers.get(DEDUP_HEADER)), "dedup_id",
                             MAX_DEDUP_ID)
    for name, given in (("unique", unique), ("dedup_id", dedup_id)):
        if given is not None and len(bodies) > 1:
            raise BadRequest(f"{name} applies to one message: not with payloads")
    background = bool(obj.get("background"))
    return Fanout(topic, bodies, unique, background,
                  parse_priority(obj.get("priority", "normal")),
                  parse_schedule(obj.get("deliver_at"), obj.get("delay"), now),
                  headers, dedup_id, obj.get("in_history") is True,
                  given_message_ids(obj.get("message_ids"), len(bodies)),
                  parse_answering(obj, background, len(bodies)))


MAX_HEADERS = 64
MAX_HEADER_BYTES = 8192
MAX_HEADER_NAME = 128  # characters
# Headers a STOMP frame's framing or the bridge owns; a message cannot set them.
RESERVED_HEADERS = frozenset({"content-length", "destination", "message-id", "subscription",
                              "ack", "redelivered", "delivery-count", "receipt", "transaction"})


def parse_headers(value: object) -> dict[str, str]:
    """Headers a STOMP consumer receives with the message: names and values
    are any Unicode text without NUL (STOMP 1.1 and 1.2 escape ``:``, line
    breaks and ``\\``), names 1 to 128 characters; 64 at most, 8 KiB in all."""
    if not isinstance(value, dict):
        raise BadRequest(f"headers must be an object, not {_json_type(value)}")
    if len(value) > MAX_HEADERS:
        raise BadRequest(f"more than {MAX_HEADERS} headers")
    size = 0
    for name, text in value.items():
        if not (isinstance(name, str) and 0 < len(name) <= MAX_HEADER_NAME
                and "\0" not in name):
            raise BadRequest(f"invalid header name {shorten(str(name))}: 1 to "
                             f"{MAX_HEADER_NAME} characters without NUL")
        if name in RESERVED_HEADERS:
            raise BadRequest(f"header {name!r} is set by the bridge, not by a message")
        if not isinstance(text, str) or "\0" in text:
            raise BadRequest(f"header {name!r} must be a string without NUL")
        size += len(name) + len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_HEADER_BYTES:
        raise BadRequest(f"headers are {size} bytes, over the limit of {MAX_HEADER_BYTES}")
    return dict(value)


MAX_BATCH = 1000
_PAYLOAD_KEYS = ("payload", "payload_base64", "payloads", "payloads_base64")


def _bodies(obj: dict) -> tuple[bytes, ...]:
    given = [k for k in _PAYLOAD_KEYS if k in obj]
    if not given:
        raise BadRequest("missing key 'payload'")
    if len(given) > 1:
        raise BadRequest(f"give one of {', '.join(_PAYLOAD_KEYS)}, not {' and '.join(given)}")
    key, value = given[0], obj[given[0]]
    if key == "payload":
        return (encode_payload(value),)
    if key == "payload_base64":
        return (_b64(key, value),)
    if not isinstance(value, list) or not 0 < len(value) <= MAX_BATCH:
        raise BadRequest(f"{key} must be a list of 1 to {MAX_BATCH} messages")
    if key == "payloads":
        return tuple(encode_payload(v) for v in value)
    return tuple(_b64(key, v) for v in value)


def _b64(key: str, value: object) -> bytes:
    if not isinstance(value, str):
        raise BadRequest(f"{key} must hold strings, not {_json_type(value)}")
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise BadRequest(f"{key} is not valid base64") from None


def encode_payload(payload: object) -> bytes:
    """A JSON string travels as its UTF-8 bytes, any other value as JSON text."""
    if isinstance(payload, str):
        return payload.encode("utf-8", "surrogatepass")
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def _parse_unique(unique: object, name: str = "unique",
                  most: int = MAX_UNIQUE_BYTES) -> str | None:
    if unique is None:
        return None
    if not isinstance(unique, str):
        raise BadRequest(f"{name} must be a string, not {_json_type(unique)}")
    if not re.fullmatch(rf"[!-~]{{1,{most}}}", unique):
        raise BadRequest(
            f"invalid {name} {shorten(unique)}: use 1 to {most} printable "
            "ASCII characters without whitespace"
        )
    return unique


def _load_object(data: bytes, *, limit: int, payload_limit: int | None = None) -> dict:
    if len(data) > limit:
        if payload_limit is not None:  # one limit a user knows: the payload's
            raise BadRequest(f"job is {len(data)} bytes: payloads are limited to "
                             f"max_payload_bytes ({payload_limit} bytes)")
        raise BadRequest(f"job is {len(data)} bytes, over the limit of {limit} bytes")
    try:
        obj = json.loads(data.decode("utf-8"), parse_constant=_no_constant,
                         parse_float=_finite_float)
    except UnicodeDecodeError as exc:
        raise BadRequest(f"job is not UTF-8: {exc.reason} at byte {exc.start}") from None
    except json.JSONDecodeError as exc:
        raise BadRequest(f"job is not JSON: {exc.msg} at char {exc.pos}") from None
    except RecursionError:
        raise BadRequest("job is not acceptable JSON: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer of more than 4,300 digits
        raise BadRequest(f"job is not acceptable JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise BadRequest(f"job must be a JSON object, not {_json_type(obj)}")
    return obj


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:20]} is out of range")
    return value


def _require(obj: dict, key: str) -> object:
    if key not in obj:
        raise BadRequest(f"missing key {key!r}")
    return obj[key]


_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
               int: "a number", float: "a number", type(None): "null"}


def _json_type(value: object) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)

