"""STOMP over WebSocket, as RabbitMQ's web-stomp serves it: the HTTP upgrade
at ``/ws`` with the subprotocols ``v12.stomp``, ``v11.stomp`` and
``v10.stomp``, then STOMP bytes carried in WebSocket messages.

Why it is shaped so: docs/design/notes.rst, "gearhorn/stomp/transport/websocket.py".
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time

import gevent.lock
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, RejectConnection, RejectData, Request
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from gearhorn.stomp.transport.wsframes import (
    NORMAL,
    ClientFrames,
    Violation,
    close_frame,
    pong_frame,
)

PATH = "/ws"
# Best first: a client offering several gets the newest STOMP it names.
SUBPROTOCOLS = ("v12.stomp", "v11.stomp", "v10.stomp")
_READ_SIZE = 64 * 1024
_TEXT, _BINARY = 0x81, 0x82  # FIN and the opcode: a whole message in one frame


def data_frame(payload: bytes, text: bool) -> bytes:
    """One whole, unmasked server-to-client data frame (RFC 6455 5.2): the
    bytes wsproto makes for a Message when no extension is agreed (none is
    offered here), without its event machinery, which was the larger part
    of every MESSAGE's cost over WebSocket (docs/design/index.rst)."""
    first, n = _TEXT if text else _BINARY, len(payload)
    if n < 126:
        head = bytes((first, n))
    elif n < 1 << 16:
        head = struct.pack("!BBH", first, 126, n)
    else:
        head = struct.pack("!BBQ", first, 127, n)
    return head + payload


class HandshakeFailed(Exception):
    """The HTTP upgrade was refused or broken; the client got an HTTP answer."""


def choose_subprotocol(offered: list[str]) -> str | None:
    """The STOMP subprotocol to answer with; None when the client offered
    none (then none may be named)."""
    for name in SUBPROTOCOLS:
        if name in offered:
            return name
    if offered:
        raise HandshakeFailed(f"no supported subprotocol in {', '.join(offered)[:200]}; "
                              f"use one of {', '.join(SUBPROTOCOLS)}")
    return None


def accept(sock: socket.socket, timeout: float) -> WebSocketStream:
    """Read the HTTP upgrade from ``sock`` within ``timeout`` s and accept it."""
    ws = WSConnection(ConnectionType.SERVER)
    deadline = time.monotonic() + timeout
    seen = b""  # the request, and what came behind it (the frames' to read)
    while True:
        request = next((e for e in ws.events() if isinstance(e, Request)), None)
        if request is not None:
            break
        left = deadline - time.monotonic()
        if left <= 0:
            raise HandshakeFailed(f"no WebSocket upgrade within {timeout:g}s")
        sock.settimeout(left)
        try:
            data = sock.recv(_READ_SIZE)
        except TimeoutError:
            continue
        if not data:
            raise HandshakeFailed("closed before the upgrade")
        seen += data
        try:
            ws.receive_data(data)
        except RemoteProtocolError as exc:
            _reject(sock, ws, 400, f"not a WebSocket upgrade: {exc}")
    if request.target.split("?", 1)[0] != PATH:
        _reject(sock, ws, 404, f"STOMP over WebSocket is served at {PATH}")
    try:
        subprotocol = choose_subprotocol(list(request.subprotocols))
    except HandshakeFailed as exc:
        _reject(sock, ws, 400, str(exc))
    sock.settimeout(None)
    sock.sendall(ws.send(AcceptConnection(subprotocol=subprotocol)))
    return WebSocketStream(sock, subprotocol, seen.partition(b"\r\n\r\n")[2])


def _reject(sock: socket.socket, ws: WSConnection, status: int, reason: str) -> None:
    """Answer with an HTTP error (when the request got that far) and give up."""
    body = reason.encode()
    try:
        wire = ws.send(RejectConnection(status_code=status, has_body=True, headers=[
            (b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]))
        wire += ws.send(RejectData(data=body))
        sock.sendall(wire)
    except (LocalProtocolError, OSError):
        pass  # the request was too broken to answer
    raise HandshakeFailed(reason)


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


class WebSocketStream:
    """An accepted WebSocket, read and written as a stream of STOMP bytes."""

    def __init__(self, sock: socket.socket, subprotocol: str | None,
                 received: bytes = b"") -> None:
        self.sock = sock
        self.subprotocol = subprotocol
        self.frames = ClientFrames()
        self._inbox: list[bytes] = []
        self._eof = False
        self._closed = False  # our close frame is sent: no data after it
        # The close frame to end with (code, reason): sent by shutdown(),
        # after the answers to what came before the client's close or a
        # broken frame (a RECEIPT, say) were written.
        self._ending: tuple[int, str] = (NORMAL, "")
        # The reader answers pings and closes while the writer sends frames:
        # one write at a time, or their bytes could interleave.
        self._write_lock = gevent.lock.Semaphore()
        self._rest = b""  # the end of a frame :meth:`send` could not write
        self._received = received  # what came behind the upgrade request

    def settimeout(self, timeout: float | None) -> None:
        self.sock.settimeout(timeout)

    def setsockopt(self, *args: int) -> None:
        self.sock.setsockopt(*args)

    def recv(self, size: int) -> bytes:
        """STOMP bytes from the next messages; b"" once the WebSocket closed.
        Raises TimeoutError like a socket when nothing came in time."""
        while True:
            if self._inbox:
                data = b"".join(self._inbox)
                self._inbox.clear()
                return data
            if self._eof:
                return b""
            raw, self._received = self._received or self.sock.recv(size), b""
            if not raw:
                self._eof = True
                continue
            self._read(raw)

    def _read(self, raw: bytes) -> None:
        """Take ``raw``'s frames: data to the inbox, pings and a close answered."""
        try:
            read = self.frames.feed(raw)
        except Violation as exc:  # what came before it stands; the connection ends
            self._inbox.extend(exc.read.data)
            self._ending, self._eof = (exc.code, str(exc)), True
            return
        self._inbox.extend(read.data)
        for payload in read.pings:
            self._write(pong_frame(payload))
        if read.close is not None:  # answered with its code, as RFC 6455 5.5.1 says
            self._ending, self._eof = (read.close[0], ""), True

    def sendall(self, data: bytes) -> None:
        """``data`` (whole frames, or a heart-beat) as one message: text when
        it is UTF-8, as browsers' STOMP clients expect, else binary."""
        self._write(self._frame(data))

    def send(self, data: bytes, flags: int = 0, timeout: float = 0.0) -> int:
        """``data`` as one message, if the socket takes it without waiting
        (the bridge's writes of a turn's first frame, gearhorn/stomp/transport/server.py):
        len(data), or 0 when nothing was written (the caller's writer sends
        it with :meth:`sendall`). A frame the socket took in part is taken:
        its rest goes before anything else, when :meth:`flush` is called."""
        if self._rest or self._write_lock.locked():
            return 0
        wire = self._frame(data)
        sent = self.sock.send(wire, 0, 0.0)
        if not sent:
            return 0
        self._rest = wire[sent:]
        return len(data)

    @property
    def unflushed(self) -> bool:
        return bool(self._rest)

    def flush(self) -> None:
        """Write the rest of a frame :meth:`send` began (waits for the socket)."""
        if self._rest:
            self._write(b"")

    def _frame(self, data: bytes) -> bytes:
        if self._closed:  # closing: no more data
            raise ConnectionError("WebSocket is closing")
        return data_frame(data, data.isascii() or _utf8(data))

    def _write(self, wire: bytes) -> None:
        with self._write_lock:
            if self._rest:  # a frame's end comes first
                wire, self._rest = self._rest + wire, b""
            self.sock.sendall(wire)

    def shutdown(self, how: int) -> None:
        """Say goodbye with a close frame first (once), then shut the socket."""
        if not self._closed:
            self._closed = True
            with contextlib.suppress(OSError):
                self._write(close_frame(*self._ending))
        self.sock.shutdown(how)

    def close(self) -> None:
        self.sock.close()
