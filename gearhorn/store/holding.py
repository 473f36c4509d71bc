"""A worker process's held copies (``copies = held``): kept in Redis, handed
to gearmand as foreground jobs this process holds open, forgotten once
their receivers answer, and handed again when a holding connection is lost
or a holder dies (docs/design/gearmand.rst, "Held copies").

Why it is shaped so: docs/design/notes.rst, "gearhorn/store/holding.py".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from gearhorn import gearman
from gearhorn.gearman import Holder
from gearhorn.rules.naming import GIVEN_BACK
from gearhorn.runtime.background import Backoff, Outage
from gearhorn.store.heldcopies import HeldCopies, HeldCopy, key_of
from gearhorn.store.redisconn import REDIS_ERRORS

log = logging.getLogger(__name__)

TAKEOVER_EVERY = 1.0  # seconds between looks for dead holders
AGAIN_EVERY = 1.0  # seconds before copies refused (or not handed) are handed again
RECONNECT_EVERY = 0.5  # seconds between tries of a gearmand that is away
FORGET_EVERY = 0.05  # seconds an answered copy's record may wait to be dropped


class HoldingClient:
    """``submit_background`` through held copies; the rest of a
    ``gearman.Client`` (foreground calls, ``home``) is ``client``'s."""

    def __init__(self, client: gearman.Client, store: HeldCopies, holder_id: str,
                 alive: Callable[[], list[str]],
                 tls: gearman.TlsFiles | None = None,
                 record: Callable[[str, str, str], None] | None = None) -> None:
        self.client, self.store, self.holder_id = client, store, holder_id
        self.alive = alive  # the ids of the holders (workers) alive now
        # (queue, copy key, status) of each answer, for the ledger
        self.record = record or (lambda queue, key, status: None)
        self.tls = tls
        self._lock = threading.Lock()
        self._holders: dict[int, Holder] = {}  # by index in client.connections
        self._lost: set[int] = set()  # servers whose copies are to be handed again
        self._retry_at: dict[int, float] = {}  # a lost server's next try, while away
        self._rerouted: set[int] = set()  # away servers whose copies went to the others
        # While a server's copies are read to be handed again: the keys
        # handed to its new connection meanwhile (not to be handed twice).
        self._fresh: dict[int, set[str]] = {}
        self._answered: list[tuple[str, str]] = []
        # (queue, key) of copies to hand again in a while: gearmand refused
        # them, or their write failed half-way
        self._again: list[tuple[str, str]] = []
        # (queue, key) of copies a bridge gave back, in order: handed again at once
        self._given_back: list[tuple[str, str]] = []
        self._said_again = -60.0  # when the last warning of copies handed again went
        # The copy's own unique, by the one gearmand was given, where that is
        # a digest (a long unique): the ledger names a copy as its fanout did.
        self._own: dict[str, str] = {}
        # Foreground fanouts waiting for their copies' answers, by (queue, key)
        self._waiting: dict[tuple[str, str], HeldAnswers] = {}
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gearhorn-holding", daemon=True)

    def __getattr__(self, name: str) -> object:
        return getattr(self.client, name)

    def beside(self, client: gearman.Client) -> Beside:
        """``client`` (another thread's) with its background copies held here."""
        return Beside(self, client)

    def start(self) -> HoldingClient:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop handing copies and let go of those held: gearmand drops their
        jobs, and another holder takes the records over once this one's
        heartbeat is gone (not before: no copy is held twice)."""
        self._stopping.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(10)
        with self._lock:
            holders = list(self._holders.values())
        for holder in holders:
            holder.close("stopping: another holder takes them over", expected=True)

    def submit_background(self, copies: Sequence[gearman.Copy],
                          precedence: str = "normal") -> int:
        """Keep ``copies`` and hand them to gearmand. A gearmand that is away
        loses nothing: the records stay, and go to it once it is back."""
        self._keep_and_hand([HeldCopy(c.function, c.unique, c.data, self.holder_id, precedence)
                             for c in copies])
        return len(copies)

    def start_foreground(self, copies: Sequence[gearman.Copy],
                         precedence: str = "normal") -> HeldAnswers:
        """Keep and hand ``copies`` as :meth:`submit_background` does; their
        answers come with :meth:`HeldAnswers.wait`. One not answered in time
        stays held, as safe as a background one, and goes to its receiver later."""
        self._forget()  # a copy tried again was answered: its old record goes first
        held = [HeldCopy(c.function, c.unique, c.data, self.holder_id, precedence)
                for c in copies]
        answers = HeldAnswers(self, [(c.queue, c.key) for c in held])
        with self._lock:
            self._waiting.update(dict.fromkeys(answers.keys, answers))
        try:
            self._keep_and_hand(held)
        except REDIS_ERRORS:
            answers.let_go()
            raise
        return answers

    def submit_foreground(self, copies: Sequence[gearman.Copy], timeout: float,
                          precedence: str = "normal") -> list[gearman.Outcome]:
        return self.start_foreground(copies, precedence).wait(timeout)

    def _keep_and_hand(self, held: Sequence[HeldCopy]) -> None:
        try:
            kept = self.store.keep(held)
        except REDIS_ERRORS:
            # Some records may be written: a retry of the fanout leaves them
            # to their holder (this one), which hands them in a while.
            with self._lock:
                self._again += [(c.queue, c.key) for c in held]
            raise
        self._hand(kept)

    def _hand(self, held: Sequence[HeldCopy], precedence: str | None = None) -> None:
        """``held`` to their home gearmand, at their own precedence unless
        ``precedence`` is given."""
        parts: dict[tuple[int, str], list[gearman.Copy]] = {}
        for copy in held:
            handed = copy.handed()
            if copy.key != copy.unique:
                with self._lock:
                    self._own[handed.unique] = copy.unique
            at = (self.client.home(copy.queue), precedence or copy.precedence)
            parts.setdefault(at, []).append(handed)
        for (home, precedence), jobs in parts.items():
            index = self._up_from(home)
            holder = None if index is None else self._holder(index, jobs)
            if holder is None:
                continue  # every server is away: the copies wait in Redis
            try:
                holder.hold(jobs, precedence)
            except gearman.GearmanError:
                # However it broke (even before this call, unnoticed), the
                # server's copies are handed again once it answers: these too.
                with self._lock:
                    self._lost.add(index)
                self._wake.set()

    def _up_from(self, home: int) -> int | None:
        """``home``, or while its connection is lost the next server that is
        not (a queue's consumers read every server, as gearmand's own
        failover has them: a held copy waits for no one server)."""
        count = len(self.client.connections)
        with self._lock:
            return next(((home + n) % count for n in range(count)
                         if (home + n) % count not in self._lost), None)

    def _live(self) -> set[str]:
        """The keys of the copies some connection holds, or is handing, now."""
        with self._lock:
            holders = [h for h in self._holders.values() if not h.broken]
        return {key_of(unique) for holder in holders for unique in holder.live()}

    def _holder(self, index: int, jobs: Sequence[gearman.Copy]) -> Holder | None:
        with self._lock:
            if index in self._lost:
                return None
            if index in self._fresh:
                self._fresh[index].update(key_of(job.unique) for job in jobs)
            holder = self._holders.get(index)
            if holder is None or holder.broken:
                conn = self.client.connections[index]
                holder = self._holders[index] = Holder(
                    conn.host, conn.port, self._answered_by, self._lost_on(index),
                    tls=self.tls)
            return holder

    def _answered_by(self, copy: gearman.Copy, outcome: gearman.Outcome) -> None:
        held = (copy.function, key_of(copy.unique))
        refused = outcome.status == "refused"  # its record stays: handed again in a while
        given_back = outcome.status == "exception" and outcome.data == GIVEN_BACK
        if refused:
            log.debug("gearmand refused held copy %s of %s: %s", copy.unique, copy.function,
                      outcome.reason)
        with self._lock:
            own = self._own.pop(copy.unique, None) or held[1]
            if refused:
                self._again.append(held)
            elif given_back:  # a bridge's client left it unacked: first in line again
                self._given_back.append(held)
            else:
                self._answered.append((copy.function, copy.unique))
            # A refused one is told at once (not after the fanout's timeout);
            # a given-back one is still awaited (it comes again).
            waiting = None if given_back else self._waiting.pop(held, None)
        if not (refused or given_back):
            self.record(copy.function, own, outcome.status)
        if waiting is not None:  # after the record's forgetting is queued: a retry follows it
            waiting.settle(held, outcome)
        self._wake.set()

    def _lost_on(self, index: int) -> Callable[[list[gearman.Copy], str], None]:
        def lost(copies: list[gearman.Copy], reason: str) -> None:
            with self._lock:
                for copy in copies:  # handed again, each under a new unique
                    self._own.pop(copy.unique, None)
                if self._stopping.is_set():
                    return
                self._lost.add(index)
            self._wake.set()
        return lost

    # -- the thread -------------------------------------------------------------

    def _run(self) -> None:
        outage, backoff = Outage(log, "held copies"), Backoff(0.1)
        next_look = next_again = 0.0
        while not self._stopping.is_set():
            self._wake.wait(FORGET_EVERY)
            self._wake.clear()
            try:
                self._forget()
                self._hand_given_back()
                self._hand_again()
                next_look = self._take_over_dead(next_look)
                next_again = self._hand_later(next_again)
                outage.succeeded()
                backoff.succeeded()
            except (*REDIS_ERRORS, gearman.GearmanError) as exc:
                outage.failed(exc)
                self._stopping.wait(backoff.failed())

    def _forget(self) -> None:
        with self._lock:
            answered, self._answered = self._answered, []
        try:
            self.store.forget(answered)
        except REDIS_ERRORS:
            with self._lock:
                self._answered[:0] = answered
            raise

    def _hand_again(self) -> None:
        """For each server whose connection broke: once it takes one again,
        every copy of this holder's that no connection holds now, as its
        next generation; while it stays away, those copies go to the servers
        that are up (once: what they hold stays with them)."""
        now = time.monotonic()
        with self._lock:
            due = [i for i in sorted(self._lost) if self._retry_at.get(i, 0.0) <= now]
        for index in due:
            probe = self._reconnect(index)
            if probe is None:
                self._reroute(index)
            else:
                self._rehand(index, probe)

    def _reconnect(self, index: int) -> Holder | None:
        """A new connection to server ``index``, or None while it is away."""
        conn = self.client.connections[index]
        probe = Holder(conn.host, conn.port, self._answered_by, self._lost_on(index),
                       tls=self.tls)
        try:
            probe.conn.open()
        except gearman.GearmanError as exc:
            with self._lock:
                first = index not in self._retry_at
                self._retry_at[index] = time.monotonic() + RECONNECT_EVERY
            if first:
                log.warning("gearmand %s:%s is away (%s): the held copies it had go to the "
                            "servers that are up, if any, until it is back", conn.host,
                            conn.port, exc)
            return None
        with self._lock:
            self._retry_at.pop(index, None)
        return probe

    def _reroute(self, index: int) -> None:
        if self._up_from(index) is None:
            return  # no server is up: the copies wait in Redis
        with self._lock:
            if index in self._rerouted:
                return
            self._rerouted.add(index)
        try:
            moved = self._hand_not_live(set())
        except BaseException:
            with self._lock:
                self._rerouted.discard(index)
            raise
        if moved:
            log.info("%d held copies handed to the servers that are up", moved)

    def _rehand(self, index: int, probe: Holder) -> None:
        with self._lock:  # new copies go to it from now on: none falls between
            self._holders[index] = probe
            self._lost.discard(index)
            self._rerouted.discard(index)
            fresh = self._fresh[index] = set()
        try:
            moved = self._hand_not_live(fresh)
        except BaseException:
            # Let the new connection go too (gearmand drops its jobs) and
            # read them all again next round: never a copy left behind.
            probe.close("reading the copies to hand again failed")
            with self._lock:
                self._lost.add(index)
            raise
        finally:
            with self._lock:
                self._fresh.pop(index, None)
        if moved:
            conn = probe.conn
            log.info("gearmand %s:%s: %d held copies handed again", conn.host, conn.port, moved)

    def _hand_not_live(self, fresh: set[str]) -> int:
        """Every copy of this holder's that no connection holds (nor took
        meanwhile: ``fresh``), as its next generation; how many."""
        found = list(self.store.held_by(self.holder_id))
        live = self._live()  # read after the records: none handed before is missed
        with self._lock:
            copies = [c for c in found if c.key not in live and c.key not in fresh]
        moved = self.store.hand_over(copies, self.holder_id)
        self._hand(moved)
        return len(moved)

    def _hand_given_back(self) -> None:
        """The copies bridges gave back, as their next generation, ahead of
        newer ones (high precedence) and in the order given back."""
        self._hand(self._next_generation(self._given_back), precedence="high")

    def _hand_later(self, next_try: float) -> float:
        """The copies gearmand refused (its queue full: ``maxqueue``) or that
        were written but not handed, as their next generation, once a
        while: the records wait meanwhile. Only those still this holder's."""
        now = time.monotonic()
        if now < next_try:
            return next_try
        moved = self._next_generation(self._again)
        if moved:  # said once a minute while a queue stays full, not every second
            loud = now - self._said_again >= 60
            self._said_again = now if loud else self._said_again
            log.log(logging.WARNING if loud else logging.DEBUG,
                    "%d held copies handed again (refused by gearmand: a full queue?, "
                    "or not handed when written)", len(moved))
        self._hand(moved)
        return now + AGAIN_EVERY

    def _next_generation(self, pending: list[tuple[str, str]]) -> list[HeldCopy]:
        """The copies listed in ``pending`` (queue, key), emptied, that are
        still this holder's, as their next generation; on a Redis error they
        stay listed."""
        with self._lock:
            wanted = pending[:]
            pending.clear()
        if not wanted:
            return []
        try:
            mine = [c for c in self.store.find(wanted) if c.holder == self.holder_id]
            return self.store.hand_over(mine, self.holder_id)
        except REDIS_ERRORS:
            with self._lock:
                pending[:0] = wanted
            raise

    def _take_over_dead(self, next_look: float) -> float:
        now = time.monotonic()
        if now < next_look:
            return next_look
        alive = set(self.alive())
        if self.holder_id not in alive:  # its heartbeat first: others must see its claims live
            return now + TAKEOVER_EVERY
        for holder in self.store.holders():
            if holder == self.holder_id or holder in alive or not self.store.claim(
                    holder, self.holder_id, lambda claimer: claimer in self.alive()):
                continue
            copies = list(self.store.held_by(holder))
            moved = self.store.hand_over(copies, self.holder_id)
            self._hand(moved)
            self.store.retire(holder)
            log.info("holder %s is gone: took over its %d copies", holder, len(moved))
        return now + TAKEOVER_EVERY


class Beside:
    """A thread's own ``gearman.Client`` whose background copies go to a
    shared :class:`HoldingClient` (one holder per process)."""

    def __init__(self, holding: HoldingClient, client: gearman.Client) -> None:
        self.holding, self.client = holding, client

    def __getattr__(self, name: str) -> object:
        return getattr(self.client, name)

    def submit_background(self, copies: Sequence[gearman.Copy],
                          precedence: str = "normal") -> int:
        return self.holding.submit_background(copies, precedence)


class HeldAnswers:
    """The answers a foreground fanout waits for, one per held copy (its
    queue and record key), in the order the copies came."""

    def __init__(self, holding: HoldingClient, keys: list[tuple[str, str]]) -> None:
        self.holding, self.keys = holding, keys
        self._outcomes: dict[tuple[str, str], gearman.Outcome] = {}
        self._settled = threading.Condition()

    def settle(self, key: tuple[str, str], outcome: gearman.Outcome) -> None:
        with self._settled:
            self._outcomes[key] = outcome
            self._settled.notify_all()

    def wait(self, timeout: float) -> list[gearman.Outcome]:
        """The outcomes within ``timeout`` s; ``timeout`` for a copy not
        answered by then (it stays held)."""
        deadline = time.monotonic() + timeout
        with self._settled:
            while len(self._outcomes) < len(set(self.keys)):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._settled.wait(left)
            outcomes = dict(self._outcomes)
        self.let_go()
        late = gearman.Outcome("timeout", reason=f"no answer within {timeout:.3g}s")
        return [outcomes.get(key, late) for key in self.keys]

    def let_go(self) -> None:
        """Answers that come from now on are not waited for."""
        with self.holding._lock:
            for key in self.keys:
                if self.holding._waiting.get(key) is self:
                    del self.holding._waiting[key]
