"""Taking jobs from gearmand: gear's worker with TCP_NODELAY, the bridge's
worker connection that grabs only when told to, and the fanout workers'
source of jobs from every server, several per round trip."""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import gear

from gearhorn.gearman.connection import Connection, TlsFiles
from gearhorn.gearman.packets import GearmanError, P, encode

log = logging.getLogger(__name__)


class NoDelayWorker(gear.Worker):
    """gear.Worker with TCP_NODELAY: with Nagle on, each job waits ~40 ms."""

    def _onConnect(self, conn: gear.Connection) -> None:
        conn.conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super()._onConnect(conn)


@dataclass(frozen=True, slots=True)
class GrabbedJob:
    handle: bytes
    function: str
    unique: str
    data: bytes


class WorkerConnection:
    """A worker-side connection that grabs jobs only when told to.

    The STOMP bridge uses one per queue and server: it grabs no more jobs
    than its subscribers have credit for (several GRAB_JOB_UNIQ in one
    write) and completes each only when the STOMP client acknowledged it.
    A job held here and never completed goes back to the queue when the
    connection closes (C gearmand requeues the jobs of a worker that
    disconnects).
    """

    def __init__(self, host: str, port: int, functions: Sequence[str],
                 client_id: str = "gearhorn", tls: TlsFiles | None = None) -> None:
        self.conn = Connection(host, port, tls=tls)
        self.functions = tuple(functions)
        self.client_id = client_id
        self._send_lock = threading.Lock()
        # A scheduler (gevent's loop.run_callback) to batch WORK_COMPLETEs.
        self.coalesce: Callable[[Callable[[], None]], object] | None = None
        self._answers: list[bytes] = []
        # Answers (WORK_COMPLETE, ...) given, written, and surely read by
        # gearmand: it handles a connection's packets in order, so the
        # reply to a GRAB means it read every answer written before it.
        self.answers_given = 0
        self._answers_written = 0
        self.answers_read = 0

    @property
    def is_open(self) -> bool:
        return self.conn.is_open

    def open(self) -> None:
        self.conn.open()
        wire = encode(P.SET_CLIENT_ID, self.client_id.encode())
        wire += b"".join(encode(P.CAN_DO, f.encode()) for f in self.functions)
        self.conn.send(wire)

    def grab(self, count: int, then_sleep: bool = False) -> list[GrabbedJob]:
        """Ask for up to ``count`` jobs at once; returns those gearmand had.

        ``then_sleep`` sends PRE_SLEEP in the same write: gearmand answers it
        with a NOOP at once if jobs are left, or when one comes in, so the
        caller waits for that (:meth:`wait_for_work`) instead of grabbing
        again to find the queue empty: one round trip per wake-up."""
        with self._send_lock:
            written = self._answers_written
            self.conn.send(encode(P.GRAB_JOB_UNIQ) * count
                           + (encode(P.PRE_SLEEP) if then_sleep else b""))
        jobs, answers = [], 0
        while answers < count:
            # A silent gearmand (its node lost) must not hold the worker for
            # TCP's 10 s: no byte for REPLY_TIMEOUT, and it is taken for gone.
            packet = self.conn.read(time.monotonic() + self.conn.reply_timeout)
            if packet is None:
                raise self.conn.silent()
            if packet.type == P.JOB_ASSIGN_UNIQ:
                handle, function, unique, data = packet.args
                jobs.append(GrabbedJob(handle, function.decode(), unique.decode(), data))
            elif packet.type == P.ERROR:
                raise GearmanError(f"gearmand error: {b' '.join(packet.args).decode()}")
            elif packet.type != P.NO_JOB:
                continue  # a NOOP from an earlier sleep
            answers += 1
        self.answers_read = max(self.answers_read, written)
        return jobs

    def sleep(self, timeout: float) -> bool:
        """PRE_SLEEP and wait up to ``timeout`` for gearmand's NOOP (work arrived)."""
        with self._send_lock:
            self.conn.send(encode(P.PRE_SLEEP))
        return self.wait_for_work(timeout)

    def wait_for_work(self, timeout: float) -> bool:
        """Wait up to ``timeout`` for the NOOP of a PRE_SLEEP already sent."""
        deadline = time.monotonic() + timeout
        while True:
            packet = self.conn.read(deadline)
            if packet is None:
                return False
            if packet.type == P.NOOP:
                return True

    def noticed_work(self) -> bool:
        """Read what gearmand sent while we slept (call when the socket is
        readable or :attr:`Connection.buffered`): True if it was the NOOP of
        the PRE_SLEEP, that is, jobs are waiting."""
        woke = False
        while True:
            packet = self.conn.read()
            if packet.type == P.ERROR:
                raise GearmanError(f"gearmand error: {b' '.join(packet.args).decode()}")
            woke = woke or packet.type == P.NOOP
            if not self.conn.buffered:
                return woke

    def complete(self, handle: bytes, data: bytes = b"") -> None:
        self._answer(encode(P.WORK_COMPLETE, handle, data))

    def fail(self, handle: bytes) -> None:
        self._answer(encode(P.WORK_FAIL, handle))

    def exception(self, handle: bytes, data: bytes) -> None:
        """WORK_EXCEPTION: a client that asked for exceptions gets ``data``."""
        self._answer(encode(P.WORK_EXCEPTION, handle, data))

    def warn(self, handle: bytes, data: bytes) -> None:
        """WORK_WARNING: a foreground client sees ``data`` (gearmand drops it
        for a background job)."""
        self._answer(encode(P.WORK_WARNING, handle, data))

    def _answer(self, packet: bytes) -> None:
        """Send now, or with ``coalesce`` set, gather the answers given in one
        turn of the event loop into one write (``flush``, called by the owner)."""
        self.answers_given += 1
        if self.coalesce is None:
            with self._send_lock:
                self.conn.send(packet)
                self._answers_written += 1
            return
        if not self._answers:
            self.coalesce(self.flush)
        self._answers.append(packet)

    def flush(self) -> None:
        if self._answers:
            batch, self._answers = self._answers, []
            with self._send_lock:
                self.conn.send(b"".join(batch))
                self._answers_written += len(batch)

    def close(self) -> None:
        """Close, the answers gathered for a flush written first: an ACK read
        with the DISCONNECT after it must not leave its job for gearmand to
        hand out again."""
        with contextlib.suppress(GearmanError, OSError):  # broken: gearmand requeues
            self.flush()
        self.conn.close()


def _until_flushed(flush: Callable[[], None]) -> None:
    """A WorkerConnection ``coalesce`` that leaves the flush to its owner."""


class Outages(Protocol):
    """Told of a server's failures and recoveries (gearhorn logs an outage
    once: runtime.background.Outage)."""

    def failed(self, exc: BaseException) -> None: ...

    def succeeded(self) -> None: ...


class _Unwatched:
    def failed(self, exc: BaseException) -> None:
        log.debug("%s", exc)

    def succeeded(self) -> None:
        pass


FIRST_RETRY, LAST_RETRY = 0.1, 0.25  # seconds before a failed server is tried again


@dataclass(eq=False)
class _Server:
    """One gearmand as a :class:`JobSource` sees it."""

    worker: WorkerConnection
    outage: Outages
    asleep: bool = False  # a PRE_SLEEP is out: grab again after its NOOP
    ask: int = 1  # GRABs for the next wake-up
    retry_at: float = 0.0  # when a server that failed is tried again
    pause: float = FIRST_RETRY  # doubles with each failure, up to LAST_RETRY

    def due(self, now: float) -> bool:
        return (not self.asleep or not self.worker.is_open) and now >= self.retry_at


# A backlog's batches stop growing once one brings this many bytes of job
# data: a worker holds at most about this much (or one job) at a time.
BATCH_BYTES = 4 * 1024 * 1024


class JobSource:
    """Takes jobs for ``functions`` from every gearmand of a list, several
    per round trip.

    A wake-up sends its GRABs and a PRE_SLEEP in one write: twice as many
    GRABs as the last wake-up of that server got when it got all it asked
    for (up to ``most``; jobs whose data reach :data:`BATCH_BYTES` are
    taken as many as fit in it), else one. So a backlog is taken in batches and a
    quiet queue costs one GRAB per job. Then it waits for gearmand's NOOP,
    which comes at once when jobs are left. A server that fails is closed
    (gearmand gives the jobs held on it to other workers) and tried again
    after a growing pause; the other servers go on meanwhile. Answers given
    on a connection (complete, fail, warn) are gathered until its
    :meth:`WorkerConnection.flush`: one write for a batch.

    With a gearmand on 127.0.0.1:4730::

        source = JobSource([("127.0.0.1", 4730)], ["fanout"], "w1")
        for worker, job in source.take(timeout=1.0):
            worker.complete(job.handle, b"done")
            worker.flush()
    """

    def __init__(self, servers: Sequence[tuple[str, int]], functions: Sequence[str],
                 client_id: str, tls: TlsFiles | None = None, most: int = 128,
                 outages: Callable[[str], Outages] = lambda what: _Unwatched()) -> None:
        """``outages``: what each server's failures are told to, by its name."""
        self.most = most
        self.servers = [_Server(WorkerConnection(h, p, functions, client_id, tls),
                                outages(f"gearmand {h}:{p} (worker)")) for h, p in servers]
        for server in self.servers:
            server.worker.coalesce = _until_flushed
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)

    def take(self, timeout: float) -> list[tuple[WorkerConnection, GrabbedJob]]:
        """Jobs from every server that has some, each with the connection
        to answer it on; [] once ``timeout`` passed, or :meth:`wake` was
        called, with none."""
        deadline = time.monotonic() + timeout
        while True:
            now = time.monotonic()
            taken = [job for server in self.servers if server.due(now)
                     for job in self._grab(server)]
            if taken:
                return taken
            if now >= deadline or not self._wait(deadline):
                return []

    def wake(self) -> None:
        """Make a waiting :meth:`take` return (safe in a signal handler)."""
        with contextlib.suppress(OSError):  # full already, or closed
            os.write(self._wake_write, b"!")

    def close(self) -> None:
        """Close every connection: gearmand requeues the jobs not answered."""
        for server in self.servers:
            server.worker.close()
        for fd in (self._wake_read, self._wake_write):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _grab(self, server: _Server) -> list[tuple[WorkerConnection, GrabbedJob]]:
        try:
            if not server.worker.is_open:
                server.worker.open()
            jobs = server.worker.grab(server.ask, then_sleep=True)
        except GearmanError as exc:
            self._failed(server, exc)
            return []
        server.outage.succeeded()
        server.pause = FIRST_RETRY
        server.asleep = True
        size = sum(len(job.data) for job in jobs)
        if len(jobs) < server.ask:
            server.ask = 1
        elif size < BATCH_BYTES:
            server.ask = min(self.most, server.ask * 2)
        else:  # as many as fit in BATCH_BYTES, at this batch's size
            server.ask = max(1, len(jobs) * BATCH_BYTES // size)
        return [(server.worker, job) for job in jobs]

    def _failed(self, server: _Server, exc: GearmanError) -> None:
        server.worker.close()
        server.asleep, server.ask = False, 1
        server.retry_at = time.monotonic() + server.pause
        server.pause = min(server.pause * 2, LAST_RETRY)
        server.outage.failed(exc)

    def _wait(self, deadline: float) -> bool:
        """Wait for a NOOP, a server's retry time or ``deadline``; False if
        woken by :meth:`wake`."""
        sleeping = [s for s in self.servers if s.asleep and s.worker.is_open]
        for server in sleeping:
            if server.worker.conn.buffered:
                self._notice(server)
                return True
        retries = [s.retry_at for s in self.servers if not s.worker.is_open]
        until = min([deadline, *retries])
        with selectors.DefaultSelector() as selector:
            selector.register(self._wake_read, selectors.EVENT_READ)
            for server in sleeping:
                selector.register(server.worker.conn.fileno(), selectors.EVENT_READ, server)
            ready = selector.select(max(0.0, until - time.monotonic()))
        for key, _ in ready:
            if key.data is None:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_read, 4096)
                return False
            self._notice(key.data)
        return True

    def _notice(self, server: _Server) -> None:
        try:
            if server.worker.noticed_work():
                server.asleep = False
        except GearmanError as exc:
            self._failed(server, exc)
