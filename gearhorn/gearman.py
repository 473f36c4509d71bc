"""Talking Gearman as a client: packets, pipelined submission, admin ``status``.

Why not ``gear.Client``: it waits for JOB_CREATED before sending the next
job and keeps every background job in ``related_jobs`` forever. Here a batch
of SUBMIT_JOB packets goes out in one write and the JOB_CREATED replies are
read in order (gearmand answers a connection's requests in order), with no
per-job state kept after the call. Every socket has TCP_NODELAY.
"""

from __future__ import annotations

import enum
import logging
import socket
import ssl
import struct
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import gear

from gearhorn.errors import GearhornError

log = logging.getLogger(__name__)

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


class ProtocolError(GearmanError):
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
                raise ProtocolError(f"not a Gearman packet (magic {bytes(magic)!r}, size {size})")
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


class NoDelayWorker(gear.Worker):
    """gear.Worker with TCP_NODELAY: with Nagle on, each job waits ~40 ms."""

    def _onConnect(self, conn: gear.Connection) -> None:
        conn.conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super()._onConnect(conn)


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for TLS to gearmand: gear (and gear.Server) want all three,
    a client certificate included. The server's certificate is checked
    against ``ca``; its host name is not (gear does the same)."""

    ca: str
    cert: str
    key: str

    def context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca)
        context.check_hostname = False
        context.load_cert_chain(self.cert, self.key)
        return context


# Set once per process from the config (use_tls); every connection gearhorn
# opens to a Gearman server then speaks TLS.
_tls: TlsFiles | None = None
_tls_context: ssl.SSLContext | None = None


def use_tls(files: TlsFiles | None) -> None:
    global _tls, _tls_context
    _tls, _tls_context = files, files.context() if files else None


def use_tls_files(ca: str, cert: str, key: str) -> None:
    """:func:`use_tls` from config values; empty strings mean no TLS."""
    use_tls(TlsFiles(ca, cert, key) if ca else None)


def add_server(worker: gear.BaseClient, host: str, port: int) -> None:
    """``worker.addServer`` with this process's TLS files, if any."""
    if _tls is None:
        worker.addServer(host, port)
    else:
        worker.addServer(host, port, ssl_key=_tls.key, ssl_cert=_tls.cert, ssl_ca=_tls.ca)


def connect(host: str, port: int, timeout: float = 5.0) -> socket.socket:
    """A TCP connection with TCP_NODELAY (Nagle costs ~40 ms per small job),
    over TLS when :func:`use_tls` was given files."""
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if _tls_context is not None:
        try:
            sock = _tls_context.wrap_socket(sock, server_hostname=host)
        except (ssl.SSLError, OSError):
            sock.close()
            raise
    sock.settimeout(None)
    return sock


class Connection:
    """One client connection to one gearmand."""

    def __init__(self, host: str, port: int, connect_timeout: float = 5.0) -> None:
        self.host, self.port = host, port
        self.connect_timeout = connect_timeout
        self._sock: socket.socket | None = None
        self._reader = PacketReader()
        self._pending: deque[Packet] = deque()

    def __repr__(self) -> str:
        return f"<gearman {self.host}:{self.port}>"

    def open(self) -> None:
        if self._sock is None:
            try:
                self._sock = connect(self.host, self.port, self.connect_timeout)
            except OSError as exc:
                raise GearmanError(f"cannot connect to gearmand {self.host}:{self.port}: "
                                   f"{exc.strerror or exc}") from None
            self._reader = PacketReader()
            self._pending.clear()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    @property
    def is_open(self) -> bool:
        return self._sock is not None

    def send(self, data: bytes) -> None:
        self.open()
        try:
            self._sock.sendall(data)
        except OSError as exc:
            self.close()
            raise GearmanError(f"lost gearmand {self.host}:{self.port}: {exc}") from None

    def read(self, deadline: float | None = None) -> Packet | None:
        """The next packet, or None once ``deadline`` (time.monotonic) passed."""
        while not self._pending:
            # A socket timeout, not select(): select() fails on descriptors
            # above 1023, which a bridge holding thousands of queues reaches.
            if self._sock is None:
                raise GearmanError(f"connection to gearmand {self.host}:{self.port} is closed")
            try:
                if deadline is None:
                    chunk = self._sock.recv(256 * 1024)
                else:
                    chunk = self._recv_until(deadline)
                    if chunk is None:
                        return None
            except OSError as exc:
                self.close()
                raise GearmanError(f"lost gearmand {self.host}:{self.port}: {exc}") from None
            if not chunk:
                self.close()
                raise GearmanError(f"gearmand {self.host}:{self.port} closed the connection")
            self._pending.extend(self._reader.feed(chunk))
        return self._pending.popleft()

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

    def set_option(self, name: str) -> None:
        self.send(encode(P.OPTION_REQ, name.encode()))
        packet = self._read_reply()
        if packet.type != P.OPTION_RES:
            raise GearmanError(f"gearmand refused option {name}")

    def _read_reply(self) -> Packet:
        packet = self.read()
        if packet.type == P.ERROR:
            code, text = (packet.args + (b"", b""))[:2]
            raise GearmanError(f"gearmand error {code.decode()}: {text.decode()}")
        return packet

    def submit(self, copies: Sequence[Copy], *, background: bool = True,
               precedence: str = "normal") -> list[bytes]:
        """Submit ``copies`` in one write; returns their job handles, in order.

        On failure raises :class:`PartialSubmit` saying how many were accepted.
        """
        ptype = _SUBMIT[(background, precedence)]
        wire = b"".join(encode(ptype, c.function.encode(), c.unique.encode(), c.data)
                        for c in copies)
        handles: list[bytes] = []
        early: list[Packet] = []  # results of jobs done before all JOB_CREATED came
        try:
            self.send(wire)
            while len(handles) < len(copies):
                packet = self._read_reply()
                if packet.type == P.JOB_CREATED:
                    handles.append(packet.args[0])
                else:
                    early.append(packet)
        except GearmanError as exc:
            raise PartialSubmit(len(handles), str(exc)) from exc
        finally:
            self._pending.extendleft(reversed(early))  # read them next, in order
        return handles


class PartialSubmit(GearmanError):
    def __init__(self, accepted: int, reason: str) -> None:
        super().__init__(reason)
        self.accepted = accepted


def wait_for_results(conn: Connection, handles: Sequence[bytes],
                     timeout: float) -> list[Outcome]:
    """Collect foreground outcomes for ``handles`` until done or ``timeout``.

    Blocks in recv() with a timeout (no spinning). Packets for other handles (left over
    from an earlier call that timed out) are ignored.
    """
    index = {h: i for i, h in enumerate(handles)}
    outcomes: list[Outcome | None] = [None] * len(handles)
    warnings: dict[bytes, bytes] = {}
    left = len(handles)
    deadline = time.monotonic() + timeout
    try:
        while left:
            packet = conn.read(deadline)
            if packet is None:
                break
            handle = packet.args[0] if packet.args else b""
            if handle not in index or outcomes[index[handle]] is not None:
                continue
            outcome = _outcome(packet, warnings)
            if outcome is not None:
                outcomes[index[handle]] = outcome
                left -= 1
    except GearmanError as exc:
        lost = Outcome("failed", reason=str(exc))
        return [o or lost for o in outcomes]
    late = Outcome("timeout", reason=f"no answer within {timeout:.3g}s")
    return [o or late for o in outcomes]


def _outcome(packet: Packet, warnings: dict[bytes, bytes]) -> Outcome | None:
    handle = packet.args[0]
    if packet.type == P.WORK_COMPLETE:
        return Outcome("complete", packet.args[1])
    if packet.type == P.WORK_WARNING:
        warnings[handle] = packet.args[1]
    elif packet.type == P.WORK_EXCEPTION:
        return Outcome("failed", reason=_text(packet.args[1]) or "exception")
    elif packet.type == P.WORK_FAIL:
        return Outcome("failed", reason=_text(warnings.pop(handle, b"")) or "job failed")
    return None


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace").strip()


class Client:
    """Submits jobs to a list of gearmand servers, failing over in turn.

    Each call starts at the next server (spreading load); when a server
    fails mid-batch, the copies it did not accept go to the next one.

    >>> client = Client([("127.0.0.1", 4730)])             # doctest: +SKIP
    >>> client.submit_background([Copy("news_alice", "m1:alice", b"hi")])  # doctest: +SKIP
    1
    """

    def __init__(self, servers: Sequence[tuple[str, int]], batch: int = 1000,
                 connect_timeout: float = 5.0,
                 before_background: Callable[[Iterable[str]], None] | None = None) -> None:
        if not servers:
            raise ValueError("at least one gearmand server is needed")
        self.connections = [Connection(h, p, connect_timeout) for h, p in servers]
        self.batch = batch
        self._next = 0
        # Told the functions of every background batch before it is sent
        # (gearhorn/replay.py records names gearmand's redis queue misreads).
        self.before_background = before_background

    def close(self) -> None:
        for conn in self.connections:
            conn.close()

    def _rotation(self) -> list[Connection]:
        start = self._next
        self._next = (self._next + 1) % len(self.connections)
        return self.connections[start:] + self.connections[:start]

    def submit_background(self, copies: Sequence[Copy], precedence: str = "normal") -> int:
        """Submit background jobs; returns once gearmand accepted them all."""
        if self.before_background is not None:
            self.before_background({c.function for c in copies})
        self._submit(copies, background=True, precedence=precedence)
        return len(copies)

    def submit_foreground(self, copies: Sequence[Copy], timeout: float,
                          precedence: str = "normal") -> list[Outcome]:
        """Submit foreground jobs and wait up to ``timeout`` s for their outcomes."""
        placed = self._submit(copies, background=False, precedence=precedence)
        deadline = time.monotonic() + timeout
        outcomes: list[Outcome] = []
        for conn, handles in placed:
            if conn is None:
                lost = Outcome("failed", reason="lost the gearmand connection after submitting")
                outcomes += [lost] * handles
            else:
                outcomes += wait_for_results(conn, handles, max(0.0, deadline - time.monotonic()))
        return outcomes

    def call(self, function: str, data: bytes, timeout: float = 30.0,
             precedence: str = "normal") -> Outcome:
        """Run one foreground job and return its outcome."""
        # Unique per call: gearmand merges foreground jobs with equal unique
        # keys, and a merged call would get another caller's result.
        unique = f"call:{uuid.uuid4().hex}"
        return self.submit_foreground([Copy(function, unique, data)], timeout, precedence)[0]

    def _submit(self, copies: Sequence[Copy], *, background: bool,
                precedence: str) -> list[tuple[Connection | None, int | list[bytes]]]:
        """Place ``copies`` on the servers in turn.

        Returns ``(connection, handles)`` per server used; a server that broke
        after accepting some appears as ``(None, count)``: its jobs are in
        gearmand, but their foreground results are lost with the connection.
        """
        placed: list[tuple[Connection | None, int | list[bytes]]] = []
        done, errors = 0, []
        for conn in self._rotation():
            handles: list[bytes] = []
            try:
                while done < len(copies):
                    chunk = copies[done:done + self.batch]
                    handles += _submit_once_more_if_stale(conn, chunk, background, precedence)
                    done += len(chunk)
                placed.append((conn, handles))
                return placed
            except PartialSubmit as exc:
                done += exc.accepted
                log.warning("gearmand %s:%s failed: %s", conn.host, conn.port, exc)
                errors.append(str(exc))
                conn.close()
                if handles or exc.accepted:
                    placed.append((None, len(handles) + exc.accepted))
            if done == len(copies):
                return placed
        raise Unavailable(f"no gearmand accepted the jobs ({done} of {len(copies)} "
                          f"accepted): {'; '.join(errors)}")


def _submit_once_more_if_stale(conn: Connection, copies: Sequence[Copy], background: bool,
                               precedence: str) -> list[bytes]:
    """``conn.submit``; a connection left open from before that fails with
    nothing accepted (gearmand restarted since) is reopened and tried once more."""
    reused = conn.is_open
    try:
        return conn.submit(copies, background=background, precedence=precedence)
    except PartialSubmit as exc:
        if not reused or exc.accepted:
            raise
        conn.close()
        return conn.submit(copies, background=background, precedence=precedence)


# Admin commands answered with several lines ending in ".\n"; the others answer one line.
_MULTI_LINE_ADMIN = {"status", "workers", "show", "prioritystatus"}


def admin(host: str, port: int, command: str, timeout: float = 5.0) -> list[str]:
    """Run a text admin command (``status``, ``workers``, ``version``)."""
    with connect(host, port, timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(command.encode() + b"\n")
        data = b""
        single = command.split(" ", 1)[0] not in _MULTI_LINE_ADMIN
        while not (data.endswith(b"\n.\n") or data == b".\n" or (single and b"\n" in data)):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    lines = data.decode("utf-8", "replace").splitlines()
    return [line for line in lines if line != "."]


def drop_function(servers: Sequence[tuple[str, int]], function: str) -> None:
    """Delete a queue nobody will read again, on every server (admin ``drop
    function``); a failure is logged, not raised."""
    for host, port in servers:
        try:
            admin(host, port, f"drop function {function}")
        except (OSError, GearmanError) as exc:
            log.warning("could not drop %s on %s:%s: %s", function, host, port, exc)


@dataclass(frozen=True, slots=True)
class FunctionStatus:
    name: str
    queued: int
    running: int
    workers: int


def status(host: str, port: int, timeout: float = 5.0) -> list[FunctionStatus]:
    """gearmand's ``status``: jobs queued (total), running, and capable workers."""
    result = []
    for line in admin(host, port, "status", timeout):
        parts = line.split("\t")
        if len(parts) == 4 and all(p.isdigit() for p in parts[1:]):
            result.append(FunctionStatus(parts[0], *map(int, parts[1:])))
    return result


@dataclass(frozen=True, slots=True)
class GrabbedJob:
    handle: bytes
    function: str
    unique: str
    data: bytes


class WorkerConnection:
    """A worker-side connection that grabs jobs only when told to.

    The STOMP bridge uses one per queue and server: it grabs as many jobs as
    its subscribers have credit for (several GRAB_JOB_UNIQ in one write) and
    completes each only when the STOMP client acknowledged it. A job held
    here and never completed goes back to the queue when the connection
    closes (C gearmand requeues the jobs of a worker that disconnects).
    """

    def __init__(self, host: str, port: int, functions: Sequence[str],
                 client_id: str = "gearhorn") -> None:
        import threading

        self.conn = Connection(host, port)
        self.functions = tuple(functions)
        self.client_id = client_id
        self._send_lock = threading.Lock()
        # A scheduler (gevent's loop.run_callback) to batch WORK_COMPLETEs.
        self.coalesce: Callable[[Callable[[], None]], object] | None = None
        self._answers: list[bytes] = []

    def open(self) -> None:
        self.conn.open()
        wire = encode(22, self.client_id.encode())  # SET_CLIENT_ID
        wire += b"".join(encode(P.CAN_DO, f.encode()) for f in self.functions)
        self.conn.send(wire)

    def grab(self, count: int) -> list[GrabbedJob]:
        """Ask for up to ``count`` jobs at once; returns those gearmand had."""
        with self._send_lock:
            self.conn.send(encode(P.GRAB_JOB_UNIQ) * count)
        jobs, answers = [], 0
        while answers < count:
            packet = self.conn.read()
            if packet.type == P.JOB_ASSIGN_UNIQ:
                handle, function, unique, data = packet.args
                jobs.append(GrabbedJob(handle, function.decode(), unique.decode(), data))
            elif packet.type == P.ERROR:
                raise GearmanError(f"gearmand error: {b' '.join(packet.args).decode()}")
            elif packet.type != P.NO_JOB:
                continue  # a NOOP from an earlier sleep
            answers += 1
        return jobs

    def sleep(self, timeout: float) -> bool:
        """PRE_SLEEP and wait up to ``timeout`` for gearmand's NOOP (work arrived)."""
        with self._send_lock:
            self.conn.send(encode(P.PRE_SLEEP))
        deadline = time.monotonic() + timeout
        while True:
            packet = self.conn.read(deadline)
            if packet is None:
                return False
            if packet.type == P.NOOP:
                return True

    def complete(self, handle: bytes, data: bytes = b"") -> None:
        self._answer(encode(P.WORK_COMPLETE, handle, data))

    def fail(self, handle: bytes) -> None:
        self._answer(encode(P.WORK_FAIL, handle))

    def _answer(self, packet: bytes) -> None:
        """Send now, or with ``coalesce`` set, gather the answers given in one
        turn of the event loop into one write (``flush``, called by the owner)."""
        if self.coalesce is None:
            with self._send_lock:
                self.conn.send(packet)
            return
        if not self._answers:
            self.coalesce(self.flush)
        self._answers.append(packet)

    def flush(self) -> None:
        if self._answers:
            wire, self._answers = b"".join(self._answers), []
            with self._send_lock:
                self.conn.send(wire)

    def close(self) -> None:
        self.conn.close()
