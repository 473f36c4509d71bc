"""A model of what gearmand 1.1.20 does with foreground jobs, and a holding
connection to it with gearhorn.gearman.Holder's interface: for unit tests
and the ownership protocol's property test, with no socket.

What it models (docs/design/gearmand.rst, "Held copies";
tests/integration/test_gearmand_foreground.py pins it on a real gearmand):

- a SUBMIT_JOB whose unique is known attaches its client to that job, even
  to one that was abandoned;
- a client that goes away leaves its jobs; a job left with no client is
  abandoned (``ignore_job``): no worker is given it, the next grab of its
  function frees it, and a running one ends with nobody told;
- an answer goes to every client attached to the job;
- GET_STATUS_UNIQUE: (known, clients attached), answered in order with the
  connection's other packets;
- a restart forgets every job and breaks every connection.
"""

from __future__ import annotations

import itertools
import types
from dataclasses import dataclass, field

from gearhorn.gearman import Outcome, Unavailable


@dataclass
class Job:
    function: str
    unique: str
    data: bytes
    handle: str
    clients: list = field(default_factory=list)
    abandoned: bool = False
    running: bool = False


class ModelGearmand:
    """One gearmand. ``servers`` finds it by port, as a Holder does."""

    servers: dict[int, ModelGearmand] = {}
    _handles = itertools.count(1)

    def __init__(self, port: int) -> None:
        self.port = port
        self.jobs: dict[str, Job] = {}  # by unique
        self.queue: list[Job] = []  # waiting, in order
        self.up = True
        self.connections: list[ModelHolder] = []
        ModelGearmand.servers[port] = self

    def submit(self, conn: ModelHolder, function: str, unique: str, data: bytes) -> str:
        job = self.jobs.get(unique)
        if job is None:
            job = self.jobs[unique] = Job(function, unique, data, f"H:{next(self._handles)}")
            self.queue.append(job)
        job.clients.append(conn)
        return job.handle

    def left(self, conn: ModelHolder) -> None:
        for job in list(self.jobs.values()):
            if conn in job.clients:
                job.clients = [c for c in job.clients if c is not conn]
                job.abandoned = job.abandoned or not job.clients
        self.connections = [c for c in self.connections if c is not conn]

    def grab(self, function: str) -> Job | None:
        """A receiver takes the next job of ``function`` (abandoned ones on
        the way are freed, unrun)."""
        for job in list(self.queue):
            if job.function != function:
                continue
            self.queue.remove(job)
            if job.abandoned:
                del self.jobs[job.unique]
                continue
            job.running = True
            return job
        return None

    def answer(self, job: Job, outcome: Outcome) -> None:
        """The receiver's answer, to every client attached."""
        self.jobs.pop(job.unique, None)
        for conn in job.clients:
            conn.heard(job.handle, outcome)

    def status(self, unique: str) -> tuple[bool, int]:
        job = self.jobs.get(unique)
        return (True, len(job.clients)) if job else (False, 0)

    def restart(self) -> None:
        """Killed and started again: every job gone, every connection broken."""
        self.jobs.clear()
        self.queue.clear()
        for conn in list(self.connections):
            conn.broke("gearmand restarted")
        self.connections.clear()

    def client_ids(self) -> set[str]:
        """What admin ``workers`` lists: every open connection's id."""
        return {c.client_id for c in self.connections}

    def waiting(self) -> list[Job]:
        """Jobs a receiver could still be given or is running."""
        return [j for j in self.jobs.values() if not j.abandoned or j.running]


class ModelHolder:
    """gearhorn.gearman.Holder against a ModelGearmand. A paused one reads
    nothing: what it is told waits in its inbox until :meth:`resume`."""

    def __init__(self, host, port, answered, on_lost, connect_timeout=5.0, tls=None,
                 vanished=None, client_id="") -> None:
        self.server = ModelGearmand.servers[port]
        self.client_id = client_id
        self.answered, self.on_lost = answered, on_lost
        self.vanished = vanished or (lambda copies: None)
        self.conn = types.SimpleNamespace(open=self._open, host=host, port=port)
        self.broken = ""
        self.paused = False
        self.inbox: list = []
        self._held: dict[str, object] = {}  # by handle
        self._opened = False

    def _open(self) -> None:
        if not self.server.up:
            raise Unavailable(f"gearmand {self.server.port} is away")
        if not self._opened:
            self._opened = True
            self.server.connections.append(self)

    def hold(self, copies, precedence="normal", timeout=60.0, ask_after=False) -> dict:
        if self.broken:
            raise Unavailable(f"gone: {self.broken}")
        self._open()
        for copy in copies:
            handle = self.server.submit(self, copy.function, copy.unique, copy.data)
            self._held[handle] = copy
        return {c.unique: self.server.status(c.unique) for c in copies} if ask_after else {}

    def live(self) -> list[str]:
        return [c.unique for c in self._held.values()]

    def held(self) -> int:
        return len(self._held)

    def probe(self, every, timeout=1.5) -> None:
        """A model gearmand answers every echo (a silent one is not modelled)."""

    def status(self, uniques, timeout=30.0) -> dict:
        if self.broken:
            raise Unavailable(f"gone: {self.broken}")
        self._open()
        return {u: self.server.status(u) for u in uniques}

    def verify(self, uniques) -> None:
        if self.broken:
            raise Unavailable(f"gone: {self.broken}")
        self._open()
        self._deliver(("verify", {u: self.server.status(u) for u in uniques}))

    def heard(self, handle: str, outcome: Outcome) -> None:
        self._deliver(("answer", handle, outcome))

    def resume(self) -> None:
        self.paused = False
        inbox, self.inbox = self.inbox, []
        for item in inbox:
            self._read(item)

    def _deliver(self, item) -> None:
        if self.broken:
            return  # a closed connection reads nothing more
        if self.paused:
            self.inbox.append(item)
        else:
            self._read(item)

    def _read(self, item) -> None:
        if item[0] == "lost":
            lost, self._held = list(self._held.values()), {}
            self.on_lost(lost, item[1])
            return
        if item[0] == "answer":
            copy = self._held.pop(item[1], None)
            if copy is not None:
                self.answered(copy, item[2])
            return
        gone = []
        for unique, (known, _) in item[1].items():
            handle = next((h for h, c in self._held.items() if c.unique == unique), None)
            if not known and handle is not None:
                gone.append(self._held.pop(handle))
        if gone:
            self.vanished(gone)

    def close(self, reason="closed", expected=False) -> None:
        self.broke(reason)

    def broke(self, reason: str) -> None:
        """The connection is gone; a paused holder reads what came before
        it first, once it resumes."""
        if self.broken:
            return
        self.broken = reason
        self.server.left(self)
        if self.paused:
            self.inbox.append(("lost", reason))
        else:
            self._read(("lost", reason))

    def die(self) -> None:
        """Its process is killed: the connection closes, nothing is read."""
        self.broken = self.broken or "killed"
        self.server.left(self)
        self.inbox.clear()
        self._held.clear()
