"""The WebSocket frames a client sends (RFC 6455 5), read without I/O.

Why it is shaped so: docs/design/notes.rst, "gearhorn/stomp/transport/wsframes.py".
"""

from __future__ import annotations

import codecs
import struct
from dataclasses import dataclass, field

CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
PROTOCOL_ERROR, INVALID_DATA, NORMAL = 1002, 1007, 1000
_CONTROL_MAX = 125
# Close codes a peer may send (RFC 6455 7.4.1 and 7.4.2).
_SENDABLE = {1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014}


class Violation(Exception):
    """The client broke the protocol: fail the connection with ``code``."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.read = Read()  # what the bytes held before the broken frame


@dataclass
class Read:
    """What the bytes fed so far held: the data, in order; pings' payloads;
    and the close, if one came (nothing after it is read)."""

    data: list[bytes] = field(default_factory=list)
    pings: list[bytes] = field(default_factory=list)
    close: tuple[int, str] | None = None


def close_frame(code: int, reason: str = "") -> bytes:
    """An unmasked close frame from the server."""
    payload = struct.pack("!H", code) + reason.encode()[:_CONTROL_MAX - 2]
    return bytes((0x80 | CLOSE, len(payload))) + payload


def pong_frame(payload: bytes) -> bytes:
    return bytes((0x80 | PONG, len(payload))) + payload


def unmask(data: bytes, mask: bytes) -> bytes:
    """``data`` XOR the 4-byte ``mask`` repeated (as one big integer: C speed)."""
    n = len(data)
    if not n or mask == b"\0\0\0\0":
        return bytes(data)
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "little") ^ int.from_bytes(key, "little")).to_bytes(n, "little")


class ClientFrames:
    """Reads a client's frames from bytes fed in any pieces."""

    def __init__(self) -> None:
        self._buffer = b""
        self._message: int | None = None  # TEXT or BINARY while a message is unfinished
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        # The frame whose payload is being read: opcode, fin, mask, bytes left.
        self._frame: tuple[int, bool, bytes] | None = None
        self._left = 0
        self._offset = 0  # payload bytes of the frame read so far (the mask's phase)
        self._control = b""  # a control frame's payload, read whole
        self.closed = False

    def feed(self, data: bytes) -> Read:
        """What ``data`` (after what came before) completes; raises
        :class:`Violation` on a broken frame."""
        read = Read()
        self._buffer += data
        try:
            while not self.closed:
                if self._frame is None and not self._start_frame():
                    break
                if not self._payload(read):
                    break
        except Violation as exc:
            exc.read = read  # what came before the broken frame stands
            self.closed = True
            raise
        if self.closed:
            self._buffer = b""
        return read

    def _start_frame(self) -> bool:
        """Read the next frame's header, if it is all there."""
        buf = self._buffer
        if len(buf) < 2:
            return False
        first, second = buf[0], buf[1]
        fin, opcode, size, at = bool(first & 0x80), first & 0x0F, second & 0x7F, 2
        self._check(first, second, opcode, fin, size)
        if size == 126:
            if len(buf) < 4:
                return False
            size, at = struct.unpack_from("!H", buf, 2)[0], 4
        elif size == 127:
            if len(buf) < 10:
                return False
            size, at = struct.unpack_from("!Q", buf, 2)[0], 10
            if size >> 63:
                raise Violation(PROTOCOL_ERROR, "a frame length with its top bit set")
        if len(buf) < at + 4:
            return False
        self._frame = (opcode, fin, buf[at:at + 4])
        self._buffer = buf[at + 4:]
        self._left, self._offset, self._control = size, 0, b""
        return True

    def _check(self, first: int, second: int, opcode: int, fin: bool, size: int) -> None:
        """The first two bytes of a frame (``size``: its 7-bit length)."""
        if first & 0x70:
            raise Violation(PROTOCOL_ERROR, "reserved bits set (no extension was agreed)")
        if not second & 0x80:
            raise Violation(PROTOCOL_ERROR, "a client's frame must be masked")
        if opcode >= CLOSE:
            if opcode not in (CLOSE, PING, PONG):
                raise Violation(PROTOCOL_ERROR, f"unknown control opcode {opcode:#x}")
            if not fin or size > _CONTROL_MAX:
                raise Violation(PROTOCOL_ERROR, "a control frame must be whole and at most "
                                                f"{_CONTROL_MAX} bytes")
        elif opcode == CONTINUATION:
            if self._message is None:
                raise Violation(PROTOCOL_ERROR, "a continuation frame with no message begun")
        elif opcode in (TEXT, BINARY):
            if self._message is not None:
                raise Violation(PROTOCOL_ERROR, "a new message before the last one ended")
        else:
            raise Violation(PROTOCOL_ERROR, f"unknown data opcode {opcode:#x}")

    def _payload(self, read: Read) -> bool:
        """Take what is here of the current frame's payload; whether the
        frame ended."""
        assert self._frame is not None
        opcode, fin, mask = self._frame
        take = min(self._left, len(self._buffer))
        chunk, self._buffer = self._buffer[:take], self._buffer[take:]
        if self._offset % 4:
            phase = self._offset % 4
            mask = mask[phase:] + mask[:phase]
        chunk = unmask(chunk, mask)
        self._left -= take
        self._offset += take
        if opcode >= CLOSE:
            self._control += chunk
        elif chunk or not self._left:  # a message's empty frames count too
            self._data(opcode, chunk, fin and not self._left, read)
        if self._left:
            return False
        self._frame = None
        if opcode >= CLOSE:
            self._on_control(opcode, self._control, read)
        return True

    def _data(self, opcode: int, chunk: bytes, last: bool, read: Read) -> None:
        if opcode != CONTINUATION:
            self._message = opcode
        if self._message == TEXT and not (chunk.isascii() and not self._utf8.getstate()[0]):
            try:
                self._utf8.decode(chunk, final=last)
            except UnicodeDecodeError:
                raise Violation(INVALID_DATA, "a text message that is not UTF-8") from None
        if chunk:
            read.data.append(chunk)
        if last:
            self._message = None
            self._utf8.reset()

    def _on_control(self, opcode: int, payload: bytes, read: Read) -> None:
        if opcode == PING:
            read.pings.append(payload)
        elif opcode == CLOSE:
            read.close = _close_reason(payload)
            self.closed = True


def _close_reason(payload: bytes) -> tuple[int, str]:
    """A close frame's code and reason (1005, none given: answered with 1000)."""
    if not payload:
        return NORMAL, ""
    if len(payload) == 1:
        raise Violation(PROTOCOL_ERROR, "a close frame with a one-byte code")
    (code,) = struct.unpack_from("!H", payload)
    if code not in _SENDABLE and not 3000 <= code <= 4999:
        raise Violation(PROTOCOL_ERROR, f"close code {code} may not be sent")
    try:
        reason = payload[2:].decode()
    except UnicodeDecodeError:
        raise Violation(INVALID_DATA, "a close reason that is not UTF-8") from None
    return code, reason
