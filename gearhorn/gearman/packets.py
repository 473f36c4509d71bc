"""The Gearman binary protocol: packet types, encoding, incremental
decoding, and the errors of talking it. Pure: no sockets."""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from gearhorn.errors import GearhornError

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


# Number of NUL-separated arguments of each packet gearhorn reads.
_ARITY = {
    P.JOB_CREATED: 1, P.WORK_COMPLETE: 2, P.WORK_FAIL: 1, P.WORK_EXCEPTION: 2,
    P.WORK_DATA: 2, P.WORK_WARNING: 2, P.WORK_STATUS: 3, P.ERROR: 2, P.ECHO_RES: 1,
    P.OPTION_RES: 1, P.NOOP: 0, P.NO_JOB: 0, P.JOB_ASSIGN: 3, P.JOB_ASSIGN_UNIQ: 4,
}

# (background, precedence) -> submit packet type
_SUBMIT = {
    (True, "normal"): P.SUBMIT_JOB_BG, (True, "high"): P.SUBMIT_JOB_HIGH_BG,
    (True, "low"): P.SUBMIT_JOB_LOW_BG, (False, "normal"): P.SUBMIT_JOB,
    (False, "high"): P.SUBMIT_JOB_HIGH, (False, "low"): P.SUBMIT_JOB_LOW,
}


class GearmanError(GearhornError):
    """gearmand answered ERROR, or the connection broke."""


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
        packets = []
        while len(self._buf) >= _HEADER.size:
            magic, ptype, size = _HEADER.unpack_from(self._buf)
            if magic not in (REQ, RES) or size > MAX_PACKET:
                raise PacketError(f"not a Gearman packet (magic {bytes(magic)!r}, size {size})")
            end = _HEADER.size + size
            if len(self._buf) < end:
                break
            body = bytes(self._buf[_HEADER.size:end])
            del self._buf[:end]
            arity = _ARITY.get(ptype, 1)
            args = tuple(body.split(b"\0", arity - 1)) if arity else ()
            packets.append(Packet(ptype, args))
        return packets


@dataclass(frozen=True, slots=True)
class Copy:
    """One job to submit."""

    function: str
    unique: str
    data: bytes


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a foreground job ended: ``complete``, ``failed`` or ``timeout``."""

    status: str
    data: bytes = b""
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "complete"

class PartialSubmit(GearmanError):
    def __init__(self, accepted: int, reason: str) -> None:
        super().__init__(reason)
        self.accepted = accepted
