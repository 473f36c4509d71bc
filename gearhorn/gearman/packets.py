"""The Gearman binary protocol: packet types, encoding, incremental
decoding, and the errors of talking it. Pure: no sockets."""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import NamedTuple

REQ = b"\0REQ"
RES = b"\0RES"
_HEADER = struct.Struct(">4sII")
MAX_PACKET = 64 * 1024 * 1024  # refuse a corrupt length instead of buffering it


class P(enum.IntEnum):
    """Gearman packet types (the subset gearhorn sends or reads)."""

    CAN_DO = 1
    PRE_SLEEP = 4
    NOOP = 6
    SUBMIT_JOB = 7
    JOB_CREATED = 8
    GRAB_JOB = 9
    NO_JOB = 10
    JOB_ASSIGN = 11
    WORK_STATUS = 12
    WORK_COMPLETE = 13
    WORK_FAIL = 14
    ECHO_REQ = 16
    ECHO_RES = 17
    SUBMIT_JOB_BG = 18
    ERROR = 19
    SUBMIT_JOB_HIGH = 21
    SET_CLIENT_ID = 22
    WORK_EXCEPTION = 25
    OPTION_REQ = 26
    OPTION_RES = 27
    WORK_DATA = 28
    WORK_WARNING = 29
    GRAB_JOB_UNIQ = 30
    JOB_ASSIGN_UNIQ = 31
    SUBMIT_JOB_HIGH_BG = 32
    SUBMIT_JOB_LOW = 33
    SUBMIT_JOB_LOW_BG = 34
    GET_STATUS_UNIQUE = 41
    STATUS_RES_UNIQUE = 42


# Number of NUL-separated arguments of each packet gearhorn reads, as
# gearmand 1.1.x sends them (libgearman/command.cc): a handle, then data.
_ARITY = {
    P.JOB_CREATED: 1, P.WORK_COMPLETE: 2, P.WORK_FAIL: 1, P.WORK_EXCEPTION: 2,
    P.WORK_DATA: 2, P.WORK_WARNING: 2, P.WORK_STATUS: 3, P.ERROR: 2, P.ECHO_RES: 1,
    P.OPTION_RES: 1, P.NOOP: 0, P.NO_JOB: 0, P.JOB_ASSIGN: 3, P.JOB_ASSIGN_UNIQ: 4,
    P.STATUS_RES_UNIQUE: 6,
}
# Packets that carry a handle and nothing else; gearmand 1.1.20 sends some
# with a NUL after it (a WORK_FAIL it makes when a worker's WORK_EXCEPTION
# reaches a client that did not ask for exceptions: "H:host:1\0"), so the
# handle ends at the first NUL.
_HANDLE_ONLY = frozenset({P.JOB_CREATED, P.WORK_FAIL})

# (background, precedence) -> submit packet type
_SUBMIT = {
    (True, "normal"): P.SUBMIT_JOB_BG, (True, "high"): P.SUBMIT_JOB_HIGH_BG,
    (True, "low"): P.SUBMIT_JOB_LOW_BG, (False, "normal"): P.SUBMIT_JOB,
    (False, "high"): P.SUBMIT_JOB_HIGH, (False, "low"): P.SUBMIT_JOB_LOW,
}


class GearmanError(Exception):
    """gearmand answered ERROR, or the connection broke. Its message is one
    line a person can act on (``gearhorn`` prints it without a traceback);
    the package imports nothing of gearhorn's, so it is not a GearhornError."""


class PacketError(GearmanError):
    """The peer sent bytes that are not Gearman."""


class Unavailable(GearmanError):
    """No configured gearmand accepted the request."""


@dataclass(frozen=True, slots=True)
class Packet:
    type: int
    args: tuple[bytes, ...]


def encode(ptype: int, *args: bytes, magic: bytes = REQ) -> bytes:
    """One binary packet: ``magic``, type, length, NUL-joined arguments."""
    body = b"\0".join(args)
    return _HEADER.pack(magic, ptype, len(body)) + body


class PacketReader:
    """Incremental decoder: ``feed`` any chunk, get every complete packet."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Packet]:
        self._buf += data
        packets, at = [], 0
        while (found := self._packet_at(at)) is not None:
            ptype, start, at = found
            if ptype == P.JOB_CREATED:  # the handle alone: one per job a holder submits
                packets.append(Packet(ptype, (bytes(self._buf[start:at]),)))
            else:
                packets.append(_decoded(ptype, bytes(self._buf[start:at])))
        del self._buf[:at]
        return packets

    def count_created(self, data: bytes, want: int) -> tuple[int, list[Packet]]:
        """Like :meth:`feed`, for the replies to background submissions, whose
        handles nobody reads: JOB_CREATED packets are counted, up to ``want``,
        not decoded (decoding them was a tenth of a fanout worker's time).
        Returns (how many, the other packets in order); stops after an ERROR
        or the ``want``-th JOB_CREATED, and leaves the rest for :meth:`feed`."""
        self._buf += data
        count, others, at = 0, [], 0
        while count < want and (found := self._packet_at(at)) is not None:
            ptype, start, at = found
            if ptype == P.JOB_CREATED:
                count += 1
                continue
            others.append(_decoded(ptype, bytes(self._buf[start:at])))
            if ptype == P.ERROR:
                break
        del self._buf[:at]
        return count, others

    def _packet_at(self, at: int) -> tuple[int, int, int] | None:
        """(type, body start, end) of the complete packet at ``at``, if any."""
        if len(self._buf) - at < _HEADER.size:
            return None
        magic, ptype, size = _HEADER.unpack_from(self._buf, at)
        if magic not in (REQ, RES) or size > MAX_PACKET:
            raise PacketError(f"not a Gearman packet (magic {bytes(magic)!r}, size {size})")
        start = at + _HEADER.size
        end = start + size
        return None if len(self._buf) < end else (ptype, start, end)


def _decoded(ptype: int, body: bytes) -> Packet:
    arity = _ARITY.get(ptype, 1)
    if ptype in _HANDLE_ONLY:
        return Packet(ptype, (body.split(b"\0", 1)[0],))
    return Packet(ptype, tuple(body.split(b"\0", arity - 1)) if arity else ())


class Copy(NamedTuple):
    """One job to submit (a tuple: a fanout makes one per copy, and a
    frozen dataclass took twice as long to make)."""

    function: str
    unique: str
    data: bytes


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a foreground job ended, and what its worker said on the way.

    ``status``: ``complete`` (WORK_COMPLETE), ``failed`` (WORK_FAIL),
    ``exception`` (WORK_EXCEPTION), ``timeout`` (no end in time: the job is
    still in gearmand) or ``lost`` (the connection to gearmand broke).
    ``data`` is WORK_COMPLETE's data; ``reason`` the exception's text, or
    the last WORK_WARNING before a WORK_FAIL; ``warnings``, ``partial``
    (WORK_DATA, joined in order) and ``progress`` (the last WORK_STATUS)
    are what came before the end. ``handle`` is gearmand's handle of the
    job that ended: two ends of one unique under two handles are two runs."""

    status: str
    data: bytes = b""
    reason: str = ""
    warnings: tuple[bytes, ...] = ()
    partial: bytes = b""
    progress: tuple[int, int] | None = None
    handle: bytes = b""

    @property
    def ok(self) -> bool:
        return self.status == "complete"


class Answers:
    """What the workers of foreground jobs said, packet by packet: ``heard``
    returns a job's Outcome once it ended. Pure.

    >>> answers = Answers()
    >>> answers.heard(Packet(P.WORK_DATA, (b"H:1", b"part")))
    >>> answers.heard(Packet(P.WORK_EXCEPTION, (b"H:1", b"boom"))).reason
    'boom'
    """

    def __init__(self) -> None:
        self._said: dict[bytes, dict] = {}

    def heard(self, packet: Packet) -> Outcome | None:
        handle = packet.args[0] if packet.args else b""
        said = self._said.setdefault(handle, {"warnings": [], "partial": [], "progress": None})
        kind = packet.type
        if kind == P.WORK_DATA:
            said["partial"].append(packet.args[1])
        elif kind == P.WORK_WARNING:
            said["warnings"].append(packet.args[1])
        elif kind == P.WORK_STATUS:
            said["progress"] = _fraction(packet.args[1:])
        elif kind in (P.WORK_COMPLETE, P.WORK_FAIL, P.WORK_EXCEPTION):
            del self._said[handle]
            return _ended(kind, packet.args, said)
        else:
            if not any(said.values()):
                del self._said[handle]
            return None
        return None


def _ended(kind: int, args: tuple[bytes, ...], said: dict) -> Outcome:
    warnings = tuple(said["warnings"])
    common = {"warnings": warnings, "partial": b"".join(said["partial"]),
              "progress": said["progress"], "handle": args[0] if args else b""}
    if kind == P.WORK_COMPLETE:
        return Outcome("complete", args[1], **common)
    if kind == P.WORK_EXCEPTION:
        return Outcome("exception", args[1], reason=exception_text(args[1]) or "exception",
                       **common)
    return Outcome("failed", reason=_text(warnings[-1]) if warnings else "job failed", **common)


def _fraction(args: tuple[bytes, ...]) -> tuple[int, int] | None:
    try:
        return int(args[0]), int(args[1])
    except (ValueError, IndexError):
        return None


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace").strip()


def exception_text(data: bytes) -> str:
    """A WORK_EXCEPTION's reason as text. Most clients send text (PHP's
    sendException, Node's sendWorkException, gear); Perl's Gearman::Worker
    sends its ``die`` message frozen with Storable: its longest printable
    run is the message.

    >>> exception_text(b"division by zero")
    'division by zero'
    >>> exception_text(b"\\x05\\x0b\\x04\\n\\x1bdied at worker.pl line 7.\\n")
    'died at worker.pl line 7.'
    """
    try:
        text = data.decode("utf-8").strip()
        if all(c >= " " or c in "\n\r\t" for c in text):
            return text
    except UnicodeDecodeError:
        pass
    runs = [r for r in bytes(b if 32 <= b < 127 else 0 for b in data).split(b"\0") if r]
    return max(runs, key=len).decode().strip() if runs else ""


class PartialSubmit(GearmanError):
    def __init__(self, accepted: int, reason: str) -> None:
        super().__init__(reason)
        self.accepted = accepted
