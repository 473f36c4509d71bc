"""Where a stream subscription starts: pure, no I/O.

Why it is shaped so: docs/design/notes.rst, "gearhorn/stomp/topics/startoffsets.py".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gearhorn.stomp.protocol.rules import INVALID_HEADER, ProtocolError

NAMED = ("first", "last", "next")


@dataclass(frozen=True, slots=True)
class StreamStart:
    kind: str  # first, last, next, offset or timestamp
    value: float = 0  # the offset or the timestamp


@dataclass(frozen=True, slots=True)
class Kept:
    """What a topic's history holds now: its epoch (None: no history yet),
    the oldest offset kept and the last offset given (first = last + 1
    when it keeps nothing)."""

    epoch: str | None
    first: int
    last: int


def parse_stream_offset(raw: str) -> StreamStart:
    """``x-stream-offset``'s value, or ProtocolError saying what is allowed."""
    value = raw.strip()
    if value in NAMED:
        return StreamStart(value)
    kind, sep, number = value.partition("=")
    if not sep:
        kind, number = "offset", value
    try:
        if kind == "offset" and number.isdigit() and int(number) >= 1:
            return StreamStart("offset", int(number))
        if kind == "timestamp" and math.isfinite(float(number)) and float(number) >= 0:
            return StreamStart("timestamp", float(number))
    except ValueError:
        pass
    raise ProtocolError(f"invalid x-stream-offset {raw[:40]!r}: use first, last, next, "
                        "an offset from 1, or timestamp=<epoch seconds>", INVALID_HEADER)


def start_after(start: StreamStart, kept: Kept, epoch_seen: str | None,
                at_timestamp: int | None = None) -> tuple[int, bool]:
    """(the offset the subscription is past, whether that is the client's
    own position): it gets every kept message after the first. For a
    timestamp, ``at_timestamp`` is the offset of its first message."""
    if start.kind == "first":
        return kept.first - 1, True
    if start.kind == "next":
        return kept.last, True
    if start.kind == "last":
        return max(kept.last - 1, kept.first - 1), True
    if start.kind == "timestamp":
        assert at_timestamp is not None
        return max(at_timestamp, kept.first) - 1, True
    wanted = int(start.value)
    same_epoch = epoch_seen is None or epoch_seen == kept.epoch
    if same_epoch and kept.first <= wanted <= kept.last + 1:
        return wanted - 1, True
    return kept.first - 1, False


@dataclass(frozen=True, slots=True)
class Resume:
    """Where a stream subscription starts: past offset ``after`` of ``epoch``."""

    after: int
    epoch: str | None
    recovered: bool
    last: int | None = None  # the topic's last offset when it was read (None: unknown)

    def receipt_headers(self) -> dict[str, str]:
        return {"x-stream-offset": str(self.after + 1), "x-stream-epoch": self.epoch or "",
                "x-recovered": "true" if self.recovered else "false"}


def resume_point(streams, topic: str, headers: dict[str, str],
                 check_only: bool = False) -> Resume | None:
    """A SUBSCRIBE's start in ``topic``'s history (``streams``: what the
    bridge knows of histories, gearhorn/stomp/sessions/backend.py's ServesStreams);
    with ``check_only``, None once its headers are found good."""
    start = parse_stream_offset(headers["x-stream-offset"])
    if topic.endswith("*"):
        raise ProtocolError(f"x-stream-offset needs one topic, not the pattern {topic!r}",
                            INVALID_HEADER)
    if not streams.keeps_history(topic):
        raise ProtocolError(f"topic {topic!r} keeps no history to resume from (set "
                            "realtime_history_size, history_size, or history_topics for "
                            "it)", INVALID_HEADER)
    if check_only:
        return None
    kept = streams.kept(topic)
    at = streams.offset_at(topic, start.value) if start.kind == "timestamp" else None
    after, recovered = start_after(start, kept, headers.get("x-stream-epoch") or None, at)
    return Resume(after, kept.epoch, recovered, kept.last)
