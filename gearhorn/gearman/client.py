"""Submitting jobs to a list of gearmand servers: pipelined batches,
foreground results, failover."""

from __future__ import annotations

import logging
import time
import uuid
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from gearhorn.gearman.connection import Connection, TlsFiles
from gearhorn.gearman.packets import (
    Answers,
    Copy,
    GearmanError,
    Outcome,
    PartialSubmit,
    Unavailable,
)

log = logging.getLogger(__name__)


def wait_for_results(conn: Connection, handles: Sequence[bytes],
                     timeout: float) -> list[Outcome]:
    """Collect foreground outcomes for ``handles`` until done or ``timeout``.

    Blocks in recv() with a timeout (no spinning). Packets for other handles (left over
    from an earlier call that timed out) are ignored.
    """
    index = {h: i for i, h in enumerate(handles)}
    outcomes: list[Outcome | None] = [None] * len(handles)
    answers = Answers()
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
            outcome = answers.heard(packet)
            if outcome is not None:
                outcomes[index[handle]] = outcome
                left -= 1
    except GearmanError as exc:
        lost = Outcome("lost", reason=str(exc))
        return [o or lost for o in outcomes]
    late = Outcome("timeout", reason=f"no answer within {timeout:.3g}s")
    return [o or late for o in outcomes]


def home_index(function: str, servers: int) -> int:
    """Which of ``servers`` (sorted by address) is ``function``'s home."""
    return zlib.crc32(function.encode()) % servers


def call_unique() -> str:
    """Unique per call: gearmand merges foreground jobs with equal unique
    keys, and a merged call would get another caller's result."""
    return f"call:{uuid.uuid4().hex}"


class Client:
    """Submits jobs to a list of gearmand servers, failing over in turn.

    Background jobs go to their function's home server: one of the servers,
    sorted by address, chosen by a hash of the name. A queue's jobs then
    stay on one server, in the order they were sent, whichever process sent
    them, and a batch's jobs for several servers are written to all of them
    before their replies are read, so the servers work at once. Foreground
    calls start at the next server in turn (spreading load). When a server
    fails mid-batch, the jobs it did not accept go to the next one.

    With a gearmand on 127.0.0.1:4730::

        client = Client([("127.0.0.1", 4730)])
        client.submit_background([Copy("news_alice", "m1:alice", b"hi")])  # 1
    """

    def __init__(self, servers: Sequence[tuple[str, int]], batch: int = 1000,
                 connect_timeout: float = 5.0, tls: TlsFiles | None = None) -> None:
        if not servers:
            raise ValueError("at least one gearmand server is needed")
        self.connections = [Connection(h, p, connect_timeout, tls) for h, p in servers]
        self.batch = batch
        self._next = 0
        # The connections by address: every process, whatever order its
        # servers were listed in, gives a function the same home.
        self._by_address = sorted(range(len(self.connections)), key=lambda i: (
            self.connections[i].host, self.connections[i].port))

    def close(self) -> None:
        for conn in self.connections:
            conn.close()

    def _rotation(self, start: int | None = None) -> list[Connection]:
        if start is None:
            start = self._next
            self._next = (self._next + 1) % len(self.connections)
        return self.connections[start:] + self.connections[:start]

    def home(self, function: str) -> int:
        """The index of ``function``'s home server in this client's list."""
        return self._by_address[home_index(function, len(self.connections))]

    def submit_background(self, copies: Sequence[Copy], precedence: str = "normal") -> int:
        """Submit background jobs; returns once gearmand accepted them all."""
        if len(self.connections) == 1:
            self._submit(copies, background=True, precedence=precedence)
            return len(copies)
        for at in range(0, len(copies), self.batch):
            self._submit_homed(copies[at:at + self.batch], precedence)
        return len(copies)

    def _submit_homed(self, copies: Sequence[Copy], precedence: str) -> None:
        """Each job to its function's home: every server's part written
        first, then every server's replies read. A part a server did not
        take goes on to the next server (its home once more first when the
        connection was an old one that broke before taking any: gearmand
        restarted since)."""
        parts: dict[int, list[Copy]] = {}
        for copy in copies:
            parts.setdefault(self.home(copy.function), []).append(copy)
        started: list[tuple[int, list[Copy], bool, PartialSubmit | None]] = []
        for index, part in parts.items():
            conn = self.connections[index]
            reused = conn.is_open
            try:
                conn.start_background(part, precedence)
                started.append((index, part, reused, None))
            except PartialSubmit as exc:
                started.append((index, part, reused, exc))
        left: list[tuple[int, list[Copy]]] = []
        for index, part, reused, failed in started:
            conn = self.connections[index]
            if failed is None:
                try:
                    conn.finish_background(len(part))
                    continue
                except PartialSubmit as exc:
                    failed = exc
            log.warning("gearmand %s:%s failed: %s", conn.host, conn.port, failed)
            conn.close()
            stale = reused and not failed.accepted
            left.append((index if stale else (index + 1) % len(self.connections),
                         part[failed.accepted:]))
        for start, rest in left:
            self._submit(rest, background=True, precedence=precedence, start=start)

    def submit_foreground(self, copies: Sequence[Copy], timeout: float,
                          precedence: str = "normal") -> list[Outcome]:
        """Submit foreground jobs and wait up to ``timeout`` s for their outcomes."""
        return self.start_foreground(copies, precedence).wait(timeout)

    def start_foreground(self, copies: Sequence[Copy], precedence: str = "normal") -> Placed:
        """Submit foreground jobs; their outcomes are read later with
        :meth:`Placed.wait` (from another greenlet or thread, say). Until
        then, use this client for nothing else: the outcomes arrive on its
        connections."""
        return Placed(self._submit(copies, background=False, precedence=precedence))

    def call(self, function: str, data: bytes, timeout: float = 30.0,
             precedence: str = "normal") -> Outcome:
        """Run one foreground job and return its outcome."""
        unique = call_unique()
        return self.submit_foreground([Copy(function, unique, data)], timeout, precedence)[0]

    def _submit(self, copies: Sequence[Copy], *, background: bool, precedence: str,
                start: int | None = None) -> list[tuple[Connection | None, int | list[bytes]]]:
        """Place ``copies`` on the servers in turn, from ``start`` (default:
        the next server).

        Returns ``(connection, handles)`` per server used; a server that broke
        after accepting some appears as ``(None, count)``: its jobs are in
        gearmand, but their foreground results are lost with the connection.
        """
        placed: list[tuple[Connection | None, int | list[bytes]]] = []
        done, errors = 0, []
        for conn in self._rotation(start):
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


@dataclass(frozen=True)
class Placed:
    """Foreground jobs gearmand accepted, per server: ``(connection,
    handles)``, or ``(None, count)`` for a server that broke after accepting
    some (their jobs are in gearmand, their results lost with the connection)."""

    parts: list[tuple[Connection | None, int | list[bytes]]]

    def wait(self, timeout: float) -> list[Outcome]:
        """The outcomes, in submission order, within ``timeout`` s in all."""
        deadline = time.monotonic() + timeout
        outcomes: list[Outcome] = []
        for conn, handles in self.parts:
            if conn is None:
                lost = Outcome("lost", reason="lost the gearmand connection after submitting")
                outcomes += [lost] * handles
            else:
                outcomes += wait_for_results(conn, handles, max(0.0, deadline - time.monotonic()))
        return outcomes


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
