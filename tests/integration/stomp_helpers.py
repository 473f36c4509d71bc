"""Real stomp.py clients against a real bridge process."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time

import stomp

from gearhorn.stomp.protocol.frames import FrameParser, encode
from gearhorn.supervision import servers

from .helpers import ChildProcess


def error_detail(frame) -> str:
    """An ERROR's detail: its body (the ``message`` header is the short,
    common wording, docs/stomp.rst)."""
    body = frame.body
    return body.decode() if isinstance(body, bytes) else body


class BridgeProcess(ChildProcess):
    """``gearhorn bridge`` as a child process on a free loopback port."""

    name = "bridge"

    def __init__(self, gearman_servers, redis_url, log_dir, env=None, websocket=False):
        self.port = servers.free_port()
        self.ws_port = servers.free_port() if websocket else 0
        argv = ["bridge", "--port", str(self.port), "--ws-port", str(self.ws_port),
                "--redis-url", redis_url]
        for server in gearman_servers:
            argv += ["--gearman", server.address]
        super().__init__(argv, os.path.join(log_dir, f"bridge-{self.port}.log"), env)
        self.wait_listening(self.port, *([self.ws_port] if self.ws_port else []))


class HandClient:
    """What the hand-made STOMP clients share; a subclass sends a frame's
    bytes (``send_frame``) and reads the next frame (``read_frame``)."""

    version = "1.2"

    def frame(self, command, headers=None, body=b""):
        self.send_frame(encode(command, headers or {}, body, self.version))

    def expect(self, command):
        """The next frame, which must be a ``command``."""
        frame = self.read_frame()
        assert frame is not None and frame.command == command, frame
        return frame

    def close(self):
        self.sock.close()


class RawClient(HandClient):
    """A bare socket speaking STOMP by hand: for malformed input and sudden death."""

    def __init__(self, port, version="1.2"):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=20)
        self.parser = FrameParser()
        self.version = self.parser.version = version
        self.frames = []

    def send(self, data: bytes):
        self.sock.sendall(data)

    send_frame = send

    def read_frame(self):
        while not self.frames:
            data = self.sock.recv(65536)
            if not data:
                return None
            self.frames += self.parser.feed(data)
        return self.frames.pop(0)

    def connect(self, **headers):
        accept = {} if self.version == "1.0" else {"accept-version": self.version}
        self.frame("CONNECT", {**accept, "host": "x", **headers})
        frame = self.read_frame()
        assert frame.command == "CONNECTED", frame


class Collector(stomp.ConnectionListener):
    def __init__(self):
        self.lock = threading.Condition()
        self.messages = []
        self.receipts = []
        self.arrived: dict[str, float] = {}  # receipt-id -> when (time.monotonic)
        self.errors = []
        self.disconnected = threading.Event()

    def on_message(self, frame):
        with self.lock:
            self.messages.append(frame)
            self.lock.notify_all()

    def on_receipt(self, frame):
        with self.lock:
            self.arrived[frame.headers.get("receipt-id")] = time.monotonic()
            self.receipts.append(frame)
            self.lock.notify_all()

    def on_error(self, frame):
        with self.lock:
            self.errors.append(frame)
            self.lock.notify_all()

    def on_disconnected(self):
        self.disconnected.set()
        with self.lock:  # a wait on the connection's state wakes too
            self.lock.notify_all()


class StompClient:
    """A stomp.py connection with helpers that wait (with timeouts) for answers."""

    VERSIONS = {"1.0": stomp.Connection10, "1.1": stomp.Connection11,
                "1.2": stomp.Connection12}

    def __init__(self, port, version="1.2", heartbeats=(0, 0), connect=True, tls_ca=None,
                 ws_path=None, **headers):
        cls = self.VERSIONS[version]
        kwargs = {"auto_decode": False}
        if version != "1.0":
            kwargs["heartbeats"] = heartbeats
        if ws_path is not None:  # stomp.py's own WebSocket transport (STOMP 1.2)
            cls, kwargs["ws_path"] = stomp.WSStompConnection, ws_path
        self.conn = cls([("127.0.0.1", port)], **kwargs)
        if tls_ca is not None:
            self.conn.set_ssl(for_hosts=[("127.0.0.1", port)], ca_certs=tls_ca)
        self.listener = Collector()
        self.conn.set_listener("collector", self.listener)
        self._receipts = 0
        if connect:
            self.conn.connect(wait=True, headers=headers or None)

    def wait(self, predicate, timeout=20.0, message="answer"):
        deadline = time.monotonic() + timeout
        with self.listener.lock:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"timed out waiting for {message}; errors: "
                                         f"{[e.headers for e in self.listener.errors]}")
                self.listener.lock.wait(left)

    def messages(self, count, timeout=20.0):
        """The first ``count`` messages (more may have come: to count every
        one, duplicates included, use :meth:`until`)."""
        self.wait(lambda: len(self.listener.messages) >= count, timeout,
                  f"{count} messages (have {len(self.listener.messages)})")
        return self.listener.messages[:count]

    def until(self, marker: bytes, timeout=60.0):
        """Every message received before the one whose body is ``marker``
        (sent last, down the same path: what came before it is everything)."""
        def seen():
            return any(m.body == marker for m in self.listener.messages)
        self.wait(seen, timeout, f"the marker {marker!r} (have "
                                 f"{len(self.listener.messages)} messages)")
        got = list(self.listener.messages)
        return got[:next(i for i, m in enumerate(got) if m.body == marker)]

    def every(self, bodies: set[bytes], timeout=120.0):
        """Every message received once each of ``bodies`` came (held copies
        handed again after a crash come in no promised order, so a marker
        sent last says nothing); what came, at the deadline, for the caller
        to say what is missing."""
        def complete():
            return bodies <= {m.body for m in self.listener.messages}
        with contextlib.suppress(AssertionError):
            self.wait(complete, timeout, f"{len(bodies)} messages")
        with self.listener.lock:
            return list(self.listener.messages)

    def receipt(self):
        """A receipt id to pass as ``receipt=``; then ``await_receipt(rid)``."""
        self._receipts += 1
        return f"r{self._receipts}"

    def await_receipt(self, rid, timeout=20.0):
        self.wait(lambda: any(r.headers.get("receipt-id") == rid for r in self.listener.receipts),
                  timeout, f"receipt {rid}")
        return next(r for r in self.listener.receipts if r.headers.get("receipt-id") == rid)

    def send(self, destination, body, **headers):
        rid = self.receipt()
        self.conn.send(destination=destination, body=body, receipt=rid, headers=headers)
        return self.await_receipt(rid)

    def subscribe(self, destination, sub_id, ack="auto", **headers):
        rid = self.receipt()
        self.conn.subscribe(destination=destination, id=sub_id, ack=ack,
                            headers=dict(headers, receipt=rid))
        return self.await_receipt(rid)

    def close(self):
        try:
            if self.conn.is_connected():
                self.conn.disconnect()
        except Exception:  # noqa: BLE001 - already gone is fine here
            pass


class WsClient(HandClient):
    """STOMP over WebSocket by hand (wsproto as the client): for the
    handshake, several frames in one message, heart-beats and wss://."""

    def __init__(self, port, path="/ws", subprotocols=("v12.stomp",), tls_ca=None,
                 version="1.2"):
        from wsproto import ConnectionType, WSConnection
        from wsproto.events import AcceptConnection, RejectConnection, Request

        sock = socket.create_connection(("127.0.0.1", port), timeout=20)
        if tls_ca is not None:
            import ssl
            context = ssl.create_default_context(cafile=tls_ca)
            sock = context.wrap_socket(sock, server_hostname="127.0.0.1")
        self.sock = sock
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.parser = FrameParser()
        self.parser.version = version
        self.version = version
        self.frames, self.messages, self.eof = [], 0, False
        self.sock.sendall(self.ws.send(Request(host="127.0.0.1", target=path,
                                               subprotocols=list(subprotocols))))
        self.accepted = self.rejected = None
        while self.accepted is None and self.rejected is None and not self.eof:
            for event in self._events():
                if isinstance(event, AcceptConnection):
                    self.accepted = event
                elif isinstance(event, RejectConnection):
                    self.rejected = event

    def _events(self):
        data = self.sock.recv(65536)
        if not data:
            self.eof = True
            return []
        self.ws.receive_data(data)
        return list(self.ws.events())

    def send_message(self, *frames):
        """Frames (bytes) in one WebSocket text message."""
        from wsproto.events import Message

        self.sock.sendall(self.ws.send(Message(data=b"".join(frames).decode())))

    def send_frame(self, data: bytes):
        self.send_message(data)

    def read_frame(self):
        """The next STOMP frame (None once closed); heart-beats are counted
        in ``parser.heartbeats``."""
        while not self.frames and not self.eof:
            self.receive_once()
        return self.frames.pop(0) if self.frames else None

    def receive_once(self):
        """Read once from the socket and take in what came."""
        from wsproto.events import CloseConnection, Message

        for event in self._events():
            if isinstance(event, Message):
                self.messages += 1
                data = event.data
                self.frames += self.parser.feed(data.encode() if isinstance(data, str)
                                                else data)
            elif isinstance(event, CloseConnection):
                self.eof, self.close_code, self.close_reason = True, event.code, event.reason

