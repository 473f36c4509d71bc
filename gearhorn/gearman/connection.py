"""One TCP (or TLS) connection to a gearmand, with TCP_NODELAY."""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import gear

from gearhorn.gearman.packets import (
    _HEADER,
    _SUBMIT,
    REQ,
    Copy,
    GearmanError,
    P,
    Packet,
    PacketReader,
    PartialSubmit,
    encode,
)
from gearhorn.gearman.tcp import CONNECT_TIMEOUT, watch_for_silence


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for TLS to gearmand: gear (and gear.Server) want all three,
    a client certificate included. The server's certificate is checked
    against ``ca``; its host name is not (gear does the same)."""

    ca: str
    cert: str
    key: str

    @classmethod
    def from_settings(cls, ca: str, cert: str, key: str) -> TlsFiles | None:
        """From config values; empty strings mean no TLS."""
        return cls(ca, cert, key) if ca else None

    @cached_property
    def context(self) -> ssl.SSLContext:
        """Built once: loading the files costs a millisecond per connection."""
        context = ssl.create_default_context(cafile=self.ca)
        context.check_hostname = False
        context.load_cert_chain(self.cert, self.key)
        return context


def add_server(worker: gear.BaseClient, host: str, port: int,
               tls: TlsFiles | None = None) -> None:
    """``worker.addServer``, over TLS when ``tls`` is given."""
    if tls is None:
        worker.addServer(host, port)
    else:
        worker.addServer(host, port, ssl_key=tls.key, ssl_cert=tls.cert, ssl_ca=tls.ca)


def connect(host: str, port: int, timeout: float = 5.0,
            tls: TlsFiles | None = None) -> socket.socket:
    """A TCP connection with TCP_NODELAY (Nagle costs ~40 ms per small job)
    that notices a silent gearmand (gearhorn/gearman/tcp.py), over TLS when
    ``tls`` is given."""
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    watch_for_silence(sock)
    if tls is not None:
        try:
            sock = tls.context.wrap_socket(sock, server_hostname=host)
        except (ssl.SSLError, OSError):
            sock.close()
            raise
    sock.settimeout(None)
    return sock


def _wire(ptype: int, copies: Sequence[Copy]) -> bytes:
    """Every copy's packet, in one buffer (``encode``'s work, inlined: this
    runs once per copy)."""
    header, parts = _HEADER.pack, []
    for function, unique, data in copies:
        body = b"\0".join((function.encode(), unique.encode(), data))
        parts += (header(REQ, ptype, len(body)), body)
    return b"".join(parts)


def foreground_jobs(copies: Sequence[Copy], precedence: str = "normal") -> bytes:
    """SUBMIT_JOB packets (``_HIGH``, ``_LOW``: ``precedence``) for ``copies``."""
    return _wire(_SUBMIT[(False, precedence)], copies)


def _option_answer(packet: Packet) -> bool:
    """gearmand's answer to OPTION_REQ: OPTION_RES, or ERROR for a server that
    does not know the option (it then sends no exceptions; nothing else changes)."""
    if packet.type == P.OPTION_RES:
        return True
    return packet.type == P.ERROR and packet.args[:1] == (b"UNKNOWN_OPTION",)


# How long a submission waits for gearmand's replies (JOB_CREATED) with no
# byte coming before the connection counts as broken: gearmand answers each
# packet as it reads it, so seconds without a byte while replies are due is
# a silent gearmand (a node lost, a cable pulled), not a busy one, and it
# must not hold a worker's fanout or a bridge's SEND for TCP's 10 s
# (docs/reliability.rst, "Partitions").
REPLY_TIMEOUT = 1.5
# How long a new TCP connection may take to be accepted before a silence is
# confirmed (see :func:`reachable`).
CONFIRM_TIMEOUT = 0.5
# How long a server whose host still accepts connections is waited for in
# all: a frozen gearmand's kernel acknowledges what is sent to it, so TCP's
# own timeout never ends that wait. Short: in one suite run a silent node's
# host seemed to take a connection (cause not found) and the wait ran to
# TCP's 10 s; this bounds that at 3.5 s and still lets a loaded server be
# slow for 3 s.
SLOW_LIMIT = 3.0


def reachable(host: str, port: int, timeout: float = CONFIRM_TIMEOUT) -> bool:
    """Whether a new TCP connection to ``host``:``port`` is accepted within
    ``timeout``. It confirms a silence before jobs are taken from a
    connection: the kernel of a lost or cut-off node answers nothing, while
    that of a server only slow (a loaded machine, a Python gear.Server with
    TLS on two busy cores) accepts at once, whatever its process is doing.
    Judged by REPLY_TIMEOUT alone, a slow server's held copies went again
    under new uniques: a receiver running one would run it twice."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


class Connection:
    """One client connection to one gearmand."""

    def __init__(self, host: str, port: int, connect_timeout: float = 5.0,
                 tls: TlsFiles | None = None, reply_timeout: float = REPLY_TIMEOUT,
                 client_id: str = "") -> None:
        self.host, self.port = host, port
        self.client_id = client_id  # what admin ``workers`` lists it as
        self.connect_timeout = connect_timeout
        self.reply_timeout = reply_timeout
        self.tls = tls
        self._sock: socket.socket | None = None
        self._reader = PacketReader()
        self._pending: deque[Packet] = deque()
        self._replies_due = 0.0  # the deadline of start_background's replies
        self._lost = False  # the last connection broke or failed: reconnect briskly

    def __repr__(self) -> str:
        return f"<gearman {self.host}:{self.port}>"

    def open(self) -> None:
        if self._sock is None:
            timeout = min(self.connect_timeout, CONNECT_TIMEOUT) if self._lost else \
                self.connect_timeout
            try:
                self._sock = connect(self.host, self.port, timeout, self.tls)
                # Ask for workers' exceptions: without it gearmand 1.1.20 turns a
                # WORK_EXCEPTION into a bare WORK_FAIL and the reason is lost. The
                # answer (OPTION_RES) is read with the next reply and skipped.
                hello = encode(P.OPTION_REQ, b"exceptions")
                if self.client_id:
                    hello += encode(P.SET_CLIENT_ID, self.client_id.encode())
                self._sock.sendall(hello)
            except OSError as exc:
                self.close()
                self._lost = True
                raise GearmanError(f"cannot connect to gearmand {self.host}:{self.port}: "
                                   f"{exc.strerror or exc}") from None
            self._lost = False
            self._reader = PacketReader()
            self._pending.clear()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _broke(self) -> None:
        self.close()
        self._lost = True

    def shutdown(self) -> None:
        """Close, ending the TCP connection at once: close() alone does not
        while another thread is blocked reading the socket (Linux keeps it
        open under that read, and gearmand never sees the client go)."""
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
        self.close()

    @property
    def is_open(self) -> bool:
        return self._sock is not None

    def fileno(self) -> int:
        """The socket's descriptor, to wait on it with a selector."""
        if self._sock is None:
            raise GearmanError(f"connection to gearmand {self.host}:{self.port} is closed")
        return self._sock.fileno()

    @property
    def buffered(self) -> bool:
        """True if a packet can be read without waiting on the socket: one is
        decoded already, or TLS holds decrypted bytes a selector cannot see."""
        if self._pending:
            return True
        return isinstance(self._sock, ssl.SSLSocket) and self._sock.pending() > 0

    def send(self, data: bytes) -> None:
        self.open()
        try:
            self._sock.sendall(data)
        except OSError as exc:
            self._broke()
            raise GearmanError(f"lost gearmand {self.host}:{self.port}: {exc}") from None

    def read(self, deadline: float | None = None) -> Packet | None:
        """The next packet, or None once ``deadline`` (time.monotonic) passed."""
        while not self._pending:
            # A socket timeout, not select(): select() fails on descriptors
            # above 1023, which a bridge holding thousands of queues reaches.
            chunk = self._recv(deadline)
            if chunk is None:
                return None
            self._pending.extend(p for p in self._reader.feed(chunk) if not _option_answer(p))
        return self._pending.popleft()

    def read_all(self) -> list[Packet]:
        """The next packet and every other one already received (a reader
        that handles many at once takes its lock once for them all); []
        when gearmand closed the connection."""
        first = self.read()
        if first is None:
            return []
        packets = [first, *self._pending]
        self._pending.clear()
        return packets

    def _recv(self, deadline: float | None = None) -> bytes | None:
        """The next bytes from gearmand; None once ``deadline`` passed."""
        if self._sock is None:
            raise GearmanError(f"connection to gearmand {self.host}:{self.port} is closed")
        try:
            chunk = (self._sock.recv(256 * 1024) if deadline is None
                     else self._recv_until(deadline))
        except OSError as exc:
            self._broke()
            raise GearmanError(f"lost gearmand {self.host}:{self.port}: {exc}") from None
        if chunk is None:
            return None
        if not chunk:
            self._broke()
            raise GearmanError(f"gearmand {self.host}:{self.port} closed the connection")
        return chunk

    def _replies_until(self) -> float:
        """The deadline of the next reply: REPLY_TIMEOUT from now."""
        return time.monotonic() + self.reply_timeout

    def _recv_until(self, deadline: float) -> bytes | None:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        sock = self._sock  # another greenlet may close() us meanwhile
        sock.settimeout(left)
        try:
            return sock.recv(256 * 1024)
        except TimeoutError:
            return None
        finally:
            sock.settimeout(None)

    def _read_reply(self, deadline: float) -> Packet:
        packet = self.read(deadline)
        if packet is None:
            raise self.silent()
        if packet.type == P.ERROR:
            code, text = (packet.args + (b"", b""))[:2]
            raise GearmanError(f"gearmand error {code.decode()}: {text.decode()}")
        return packet

    def submit(self, copies: Sequence[Copy], *, background: bool = True,
               precedence: str = "normal") -> list[bytes]:
        """Submit ``copies`` in one write; returns their job handles, in order
        (none for background jobs: nobody asks for them).

        On failure raises :class:`PartialSubmit` saying how many were accepted.
        """
        if background:
            self.start_background(copies, precedence)
            self.finish_background(len(copies))
            return []
        wire = _wire(_SUBMIT[(False, precedence)], copies)
        handles: list[bytes] = []
        early: list[Packet] = []  # results of jobs done before all JOB_CREATED came
        try:
            self.send(wire)
            while len(handles) < len(copies):
                packet = self._read_reply(self._replies_until())
                if packet.type == P.JOB_CREATED:
                    handles.append(packet.args[0])
                else:
                    early.append(packet)
            return handles
        except PartialSubmit:
            raise
        except GearmanError as exc:
            raise PartialSubmit(len(handles), str(exc)) from exc
        finally:
            self._pending.extendleft(reversed(early))  # read them next, in order

    def start_background(self, copies: Sequence[Copy], precedence: str = "normal") -> None:
        """Write background ``copies`` without reading gearmand's replies
        (:meth:`finish_background` reads them): several servers then work on
        their parts at once. Raises :class:`PartialSubmit` (none accepted)."""
        wire = _wire(_SUBMIT[(True, precedence)], copies)
        self._replies_due = self._replies_until()
        try:
            self.send(wire)
        except GearmanError as exc:
            raise PartialSubmit(0, str(exc)) from exc

    def finish_background(self, count: int) -> None:
        """Read the ``count`` JOB_CREATED replies of :meth:`start_background`;
        raises :class:`PartialSubmit` with how many were accepted."""
        early: list[Packet] = []  # results of jobs done before all JOB_CREATED came
        try:
            self._count_created(count, early, self._replies_due)
        finally:
            self._pending.extendleft(reversed(early))  # read them next, in order

    def _count_created(self, want: int, early: list[Packet], deadline: float) -> None:
        """Read ``want`` JOB_CREATED replies without decoding them; other
        packets go to ``early``. An ERROR or a lost connection raises
        PartialSubmit with the count accepted before it."""
        got = 0
        while self._pending and got < want:  # decoded already by an earlier read
            got += self._took(self._pending.popleft(), early, got)
        while got < want:
            try:
                chunk = self._recv(deadline)
            except GearmanError as exc:
                raise PartialSubmit(got, str(exc)) from exc
            if chunk is None:
                raise PartialSubmit(got, str(self.silent()))
            deadline = max(deadline, self._replies_until())  # it answers: a while more
            count, others = self._reader.count_created(chunk, want - got)
            got += count
            for packet in others:
                self._took(packet, early, got)
        # What came behind the last JOB_CREATED is read as usual.
        self._pending.extend(p for p in self._reader.feed(b"") if not _option_answer(p))

    def silent(self) -> GearmanError:
        """gearmand did not answer in time: the connection is closed (a late
        reply must not be read as another's); the error to raise."""
        self._broke()
        return GearmanError(f"gearmand {self.host}:{self.port} answered nothing for "
                            f"{self.reply_timeout:g}s: taken for gone")

    @staticmethod
    def _took(packet: Packet, early: list[Packet], got: int) -> int:
        """1 for a JOB_CREATED; an ERROR raises (``got`` accepted before it)."""
        if packet.type == P.JOB_CREATED:
            return 1
        if _option_answer(packet):
            return 0
        if packet.type == P.ERROR:
            code, text = (packet.args + (b"", b""))[:2]
            raise PartialSubmit(got, f"gearmand error {code.decode()}: {text.decode()}")
        early.append(packet)
        return 0
