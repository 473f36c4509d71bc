"""What a subscription may hold: its limits, parsed and validated (pure).

Why it is shaped so: docs/design/notes.rst, "gearhorn/rules/limits.py".
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

from gearhorn.errors import BadRequest

DROP_HEAD, REJECT_PUBLISH = "drop-head", "reject-publish"
OVERFLOWS = (DROP_HEAD, REJECT_PUBLISH)
# Reasons a copy is not kept, as the ledger, metrics and dlq-reason say them.
MAXLEN, MAXBYTES, EXPIRED, FULL, REMOVED = "maxlen", "maxbytes", "expired", "full", "removed"
POLICY_REASONS = (MAXLEN, MAXBYTES, EXPIRED, FULL, REMOVED)
_MAX_COUNT = 2**53  # beyond this a number is a mistake, not a limit
_MAX_SECONDS = 10 * 365 * 86_400.0


@dataclass(frozen=True, slots=True)
class Limits:
    """A subscription's limits; ``None``: not said (the default applies)."""

    max_length: int | None = None
    max_bytes: int | None = None
    message_ttl: float | None = None
    expires: float | None = None
    overflow: str | None = None
    dead_letter: bool | None = None

    def over(self, defaults: Limits) -> Limits:
        """These limits, with ``defaults`` where they say nothing."""
        given = self.said()
        return replace(defaults, **given) if given else defaults

    def said(self) -> dict[str, object]:
        """Only what was given, for JSON."""
        return {k: v for k in LIMIT_KEYS if (v := getattr(self, k)) is not None}

    @property
    def empty(self) -> bool:
        return not self.said()

    def describe(self) -> str:
        """``max_length=100 drop-head`` for logs and errors."""
        parts = [f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                 for k, v in self.said().items() if k not in ("overflow", "dead_letter") and v]
        if self.overflow:
            parts.append(self.overflow)
        if self.dead_letter:
            parts.append("dead-letter")
        return " ".join(parts) or "unbounded"


LIMIT_KEYS = tuple(f.name for f in fields(Limits))


def _count(key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise BadRequest(f"{key} must be a whole number of "
                             f"{'bytes' if key == 'max_bytes' else 'copies'}, got {value!r}")
    if not 0 <= value <= _MAX_COUNT:
        raise BadRequest(f"{key} must be 0 (no limit) or more, got {value}")
    return value


def _seconds(key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not math.isfinite(value):
        raise BadRequest(f"{key} must be a number of seconds, got {value!r}")
    if not 0 <= value <= _MAX_SECONDS:
        raise BadRequest(f"{key} must be 0 (off) to {_MAX_SECONDS:.0f} seconds, got {value}")
    return float(value)


def _overflow(key: str, value: object) -> str:
    if value not in OVERFLOWS:
        raise BadRequest(f"{key} must be {' or '.join(OVERFLOWS)}, got {value!r}")
    return value


def _flag(key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise BadRequest(f"{key} must be true or false, got {value!r}")
    return value


_PARSERS = {"max_length": _count, "max_bytes": _count, "message_ttl": _seconds,
            "expires": _seconds, "overflow": _overflow, "dead_letter": _flag}


def limits_from_job(obj: Mapping[str, object]) -> Limits | None:
    """The limit keys of a ``subscribe_fanout`` payload; None if it has none."""
    given = {k: _PARSERS[k](k, obj[k]) for k in LIMIT_KEYS if k in obj}
    return Limits(**given) if given else None


# RabbitMQ's queue arguments as STOMP SUBSCRIBE headers (times in ms).
STOMP_HEADERS = {"x-max-length": "max_length", "x-max-length-bytes": "max_bytes",
                 "x-message-ttl": "message_ttl", "x-expires": "expires",
                 "x-overflow": "overflow", "x-dead-letter": "dead_letter"}
_MILLISECONDS = ("message_ttl", "expires")


def limits_from_headers(headers: Mapping[str, str]) -> Limits | None:
    """The ``x-*`` limit headers of a SUBSCRIBE frame; None if it has none.

    ``x-dead-letter-exchange`` (any value) turns dead-lettering on, as it does
    for a RabbitMQ queue: here the exchange is always ``<queue>.dlq``."""
    given: dict[str, object] = {}
    for header, key in STOMP_HEADERS.items():
        if header not in headers:
            continue
        raw = headers[header].strip()
        if key == "overflow":
            given[key] = _overflow(header, raw)
        elif key == "dead_letter":
            given[key] = _flag(header, {"true": True, "false": False}.get(raw.lower(), raw))
        else:
            try:
                number = int(raw)
            except ValueError:
                raise BadRequest(f"{header} must be a whole number, got {raw!r}") from None
            if key in _MILLISECONDS:
                given[key] = _seconds(header, number / 1000)
            else:
                given[key] = _count(header, number)
    if "x-dead-letter-exchange" in headers and "dead_letter" not in given:
        given["dead_letter"] = True
    return Limits(**given) if given else None


def limits_to_json(limits: Limits | None) -> str:
    return json.dumps(limits.said() if limits else {}, separators=(",", ":"))


def limits_from_json(text: str | None) -> Limits:
    """Read back what :func:`limits_to_json` wrote; unknown keys are ignored
    (written by a newer gearhorn)."""
    return limits_from_dict(json.loads(text) if text else {})


def limits_from_dict(obj: dict) -> Limits:
    """:func:`limits_from_json` of an object already read."""
    return Limits(**{k: obj[k] for k in LIMIT_KEYS if k in obj})
