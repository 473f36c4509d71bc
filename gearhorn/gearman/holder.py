"""Foreground jobs held open on one gearmand connection, and their answers.

Why it is shaped so: docs/design/notes.rst, "gearhorn/gearman/holder.py".
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from gearhorn.gearman.connection import (
    REPLY_TIMEOUT,
    SLOW_LIMIT,
    Connection,
    TlsFiles,
    foreground_jobs,
    reachable,
)
from gearhorn.gearman.packets import (
    Answers,
    Copy,
    GearmanError,
    Outcome,
    P,
    Packet,
    Unavailable,
    encode,
)

log = logging.getLogger(__name__)

Answered = Callable[[Copy, Outcome], None]
Lost = Callable[[list[Copy], str], None]
Status = tuple[bool, int]  # GET_STATUS_UNIQUE: is the job known, how many clients wait for it
ECHO_MARK = b"gearhorn-status"  # ends each ask: gear.Server answers no status, but an echo
STATUS_TIMEOUT = 30.0  # seconds an ask waits for its echo (a broken connection ends it)


class _Ask:
    """One GET_STATUS_UNIQUE batch on this connection (none: a probe), until
    its echo."""

    def __init__(self, uniques: Sequence[str], verify: bool) -> None:
        self.uniques, self.verify = list(uniques), verify
        self.found: dict[str, Status] = {}
        self.done = threading.Event()
        self.sent = self.first_sent = time.monotonic()


class Holder:
    """Holds foreground jobs on one connection to the gearmand at ``host``:``port``.

    ``answered(copy, outcome)`` is called, from the reader thread, for each
    job that ended (and for one gearmand refused, with status ``refused``);
    ``on_lost(copies, reason)`` once, when the connection broke or was
    closed, with every copy not yet answered; ``vanished(copies)`` for the
    copies a :meth:`verify` found gone from gearmand unanswered.
    """

    def __init__(self, host: str, port: int, answered: Answered, on_lost: Lost,
                 connect_timeout: float = 5.0, tls: TlsFiles | None = None,
                 vanished: Callable[[list[Copy]], None] | None = None,
                 client_id: str = "") -> None:
        self.conn = Connection(host, port, connect_timeout, tls, client_id=client_id)
        self.answered, self.on_lost = answered, on_lost
        self.vanished = vanished or (lambda copies: None)
        self._asks: deque[_Ask] = deque()  # sent, in order; each ends with its echo
        self._probe: _Ask | None = None  # the last echo sent to see gearmand is there
        self._handles: dict[str, bytes] = {}  # the handle of each held job, by unique
        self._writing = threading.Lock()
        self._changed = threading.Condition()
        self._awaiting: deque[Copy] = deque()  # sent; gearmand answers JOB_CREATED in order
        self._held: dict[bytes, Copy] = {}  # by job handle
        self._sent = self._created = 0  # copies written, and created or refused
        self.broken = ""  # why the connection is gone ("" while it holds)
        self._reader: threading.Thread | None = None

    def hold(self, copies: Sequence[Copy], precedence: str = "normal",
             timeout: float = REPLY_TIMEOUT, ask_after: bool = False) -> dict[str, Status]:
        """Submit ``copies`` as foreground jobs in one write; return once
        gearmand created (or refused) every one. Raises Unavailable when the
        connection is gone or breaks first, or gearmand creates none for
        ``timeout`` seconds (a silent gearmand: see connection.REPLY_TIMEOUT):
        the copies not created are then among those :attr:`on_lost` is told.

        ``ask_after``: GET_STATUS_UNIQUE of each goes in the same write, right
        behind the submissions, and what gearmand said is returned: how many
        clients wait for the job just after this one's submission joined it."""
        if not copies:
            return {}
        ask = _Ask([c.unique for c in copies], verify=False) if ask_after else None
        with self._writing:
            if self.broken:
                raise Unavailable(f"holder of gearmand {self.conn.host}:{self.conn.port} "
                                  f"is gone: {self.broken}")
            try:
                self.conn.open()
            except GearmanError as exc:
                self._lose(str(exc))
                raise Unavailable(str(exc)) from None
            self._start_reader()
            packets = foreground_jobs(copies, precedence)
            with self._changed:
                self._awaiting.extend(copies)
                self._sent += len(copies)
                target = self._sent
                if ask is not None:
                    self._asks.append(ask)
                    packets += _status_packets(ask.uniques)
            try:
                self.conn.send(packets)
            except GearmanError as exc:
                self._lose(str(exc))
                raise Unavailable(str(exc)) from None
        reason = self._wait_created(target, timeout)
        if reason:
            self.close(reason)
            raise Unavailable(reason)
        if ask is None:
            return {}
        ask.done.wait(STATUS_TIMEOUT)  # what gearmand knows follows its JOB_CREATED
        return dict(ask.found)

    def _wait_created(self, target: int, timeout: float) -> str:
        """"" once gearmand created the jobs up to ``target``; else why not:
        the connection broke, or nothing came for ``timeout`` and gearmand's
        host takes no new connection either (a slow one is waited for)."""
        started = time.monotonic()
        while True:
            with self._changed:
                seen = self._created
                self._changed.wait_for(lambda seen=seen: self._created >= target
                                       or self.broken or self._created != seen, timeout)
                if self._created >= target or self.broken:
                    return self.broken
                if self._created != seen:
                    continue
            if not reachable(self.conn.host, self.conn.port):
                return (f"gearmand created no job for {timeout:.3g}s and its host takes no "
                        f"connection: taken for gone")
            if time.monotonic() - started > SLOW_LIMIT:
                return f"gearmand created no job for {SLOW_LIMIT:g}s: taken for gone"

    def live(self) -> list[str]:
        """The uniques of the jobs this connection holds or is handing now."""
        with self._changed:
            return [c.unique for c in self._held.values()] + [c.unique for c in self._awaiting]

    def held(self) -> int:
        """How many jobs this connection holds (created, not answered)."""
        with self._changed:
            return len(self._held)

    def status(self, uniques: Sequence[str],
               timeout: float = STATUS_TIMEOUT) -> dict[str, Status]:
        """What gearmand says of each job (by its unique): (known, clients
        waiting). A unique left out: the server does not answer
        GET_STATUS_UNIQUE (gear.Server), or did not in ``timeout``."""
        ask = self._ask(uniques, verify=False)
        ask.done.wait(timeout)
        return dict(ask.found)

    def verify(self, uniques: Sequence[str]) -> None:
        """Ask after jobs this connection holds; any gearmand no longer knows
        with no answer read before is told to ``vanished`` (gearmand answers
        in order: an answer comes before a status that no longer knows it).
        It happens to a job attached to in the instant it was abandoned."""
        self._ask(uniques, verify=True)

    def probe(self, every: float, timeout: float = REPLY_TIMEOUT) -> None:
        """An echo every ``every`` seconds; one unanswered for ``timeout``
        while gearmand's host takes no new connection means a silent
        gearmand (its node lost, its cable pulled): the connection is let go
        at once, not after TCP's 10 s, so no copy is handed to it meanwhile
        (its copies go to the others). A host that takes one has a slow
        server: let go only after SLOW_LIMIT."""
        probe = self._probe
        if self.broken or not self.conn.is_open:
            return
        if probe is not None and not probe.done.is_set():
            if time.monotonic() - probe.sent > timeout:
                if time.monotonic() - probe.first_sent >= SLOW_LIMIT:
                    self.close(f"gearmand answered no echo for {SLOW_LIMIT:g}s: taken for gone")
                elif reachable(self.conn.host, self.conn.port):
                    probe.sent = time.monotonic()  # only slow: its echo is awaited again
                else:
                    self.close(f"gearmand answered no echo for {timeout:g}s and its host "
                               f"takes no connection: taken for gone")
            return
        if probe is None or time.monotonic() - probe.sent >= every:
            with contextlib.suppress(Unavailable):
                self._probe = self._ask([], verify=False, probe=True)

    def _ask(self, uniques: Sequence[str], verify: bool, probe: bool = False) -> _Ask:
        ask = _Ask(uniques, verify)
        if not uniques and not probe:
            ask.done.set()
            return ask
        packets = _status_packets(ask.uniques)
        with self._writing:
            if self.broken:
                raise Unavailable(f"holder of gearmand {self.conn.host}:{self.conn.port} "
                                  f"is gone: {self.broken}")
            try:
                self.conn.open()
                self._start_reader()
                with self._changed:
                    self._asks.append(ask)
                self.conn.send(packets)
            except GearmanError as exc:
                self._lose(str(exc))
                raise Unavailable(str(exc)) from None
        return ask

    def close(self, reason: str = "closed", expected: bool = False) -> None:
        """Let go of every job: :attr:`on_lost` is told them (``expected``:
        a stop, logged as such, not as a fault)."""
        self._lose(reason, expected)

    def _start_reader(self) -> None:
        if self._reader is None:
            self._reader = threading.Thread(target=self._read, daemon=True,
                                            name=f"gearhorn-holder-{self.conn.port}")
            self._reader.start()

    def _read(self) -> None:
        answers = Answers()
        try:
            while not self.broken:
                packets = self.conn.read_all()
                if not packets:
                    raise GearmanError("gearmand closed the connection")
                self._heard(packets, answers)
        except (GearmanError, OSError) as exc:
            self._lose(str(exc))

    def _heard(self, packets: list[Packet], answers: Answers) -> None:
        """Each packet in order; the replies to submissions under one lock
        (a batch's JOB_CREATED come together: one wake-up for them all)."""
        refused, ended, vanished = [], [], []
        with self._changed:
            for packet in packets:
                if packet.type in (P.JOB_CREATED, P.ERROR):
                    if not self._awaiting:  # not ours: an answer to no submission
                        continue
                    copy = self._awaiting.popleft()
                    self._created += 1
                    if packet.type == P.JOB_CREATED:
                        self._held[packet.args[0]] = copy
                        self._handles[copy.unique] = packet.args[0]
                    else:  # the job was not made (a full queue, say)
                        refused.append((copy, b": ".join(packet.args).decode(errors="replace")))
                elif packet.type in (P.STATUS_RES_UNIQUE, P.ECHO_RES):
                    self._heard_status(packet, vanished)
                elif ((outcome := answers.heard(packet)) is not None
                      and (copy := self._held.pop(packet.args[0], None)) is not None):
                    self._handles.pop(copy.unique, None)
                    ended.append((copy, outcome))
            self._changed.notify_all()
        for copy, said in refused:
            self.answered(copy, Outcome("refused", reason=f"gearmand refused it: {said}"))
        for copy, outcome in ended:
            self.answered(copy, outcome)
        if vanished:
            self.vanished(vanished)

    def _heard_status(self, packet: Packet, vanished: list[Copy]) -> None:
        """A status or the echo that ends an ask (under ``_changed``)."""
        if not self._asks:
            return
        ask = self._asks[0]
        if packet.type == P.ECHO_RES:
            if packet.args and packet.args[0] == ECHO_MARK:
                self._asks.popleft()
                ask.done.set()
            return
        unique = packet.args[0].rstrip(b"\0").decode(errors="replace")
        try:
            status = (packet.args[1].rstrip(b"\0") == b"1", int(packet.args[5]))
        except (IndexError, ValueError):
            return
        ask.found[unique] = status
        handle = self._handles.pop(unique, None) if ask.verify and not status[0] else None
        if handle is not None and (copy := self._held.pop(handle, None)) is not None:
            vanished.append(copy)

    def _lose(self, reason: str, expected: bool = False) -> None:
        with self._changed:
            if self.broken:
                return
            self.broken = reason or "lost"
            lost = list(self._held.values()) + list(self._awaiting)
            self._held.clear()
            self._handles.clear()
            self._awaiting.clear()
            for ask in self._asks:
                ask.done.set()
            self._asks.clear()
            self._changed.notify_all()
        self.conn.shutdown()  # wakes the reader, and gearmand sees the holder go
        if lost:
            log.log(logging.INFO if expected else logging.WARNING,
                    "gearmand %s:%s: let go of the connection holding %d jobs (%s); they "
                    "go again under new uniques", self.conn.host, self.conn.port,
                    len(lost), reason)
        self.on_lost(lost, self.broken)


def _status_packets(uniques: Sequence[str]) -> bytes:
    """GET_STATUS_UNIQUE of each, then the echo that ends the ask."""
    return (b"".join(encode(P.GET_STATUS_UNIQUE, u.encode()) for u in uniques)
            + encode(P.ECHO_REQ, ECHO_MARK))
