"""Job payloads: parsing, validation, naming rules and error texts.

Pure functions only (no sockets, no Redis), so every rule is unit tested.

Naming rules (DESIGN.md):
- topic and client id: printable ASCII without whitespace, 1..128 bytes;
- a client id has no ``_``, so ``<topic>_<client_id>`` splits at the last ``_``;
- a topic has no ``*``; a subscription topic may *end* with one ``*``, which
  makes it a prefix subscription (``news.*`` receives ``news.sports``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import uuid
from dataclasses import dataclass

MAX_NAME_BYTES = 128
# gearmand answers ERROR ARGUMENT_TOO_LARGE to a unique key over 64 bytes.
MAX_UNIQUE_BYTES = 64
DEFAULT_MAX_PAYLOAD = 1024 * 1024
# A job bigger than this multiple of the payload limit is refused before
# json.loads, so a huge job never costs its parse (JSON escaping can at most
# sextuple a string: "\u0000").
_RAW_FACTOR = 6
_RAW_SLACK = 4096

_NAME = re.compile(rf"[!-~]{{1,{MAX_NAME_BYTES}}}")  # printable, no space
_QUEUE = re.compile(rf"[!-~]{{1,{2 * MAX_NAME_BYTES + 1}}}")
PREFIX_WILDCARD = "*"


class BadRequest(ValueError):
    """A job payload gearhorn refuses; ``str(exc)`` is the one-line reason."""


@dataclass(frozen=True, slots=True)
class Subscription:
    """A ``subscribe_fanout`` / ``unsubscribe_fanout`` request."""

    topic: str
    client_id: str

    @property
    def is_prefix(self) -> bool:
        return self.topic.endswith(PREFIX_WILDCARD)


@dataclass(frozen=True, slots=True)
class Fanout:
    """A ``fanout`` request; each of ``bodies`` is one message, copied to every
    subscriber in order."""

    topic: str
    bodies: tuple[bytes, ...]
    unique: str | None
    background: bool

    @property
    def data(self) -> bytes:
        """The body of a single-message fanout."""
        return self.bodies[0]


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
    return name


def _validate_name(field: str, value: object) -> str:
    if not isinstance(value, str):
        raise BadRequest(f"{field} must be a string, not {_json_type(value)}")
    if not _NAME.fullmatch(value):
        raise BadRequest(
            f"invalid {field} {_shorten(value)}: use 1 to {MAX_NAME_BYTES} printable "
            "ASCII characters without whitespace"
        )
    return value


def validate_queue(name: object) -> str:
    """A Gearman function name a STOMP client may send to or work (``/queue/Q``)."""
    if not isinstance(name, str) or not _QUEUE.fullmatch(name):
        raise BadRequest(f"invalid queue name {_shorten(str(name))}: use 1 to "
                         f"{2 * MAX_NAME_BYTES + 1} printable ASCII characters without whitespace")
    return name


def queue_name(topic: str, client_id: str) -> str:
    """The Gearman function that receives ``client_id``'s copies of ``topic``."""
    return f"{topic}_{client_id}"


def split_queue_name(name: str) -> tuple[str, str]:
    """Inverse of :func:`queue_name`: ``"a_b_c"`` -> ``("a_b", "c")``."""
    topic, sep, client_id = name.rpartition("_")
    if not sep or not topic or not client_id:
        raise BadRequest(f"{_shorten(name)} is not a <topic>_<client_id> queue name")
    return topic, client_id


def copy_unique(base: str, client_id: str) -> str:
    """The Gearman unique key of one copy: ``<base>:<client_id>``.

    Keys over gearmand's 64-byte limit become a SHA-256 digest of the same
    text, so the key stays deterministic (coalescing still works) and valid.
    """
    key = f"{base}:{client_id}"
    if len(key) <= MAX_UNIQUE_BYTES:
        return key
    return "h:" + hashlib.sha256(key.encode()).hexdigest()[:60]


def new_message_id() -> str:
    return uuid.uuid4().hex


def parse_subscription(data: bytes) -> Subscription:
    """Parse a ``{"topic": T, "client_id": C}`` job payload."""
    obj = _load_object(data, limit=_RAW_SLACK)
    topic = validate_topic(_require(obj, "topic"), allow_prefix=True)
    client_id = validate_client_id(_require(obj, "client_id"))
    return Subscription(topic, client_id)


def parse_fanout(data: bytes, max_payload: int = DEFAULT_MAX_PAYLOAD) -> Fanout:
    """Parse a ``{"topic": T, "payload": P, "unique"?: U, "background"?: B}`` payload.

    Instead of ``payload``: ``payload_base64`` (bytes that are not UTF-8
    text), or ``payloads`` / ``payloads_base64``, a list of up to
    ``MAX_BATCH`` messages fanned out in order by one job (the STOMP bridge
    batches a producer's consecutive SENDs so). ``max_payload`` bounds the
    bytes of all messages of the job together.
    """
    obj = _load_object(data, limit=max_payload * _RAW_FACTOR + _RAW_SLACK)
    topic = validate_topic(_require(obj, "topic"))
    bodies = _bodies(obj)
    size = sum(len(b) for b in bodies)
    if size > max_payload:
        what = "payload is" if len(bodies) == 1 else f"{len(bodies)} payloads total"
        raise BadRequest(f"{what} {size} bytes, over the limit of {max_payload} bytes")
    unique = _parse_unique(obj.get("unique"))
    if unique is not None and len(bodies) > 1:
        raise BadRequest("unique applies to one message: not with payloads")
    return Fanout(topic, bodies, unique, bool(obj.get("background")))


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


def _parse_unique(unique: object) -> str | None:
    if unique is None:
        return None
    if not isinstance(unique, str):
        raise BadRequest(f"unique must be a string, not {_json_type(unique)}")
    if not re.fullmatch(rf"[!-~]{{1,{MAX_UNIQUE_BYTES}}}", unique):
        raise BadRequest(
            f"invalid unique {_shorten(unique)}: use 1 to {MAX_UNIQUE_BYTES} printable "
            "ASCII characters without whitespace"
        )
    return unique


def _load_object(data: bytes, *, limit: int) -> dict:
    if len(data) > limit:
        raise BadRequest(f"job is {len(data)} bytes, over the limit of {limit} bytes")
    try:
        obj = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise BadRequest(f"job is not UTF-8: {exc.reason} at byte {exc.start}") from None
    except json.JSONDecodeError as exc:
        raise BadRequest(f"job is not JSON: {exc.msg} at char {exc.pos}") from None
    except RecursionError:
        raise BadRequest("job is not acceptable JSON: nested too deeply") from None
    if not isinstance(obj, dict):
        raise BadRequest(f"job must be a JSON object, not {_json_type(obj)}")
    return obj


def _require(obj: dict, key: str) -> object:
    if key not in obj:
        raise BadRequest(f"missing key {key!r}")
    return obj[key]


_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
               int: "a number", float: "a number", type(None): "null"}


def _json_type(value: object) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _shorten(value: str, limit: int = 40) -> str:
    text = value if len(value) <= limit else value[:limit] + "..."
    return repr(text)
