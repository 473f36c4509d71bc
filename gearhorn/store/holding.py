"""A process's held copies (``copies = held``): kept in Redis, handed to
gearmand as foreground jobs this process holds open, forgotten once their
receivers answer, handed again when a holding connection is lost, and
taken over from holders found dead (docs/design/held-copies.rst).

Why it is shaped so: docs/design/notes.rst, "gearhorn/store/holding.py".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from gearhorn import gearman
from gearhorn.gearman import Holder
from gearhorn.rules.auditcounts import Counts, bucket_of
from gearhorn.rules.naming import GIVEN_BACK
from gearhorn.runtime.background import Backoff, Outage
from gearhorn.store.beside import Beside
from gearhorn.store.durability import Durability
from gearhorn.store.forgets import Forgets
from gearhorn.store.fsync import ERRORS as BARRIER_ERRORS
from gearhorn.store.gearmands import Gearmands
from gearhorn.store.heldanswers import HeldAnswers
from gearhorn.store.heldcopies import (
    Fenced,
    HeldCopies,
    HeldCopy,
    key_of,
    mark_of,
    record_key,
)
from gearhorn.store.holders import Holders
from gearhorn.store.later import Later
from gearhorn.store.lease import HolderLease
from gearhorn.store.redisconn import REDIS_ERRORS
from gearhorn.store.takeover import Takeover

log = logging.getLogger(__name__)

# Enqueue buckets remembered for the audit's counts: past this many copies
# held at once, an answer counts as of an unknown bucket (credit: balance.py).
MOST_BORN = 500_000
FORGET_EVERY = 0.05  # seconds an answered copy's record may wait to be dropped
PROBE_EVERY = 0.5  # seconds between echoes that tell a silent gearmand
NO_DURABILITY = Durability()


class HoldingClient:
    """``submit_background`` through held copies; the rest of a
    ``gearman.Client`` (foreground calls, ``home``) is ``client``'s."""

    def __init__(self, client: gearman.Client, store: HeldCopies, holders: Holders,
                 process: str, ttl: float, interval: float,
                 tls: gearman.TlsFiles | None = None,
                 record: Callable[[str, str, str, int, str], None] | None = None,
                 durability: Durability = NO_DURABILITY,
                 clock: Callable[[], float] = time.monotonic,
                 counts: Counts | None = None) -> None:
        self.client, self.store = client, store
        self._clock = clock
        # (queue, copy key, status, generation, job handle) of each answer,
        # for the ledger: two answers in two generations, or under two job
        # handles, are the receiver running it twice
        self.record = record or (lambda queue, key, status, generation, handle: None)
        self.tls = tls
        self.durability = durability  # takes, hands again and forgets wait for its fsync
        self.lease = HolderLease(holders, process, ttl, interval, self._fenced, clock)
        self.takeover = Takeover(self, holders, store, clock)
        self.gearmands = Gearmands(client, self._new_holder, clock)
        self._lock = threading.Lock()
        self._fencing = threading.Lock()  # one new name at a time
        self.forgets = Forgets(store, durability, clock)  # answered: records to drop
        self.later = Later(self, clock)  # copies to hand in a while
        # The copy's own unique, by the one gearmand was given, where that is
        # a digest (a long unique): the ledger names a copy as its fanout did.
        self._own: dict[str, str] = {}
        # Foreground fanouts waiting for their copies' answers, by (queue, key)
        self._waiting: dict[tuple[str, str], HeldAnswers] = {}
        # The live audit's counts (gearhorn/rules/auditcounts.py): each copy
        # kept here counts as made in its enqueue bucket, remembered by its
        # record key until its answer counts it settled in the same one.
        self.counts = counts
        # Keyed by the record's key alone (unique across queues: it holds the
        # message id), a str: a dict of str to int is never tracked by the
        # garbage collector; with a tuple a copy, a backlog of a million
        # held copies cost the pool a quarter of its CPU in collections.
        self._born: dict[str, int] = {}
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gearhorn-holding", daemon=True)

    def __getattr__(self, name: str) -> object:
        return getattr(self.client, name)

    @property
    def holder_id(self) -> str:
        return self.lease.name

    def beside(self, client: gearman.Client) -> Beside:
        """``client`` (another thread's) with its background copies held here."""
        return Beside(self, client)

    def start(self) -> HoldingClient:
        """Register as a new holder (Redis must answer), then hold."""
        self.takeover.holders.adopt_old_index()
        self.lease.register()
        self.lease.start()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop handing copies and let go of those held: this holder fences
        itself, so that another takes the records over at once, attaching
        to the jobs still in gearmand; then it closes its connections (a
        while later at most: gearmand drops what no taker attached to)."""
        self._stopping.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(10)
        self.lease.stop()
        name, holders = self.holder_id, self.takeover.holders
        try:
            holders.retire(name)
            # Waited for while another holder lives to take them over: when the
            # whole pool stops at once, the last ones to retire have none (each
            # waited a whole ttl for a taker that was itself stopping).
            deadline = self._clock() + self.lease.ttl
            while (self._clock() < deadline and holders.listed(name)
                   and holders.others_alive(name)):
                self._stopping.wait(0.1)
        except REDIS_ERRORS as exc:  # its lease ends by itself
            log.warning("could not retire holder %s: %s", name, exc)
        self._close_all("stopping: another holder takes them over")

    def submit_background(self, copies: Sequence[gearman.Copy],
                          precedence: str = "normal") -> int:
        """Keep ``copies`` and hand them to gearmand. A gearmand that is away
        loses nothing: the records stay, and go to it once it is back."""
        self._keep_and_hand(copies, precedence)
        return len(copies)

    def start_foreground(self, copies: Sequence[gearman.Copy],
                         precedence: str = "normal") -> HeldAnswers:
        """Keep and hand ``copies`` as :meth:`submit_background` does; their
        answers come with :meth:`HeldAnswers.wait`. One not answered in time
        stays held, as safe as a background one, and goes to its receiver later."""
        self._forget()  # a copy tried again was answered: its old record goes first
        answers = HeldAnswers(self._waiting, self._lock,
                              [(c.function, record_key(c.unique)) for c in copies])
        with self._lock:
            self._waiting.update(dict.fromkeys(answers.keys, answers))
        try:
            self._keep_and_hand(copies, precedence)
        except REDIS_ERRORS:
            answers.let_go()
            raise
        return answers

    def submit_foreground(self, copies: Sequence[gearman.Copy], timeout: float,
                          precedence: str = "normal") -> list[gearman.Outcome]:
        return self.start_foreground(copies, precedence).wait(timeout)

    def _keep_and_hand(self, copies: Sequence[gearman.Copy], precedence: str) -> None:
        for _ in range(3):  # a fenced holder comes back under a new name
            name = self.holder_id
            if not name:
                raise Fenced("this holder is registering again: try again")
            held = [HeldCopy(c.function, c.unique, c.data, name, precedence) for c in copies]
            try:
                kept = self.store.keep(held)
            except Fenced:
                self._fenced(name)
                continue
            except REDIS_ERRORS:
                # Some records may be written: a retry of the fanout leaves them
                # to their holder (this one), which hands them in a while.
                self.lease.troubled()
                self.later.unhanded(held)
                raise
            if self.counts is not None:
                self._count_made(kept)
            if self.lease.fresh():
                self.hand(kept)
            else:  # a lease not renewed in time may be another's: hand once it is
                self.later.unhanded(kept)
            return
        raise Fenced(f"holder {self.holder_id} keeps being fenced")

    def _count_made(self, kept: Sequence[HeldCopy]) -> None:
        bucket, born, made = bucket_of(time.time_ns() // 1_000_000), self._born, []
        room = len(born) < MOST_BORN
        for copy in kept:
            key = copy.key
            if key not in born:  # a retry's copy counts once
                if room:
                    born[key] = bucket
                made.append(copy.queue)
        self.counts.made_many(made, bucket)

    def hand(self, held: Sequence[HeldCopy], precedence: str | None = None,
             servers: Sequence[int | None] | None = None,
             said: dict[str, tuple[bool, int]] | None = None) -> None:
        """``held`` to gearmand: each to ``servers``' entry where given (the
        server its job is on), else its home; at its own precedence unless
        ``precedence`` is given. ``said``: filled with what gearmand says of
        each job just after (Gearmands.hold)."""
        self.later.handed(held)
        parts: dict[tuple[int, str], list[gearman.Copy]] = {}
        for n, copy in enumerate(held):
            handed = copy.handed()
            if copy.key != copy.unique:
                with self._lock:
                    self._own[handed.unique] = copy.unique
            server = servers[n] if servers is not None else None
            home = self.client.home(copy.queue) if server is None else server
            parts.setdefault((home, precedence or copy.precedence), []).append(handed)
        for (home, precedence), jobs in parts.items():
            if not self.gearmands.hold(home, jobs, precedence, said):
                # However it broke (even before this call, unnoticed), the
                # server's copies are handed again once it answers: these too.
                self._wake.set()

    def _new_holder(self, index: int) -> Holder:
        conn, name = self.client.connections[index], self.holder_id
        return Holder(conn.host, conn.port, self._answered_by, self._lost_on(index, name),
                      tls=self.tls, vanished=self._vanished, client_id=name)

    def _answered_by(self, copy: gearman.Copy, outcome: gearman.Outcome) -> None:
        held = (copy.function, key_of(copy.unique))
        pending = (*held, mark_of(copy.unique))
        refused = outcome.status == "refused"  # its record stays: handed again in a while
        given_back = outcome.status == "exception" and outcome.data == GIVEN_BACK
        if refused:
            log.debug("gearmand refused held copy %s of %s: %s", copy.unique, copy.function,
                      outcome.reason)
        self.takeover.settled(held)
        with self._lock:
            own = self._own.pop(copy.unique, None) or held[1]
            if refused:
                self.later.again([pending])
            elif given_back:  # a bridge's client left it unacked: first in line again
                self.later.given_back(pending)
            else:
                self.forgets.add(copy.function, copy.unique)
            # A refused one is told at once (not after the fanout's timeout);
            # a given-back one is still awaited (it comes again).
            waiting = None if given_back else self._waiting.pop(held, None)
        if not (refused or given_back):
            self.record(copy.function, own, outcome.status, mark_of(copy.unique),
                        outcome.handle.decode(errors="replace"))
            if self.counts is not None:
                self.counts.settled(copy.function, self._born.pop(held[1], None),
                                    time.time_ns() // 1_000_000)
        if waiting is not None:  # after the record's forgetting is queued: a retry follows it
            waiting.settle(held, outcome)
        self._wake.set()

    def _vanished(self, copies: list[gearman.Copy]) -> None:
        """Jobs gearmand lost unanswered (attached to as they were abandoned)."""
        log.info("%d held copies vanished from gearmand unanswered: handed again",
                 len(copies))
        self.later.again((c.function, key_of(c.unique), mark_of(c.unique)) for c in copies)
        self._wake.set()

    def _lost_on(self, index: int, name: str) -> Callable[[list[gearman.Copy], str], None]:
        def lost(copies: list[gearman.Copy], reason: str) -> None:
            with self._lock:
                for copy in copies:  # handed again, each under a new unique
                    self._own.pop(copy.unique, None)
                if self._stopping.is_set() or name != self.holder_id:
                    return  # stopping, or fenced: another holder has them
            self.gearmands.lose(index)
            self._wake.set()
        return lost

    # -- fenced -----------------------------------------------------------------

    def _fenced(self, name: str) -> None:
        """``name`` was taken for dead: let go of everything it held (gearmand
        drops the jobs no taker attached to: the taker hands those) and come
        back as a new holder. Answers read meanwhile are still forgotten."""
        with self._fencing:
            if name == self.holder_id:
                self._let_go_of(name)

    def _let_go_of(self, name: str) -> None:
        # Its connections stay open until its taker attached to their jobs
        # (closed, they would let gearmand drop the jobs receivers run).
        self.gearmands.retire(name)
        self.later.clear()
        self._born.clear()  # its copies are a taker's now: their answers' buckets unknown
        log.warning("holder %s was taken for dead (paused, or cut off from Redis, for over "
                    "its lease of %gs): its copies are another holder's now; it holds on as "
                    "a new holder, and lets go of its old connections once they are taken "
                    "over", name, self.lease.ttl)
        self.takeover.forget_all()
        self.lease.name = ""  # no copy is kept under a name until the new one
        try:
            self.lease.register()
        except REDIS_ERRORS as exc:
            log.warning("could not register again (%s): will try again", exc)
            self.lease.troubled()
    def _close_all(self, reason: str) -> None:
        for holder in self.gearmands.let_go() + self.gearmands.retired():
            holder.close(reason, expected=True)

    # -- the thread -------------------------------------------------------------

    def _run(self) -> None:
        outage, backoff = Outage(log, "held copies"), Backoff(0.1)
        while not self._stopping.is_set():
            self._wake.wait(FORGET_EVERY)
            self._wake.clear()
            try:
                self.step()
                outage.succeeded()
                backoff.succeeded()
            except Fenced:
                self._fenced(self.holder_id)
            except (*REDIS_ERRORS, *BARRIER_ERRORS, gearman.GearmanError) as exc:
                self.lease.troubled()
                outage.failed(exc)
                self._stopping.wait(backoff.failed())

    def step(self) -> None:
        """One turn of the holding thread: forget what was answered, hand
        again what must go again, look for the dead."""
        if not self.holder_id:  # registering again failed: try once more
            self.lease.register()
        self._forget()
        self.gearmands.probe(PROBE_EVERY)
        self.later.hand_given_back()
        self._hand_again()
        self.takeover.tick()
        self.later.hand_due()
        if self.gearmands.close_retired(self.takeover.holders.listed):
            self._forget()  # what they read last: before a taker hands those again

    def _forget(self) -> None:
        self.forgets.flush()

    def _hand_again(self) -> None:
        """For each server whose connection broke: once it takes one again,
        every copy of this holder's that no connection holds now, as its
        next generation; while it stays away, those copies go to the servers
        that are up (once: what they hold stays with them)."""
        for index in self.gearmands.due():
            probe = self.gearmands.reconnect(index)
            if probe is None:
                self._reroute(index)
            else:
                self._rehand(index, probe)

    def _reroute(self, index: int) -> None:
        if not self.gearmands.reroute(index):
            return  # done already, or no server is up: the copies wait in Redis
        try:
            moved = self._hand_not_live(set())
        except BaseException:
            self.gearmands.unroute(index)
            raise
        if moved:
            log.info("%d held copies handed to the servers that are up", moved)

    def _rehand(self, index: int, probe: Holder) -> None:
        fresh = self.gearmands.adopt(index, probe)
        try:
            moved = self._hand_not_live(fresh)
        except BaseException:
            # Let the new connection go too (gearmand drops its jobs) and
            # read them all again next round: never a copy left behind.
            probe.close("reading the copies to hand again failed")
            self.gearmands.lose(index)
            raise
        finally:
            self.gearmands.adopted(index)
        if moved:
            conn = probe.conn
            log.info("gearmand %s:%s: %d held copies handed again", conn.host, conn.port, moved)

    def _hand_not_live(self, fresh: set[str]) -> int:
        """Every copy of this holder's that no connection holds (nor took
        meanwhile: ``fresh``), as its next generation; how many."""
        name = self.holder_id
        found = list(self.store.held_by(name))
        live = self.gearmands.live()  # read after the records: none handed before is missed
        with self._lock:
            copies = [c for c in found if c.key not in live and c.key not in fresh]
        self.later.hand_next(copies, name)
        return len(copies)
