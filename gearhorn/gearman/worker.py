"""Taking jobs from gearmand: gear's worker with TCP_NODELAY, and the
bridge's worker connection that grabs only when told to."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

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
            self.conn.send(encode(P.GRAB_JOB_UNIQ) * count
                           + (encode(P.PRE_SLEEP) if then_sleep else b""))
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
