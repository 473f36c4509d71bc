"""The gevent STOMP server: sockets, heart-beats, TLS, connection limits.

Each connection has a reader (this module feeds bytes to the pure parser and
frames to the session) and a writer greenlet draining a queue of outgoing
frames. The queue is bounded in effect: deliveries stop when it holds
``max_backlog`` bytes (the session's credit), and the reader stops reading
while it is over that, so a slow consumer pushes back on its own socket
instead of growing our memory.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
from collections import deque
from collections.abc import Callable

import gevent
import gevent.event
from gevent.server import StreamServer

from gearhorn.runtime.ports import BRIDGE_PORT, BRIDGE_WS_PORT, listen
from gearhorn.stomp.protocol.frames import HEARTBEAT, FrameError, FrameLimits, FrameParser, encode
from gearhorn.stomp.protocol.rules import SessionSettings
from gearhorn.stomp.sessions.backend import Backend
from gearhorn.stomp.sessions.session import Session
from gearhorn.stomp.transport import websocket
from gearhorn.stomp.transport.loopwrites import LoopWrites

log = logging.getLogger(__name__)

_READ_SIZE = 64 * 1024
# A silent client is dead after this multiple of its heart-beat interval.
_HEARTBEAT_GRACE = 2.0


class ClientConnection:
    """One client socket: the session's transport."""

    def __init__(self, sock: socket.socket | websocket.WebSocketStream, address: tuple,
                 backend: Backend, limits: FrameLimits, settings: SessionSettings,
                 connect_timeout: float, frame_timeout: float = 30.0) -> None:
        self.sock = sock
        self.frame_timeout = frame_timeout
        self._partial_since: float | None = None  # when the unfinished frame began
        self.address = address
        self.parser = FrameParser(limits)
        self.session = Session(backend, self, settings)
        self.connect_timeout = connect_timeout
        # An absolute deadline: EOLs ("heart-beats") before CONNECT do not extend it.
        self._connect_by = _now() + connect_timeout
        self.backlog = 0
        # (bytes, on_sent, on_dropped, whether on_sent may run where written)
        self._queue: deque[tuple[bytes, Callable | None, Callable | None, bool]] = deque()
        self._wakeup = gevent.event.Event()
        self._drained = gevent.event.Event()
        self._drained.set()
        self._closing = False
        self._wrote_at = 0.0
        # A plain socket, or a WebSocket on one, is written without the
        # writer when it can take the bytes (:meth:`_write_now`); TLS goes
        # by the writer (a TLS record cannot be retried with other bytes).
        self._direct = type(sock) is gevent.socket.socket or (
            type(sock) is websocket.WebSocketStream and type(sock.sock) is gevent.socket.socket)
        self._flush = getattr(sock, "flush", None)  # a WebSocket's unfinished frame
        self._due = False  # written again once the sending greenlet gives way
        self._writing = False  # the writer is in a sendall
        self._written: deque[Callable[[], None]] = deque()  # on_sent, for the writer
        self._writer = gevent.spawn(self._write_loop)
        self._beater: gevent.Greenlet | None = None

    # -- transport interface -------------------------------------------------------

    def send(self, data: bytes, on_sent: Callable[[], None] | None = None,
             on_dropped: Callable[[], None] | None = None, inline: bool = False) -> None:
        if self._closing:
            if on_dropped is not None:
                on_dropped()
            return
        self._queue.append((data, on_sent, on_dropped, inline))
        self.backlog += len(data)
        if self.backlog >= self.session.settings.max_backlog:
            self._drained.clear()
        if not self._direct or self._writing:
            self._wakeup.set()
        elif not self._due:
            # The first frame of a turn goes out now; those sent after it in
            # the same turn, together once the sending greenlet gives way.
            # Frames read together are answered together (LoopWrites.held).
            self._due = True
            _WRITES.due(self)
            if _WRITES.holder is None or _WRITES.holder is not gevent.getcurrent():
                self._write_now()

    def write_turn(self) -> None:
        """The event loop's write of what was sent this turn (LoopWrites)."""
        self._due = False
        self._write_now()

    def wake_writer(self) -> None:
        self._wakeup.set()

    def _write_now(self) -> None:
        """Write what the socket takes without waiting, in one write. A
        MESSAGE so reaches its subscriber without a switch to each
        connection's writer (issue 27). The writer gets the rest, and runs
        the ``on_sent`` of what went out (an ack may block: not here),
        but for those sent ``inline``: they run here, saving a switch to
        the writer per connection and turn (a live topic subscriber's
        auto-ack; bridge CPU at 1,000 msg/s x10 -10%, docs/benchmarks.rst)."""
        if self._writing or self._closing or not self._queue:
            if self._closing or self._queue:
                self._wakeup.set()
            return
        items, size = [], 0
        while self._queue and size < _READ_SIZE:
            items.append(self._queue.popleft())
            size += len(items[-1][0])
        data = b"".join(item[0] for item in items)
        try:
            left = self.sock.send(data, 0, 0.0)
        except OSError:  # full (EAGAIN), or broken: the writer finds out which
            left = 0
        if left:
            self._wrote_at = _now()
        self.backlog -= left
        at_once = []
        for n, (chunk, on_sent, on_dropped, inline) in enumerate(items):
            if left < len(chunk):  # this one and those after it wait for the writer
                self._queue.extendleft(reversed([(chunk[left:], on_sent, on_dropped, inline),
                                                 *items[n + 1:]]))
                break
            left -= len(chunk)
            if on_sent is not None:
                (at_once if inline else self._written).append(on_sent)
        for on_sent in at_once:
            on_sent()
        if self.backlog < self.session.settings.max_backlog:
            self._drained.set()
        if self._written or self._queue or (self._flush is not None and self.sock.unflushed):
            self._wakeup.set()

    def close(self) -> None:
        """Close once everything queued (an ERROR, a RECEIPT) has been written."""
        self._closing = True
        self._wakeup.set()

    # -- loops ---------------------------------------------------------------------

    def serve(self) -> None:
        try:
            self._read_loop()
        except (OSError, ssl.SSLError) as exc:
            log.debug("%s: %s", self.address, exc)
        finally:
            self._closing = True
            self._wakeup.set()
            if self._beater is not None:
                self._beater.kill(block=False)
            self.session.connection_lost()
            self._writer.join(timeout=5)
            self._drop_unsent()
            self.sock.close()

    def _read_loop(self) -> None:
        while not self._closing:
            self.sock.settimeout(self._read_timeout())
            try:
                data = self.sock.recv(_READ_SIZE)
            except TimeoutError:
                self.session.error(self._silence_reason())
                return
            if not data:
                return
            try:
                frames = self.parser.feed(data)
            except FrameError as exc:
                self.session.error(str(exc))
                return
            if frames and not self.session.connected:
                # Frames before CONNECTED go one by one: the version decides
                # how the frames after it are parsed.
                self.session.handle(frames.pop(0))
                if self.session.connected:
                    self._on_connected()
            if len(frames) > 1:
                with _WRITES.held():
                    self.session.handle_frames(frames)
            else:
                self.session.handle_frames(frames)
            if self._closing:
                return
            self._track_partial_frame()
            # Back-pressure: don't read more requests while our answers pile up.
            self._drained.wait()

    def _read_timeout(self) -> float | None:
        """Until the heart-beat (or CONNECT) deadline, or sooner when an
        unfinished frame must be completed: a sender that trickles a frame
        byte by byte, or never finishes it, is cut off after ``frame_timeout``."""
        if not self.session.connected:
            limit = max(0.0, self._connect_by - _now())
        else:
            expect_ms = self.session.heartbeat[1]
            limit = expect_ms / 1000 * _HEARTBEAT_GRACE if expect_ms else None
        if self._partial_since is not None:
            left = max(0.0, self._partial_since + self.frame_timeout - _now())
            limit = left if limit is None else min(limit, left)
        return limit

    def _silence_reason(self) -> str:
        if self._partial_since is not None and \
                _now() >= self._partial_since + self.frame_timeout:
            return f"frame not completed within {self.frame_timeout:g}s"
        if self.session.connected:
            return "heart-beat timeout"
        return f"no CONNECT within {self.connect_timeout:g}s"

    def _track_partial_frame(self) -> None:
        if not self.parser.pending:
            self._partial_since = None
        elif self._partial_since is None:
            self._partial_since = _now()

    def _on_connected(self) -> None:
        self.parser.version = self.session.version
        send_ms = self.session.heartbeat[0]
        if send_ms:
            self._beater = gevent.spawn(self._heartbeat_loop, send_ms / 1000)

    def _heartbeat_loop(self, interval: float) -> None:
        while not self._closing:
            gevent.sleep(interval)
            if gevent.get_hub().loop.now() - self._wrote_at >= interval * 0.9:
                self.send(HEARTBEAT)

    def _write_loop(self) -> None:
        while True:
            self._wakeup.wait()
            self._wakeup.clear()
            if self._flush is not None:
                try:
                    self._flush()
                except OSError:
                    self._closing = True
                    self._kick_reader()
                    return
            while self._written:  # written from the event loop, before any queued now
                self._written.popleft()()
            while self._queue:
                batch, callbacks, size = [], [], 0
                while self._queue and size < _READ_SIZE:
                    data, on_sent, _, _ = self._queue.popleft()
                    batch.append(data)
                    size += len(data)
                    if on_sent is not None:
                        callbacks.append(on_sent)
                self._writing = True
                try:
                    self.sock.sendall(b"".join(batch))
                except OSError:
                    self._closing = True
                    self._kick_reader()
                    return
                finally:
                    self._writing = False
                self._wrote_at = gevent.get_hub().loop.now()
                self.backlog -= size
                if self.backlog < self.session.settings.max_backlog:
                    self._drained.set()
                for callback in callbacks:
                    callback()
            if self._closing:
                self._kick_reader()
                return

    def _kick_reader(self) -> None:
        self._drained.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def _drop_unsent(self) -> None:
        while self._written:  # these were written: sent, as the writer would say
            self._written.popleft()()
        while self._queue:
            _, _, on_dropped, _ = self._queue.popleft()
            if on_dropped is not None:
                on_dropped()


_WRITES = LoopWrites()


def _now() -> float:
    return gevent.get_hub().loop.now()


class BridgeServer:
    """Accepts STOMP connections on ``host:port``, and STOMP over WebSocket
    on ``host:ws_port`` when given (TLS on both when a cert is given)."""

    def __init__(self, backend: Backend, host: str, port: int, *, limits: FrameLimits,
                 settings: SessionSettings, max_connections: int = 10_000,
                 connect_timeout: float = 10.0, frame_timeout: float = 30.0,
                 certfile: str | None = None, keyfile: str | None = None,
                 ws_port: int | None = None, reuse_port: bool = False) -> None:
        self.backend = backend
        self.frame_timeout = frame_timeout
        self.limits = limits
        self.settings = settings
        self.max_connections = max_connections
        self.connect_timeout = connect_timeout
        self.connections: set[ClientConnection] = set()
        self.tls = tls_context(certfile, keyfile) if certfile else None
        self.server = StreamServer(listen(host, port, BRIDGE_PORT, reuse_port), self._handle)
        self.ws_server = None
        if ws_port is not None:
            self.ws_server = StreamServer(listen(host, ws_port, BRIDGE_WS_PORT, reuse_port),
                                          self._handle_websocket)

    @property
    def address(self) -> tuple[str, int]:
        return self.server.address

    def start(self) -> None:
        self.server.start()
        log.info("STOMP bridge listening on %s:%s", *self.server.address[:2])
        if self.ws_server is not None:
            self.ws_server.start()
            log.info("STOMP over WebSocket on %s:%s%s", *self.ws_server.address[:2],
                     websocket.PATH)

    def serve_forever(self) -> None:
        self.server.serve_forever()

    def stop(self, timeout: float = 5.0) -> None:
        if self.ws_server is not None:
            self.ws_server.stop(timeout)
        self.server.stop(timeout)

    def _handle(self, sock: socket.socket, address: tuple) -> None:
        sock = self._secure(sock, address)
        if sock is not None:
            self._serve(sock, address)

    def _handle_websocket(self, sock: socket.socket, address: tuple) -> None:
        sock = self._secure(sock, address)
        if sock is None:
            return
        try:
            stream = websocket.accept(sock, self.connect_timeout)
        except (websocket.HandshakeFailed, OSError, ssl.SSLError) as exc:
            log.info("%s: WebSocket upgrade failed: %s", address[0], exc)
            sock.close()
            return
        self._serve(stream, address)

    def _secure(self, sock: socket.socket, address: tuple) -> socket.socket | None:
        """TCP_NODELAY, and the TLS handshake when TLS is on: within
        ``connect_timeout`` (a client that never finishes it holds nothing
        for long), and a failed one is one log line, not a traceback."""
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls is None:
            return sock
        try:
            sock.settimeout(self.connect_timeout)
            secure = self.tls.wrap_socket(sock, server_side=True)
            secure.settimeout(None)
            return secure
        except (OSError, ssl.SSLError) as exc:
            log.info("%s: TLS handshake failed: %s", address[0], exc)
            sock.close()
            return None

    def _serve(self, sock: socket.socket | websocket.WebSocketStream, address: tuple) -> None:
        if len(self.connections) >= self.max_connections:
            _refuse(sock, f"too many connections (limit {self.max_connections})")
            return
        conn = ClientConnection(sock, address, self.backend, self.limits, self.settings,
                          self.connect_timeout, self.frame_timeout)
        self.connections.add(conn)
        try:
            conn.serve()
        finally:
            self.connections.discard(conn)


def tls_context(certfile: str, keyfile: str | None) -> ssl.SSLContext:
    """The bridge's TLS settings. No TLS 1.3 session tickets: a ticket is a
    message the server sends right after the handshake, and clients that
    read in one thread while they write CONNECT in another (stomp.py) can
    lose that CONNECT when the ticket arrives meanwhile (OpenSSL objects are
    not thread-safe); the client then waits for CONNECTED forever. Seen as
    one test run in five failing with two clients on a loaded machine."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certfile, keyfile)
    context.num_tickets = 0
    return context


def _refuse(sock: socket.socket | websocket.WebSocketStream, message: str) -> None:
    try:
        sock.sendall(encode("ERROR", {"message": message}, message.encode(), "1.0"))
    except OSError:
        pass
    finally:
        sock.close()
