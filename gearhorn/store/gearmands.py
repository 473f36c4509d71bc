"""A holder's connections, one per gearmand: which are lost, where a copy
goes meanwhile, and asking gearmand after jobs (docs/design/held-copies.rst)."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence

from gearhorn import gearman
from gearhorn.gearman import Holder
from gearhorn.store.heldcopies import key_of

log = logging.getLogger(__name__)

RECONNECT_EVERY = 0.5  # seconds between tries of a gearmand that is away


class Gearmands:
    """``client.connections``' servers as holding connections, made by
    ``make(index)`` as they are needed."""

    def __init__(self, client: gearman.Client, make: Callable[[int], Holder],
                 clock: Callable[[], float]) -> None:
        self.client, self.make, self._clock = client, make, clock
        self._lock = threading.Lock()
        self._holders: dict[int, Holder] = {}  # by index in client.connections
        self.lost: set[int] = set()  # servers whose copies are to be handed again
        self._retry_at: dict[int, float] = {}  # a lost server's next try, while away
        self._rerouted: set[int] = set()  # away servers whose copies went to the others
        # While a server's copies are read to be handed again: the keys
        # handed to its new connection meanwhile (not to be handed twice).
        self._fresh: dict[int, set[str]] = {}
        # A fenced name's connections, open until its taker attached to their
        # jobs: (name, connections)
        self._retiring: list[tuple[str, list[Holder]]] = []

    def hold(self, home: int, jobs: Sequence[gearman.Copy], precedence: str,
             said: dict[str, tuple[bool, int]] | None = None) -> bool:
        """``jobs`` to ``home``, or the next server up while it is lost; False
        when none took them (each server away, or the connection broke: it
        is lost now, and its copies are handed again once it answers).
        ``said``: filled with what ``home`` says of each job just after
        (Holder.hold's ``ask_after``), when they went there."""
        index = self.up_from(home)
        holder = None if index is None else self.holder(index, jobs)
        if holder is None:
            return False  # every server is away: the copies wait in Redis
        try:
            found = holder.hold(jobs, precedence, ask_after=said is not None and index == home)
            if said is not None:
                said.update(found)
            return True
        except gearman.GearmanError:
            self.lose(index)
            return False

    def up_from(self, home: int) -> int | None:
        """``home``, or while its connection is lost the next server that is
        not (a queue's consumers read every server, as gearmand's own
        failover has them: a held copy waits for no one server)."""
        count = len(self.client.connections)
        with self._lock:
            return next(((home + n) % count for n in range(count)
                         if (home + n) % count not in self.lost), None)

    def holder(self, index: int, jobs: Sequence[gearman.Copy] = ()) -> Holder | None:
        with self._lock:
            if index in self.lost:
                return None
            if index in self._fresh:
                self._fresh[index].update(key_of(job.unique) for job in jobs)
            holder = self._holders.get(index)
            if holder is None or holder.broken:
                holder = self._holders[index] = self.make(index)
            return holder

    def live(self) -> set[str]:
        """The keys of the copies some connection holds, or is handing, now."""
        with self._lock:
            holders = [h for h in self._holders.values() if not h.broken]
        return {key_of(unique) for holder in holders for unique in holder.live()}

    def status(self, uniques: Sequence[str]) -> list[dict[str, tuple[bool, int]]]:
        """What each gearmand says of the jobs ``uniques`` (one dict per
        server, in ``client.connections`` order; empty for a server away)."""
        found = []
        for index in range(len(self.client.connections)):
            holder = self.holder(index)
            try:
                found.append({} if holder is None else holder.status(uniques))
            except gearman.GearmanError:
                found.append({})
        return found

    def verify(self, index: int, uniques: Sequence[str]) -> None:
        """Ask server ``index`` after jobs held there (Holder.verify)."""
        holder = self.holder(index)
        if holder is not None:
            # A broken connection's copies are handed again anyway.
            with contextlib.suppress(gearman.GearmanError):
                holder.verify(uniques)

    def connected(self, index: int) -> set[str] | None:
        """The client ids of the connections open to server ``index`` (admin
        ``workers``); None when it does not answer."""
        conn = self.client.connections[index]
        try:
            return gearman.client_ids(conn.host, conn.port, tls=getattr(conn, "tls", None))
        except (OSError, gearman.GearmanError):
            return None

    def probe(self, every: float) -> None:
        """An echo on each connection every ``every`` seconds (Holder.probe):
        a silent gearmand is let go before a copy waits on it."""
        with self._lock:
            holders = [h for h in self._holders.values() if not h.broken]
        for holder in holders:
            holder.probe(every)

    def lose(self, index: int) -> None:
        with self._lock:
            self.lost.add(index)

    def due(self) -> list[int]:
        """The lost servers to try again now."""
        now = self._clock()
        with self._lock:
            return [i for i in sorted(self.lost) if self._retry_at.get(i, 0.0) <= now]

    def reconnect(self, index: int) -> Holder | None:
        """A new connection to server ``index``, or None while it is away."""
        probe = self.make(index)
        try:
            probe.conn.open()
        except gearman.GearmanError as exc:
            with self._lock:
                first = index not in self._retry_at
                self._retry_at[index] = self._clock() + RECONNECT_EVERY
            if first:
                log.warning("gearmand %s:%s is away (%s): the held copies it had go to the "
                            "servers that are up, if any, until it is back", probe.conn.host,
                            probe.conn.port, exc)
            return None
        with self._lock:
            self._retry_at.pop(index, None)
        return probe

    def reroute(self, index: int) -> bool:
        """True the first time server ``index``'s copies are to go to the
        others, while some server is up."""
        if self.up_from(index) is None:
            return False
        with self._lock:
            first = index not in self._rerouted
            self._rerouted.add(index)
            return first

    def unroute(self, index: int) -> None:
        with self._lock:
            self._rerouted.discard(index)

    def adopt(self, index: int, probe: Holder) -> set[str]:
        """``probe`` is server ``index``'s connection from now on (new
        copies go to it: none falls between); the keys handed to it while
        its copies are read to be handed again."""
        with self._lock:
            self._holders[index] = probe
            self.lost.discard(index)
            self._rerouted.discard(index)
            fresh = self._fresh[index] = set()
            return fresh

    def adopted(self, index: int) -> None:
        with self._lock:
            self._fresh.pop(index, None)

    def let_go(self) -> list[Holder]:
        """Every connection, to be closed; nothing is lost any more."""
        with self._lock:
            holders, self._holders = list(self._holders.values()), {}
            self.lost.clear()
            self._retry_at.clear()
            self._rerouted.clear()
            return holders

    def retire(self, name: str) -> None:
        """Every connection leaves, to be closed once ``name`` was taken over
        (:meth:`close_retired`): until then their jobs stay runnable, and
        their answers are read. A name is taken over within a lease or so,
        by its own process's new name if by no other."""
        holders = self.let_go()
        with self._lock:
            self._retiring.append((name, holders))

    def close_retired(self, listed: Callable[[str], bool]) -> bool:
        """Close the retiring connections of each name no longer ``listed``
        (all taken over); whether any closed."""
        with self._lock:
            retiring = list(self._retiring)
        due = [r for r in retiring if not listed(r[0])]
        with self._lock:
            self._retiring = [r for r in self._retiring if r not in due]
        for _, holders in due:
            for holder in holders:
                holder.close("fenced: its copies were taken over", expected=True)
        return bool(due)

    def retired(self) -> list[Holder]:
        """Every retiring connection, to be closed now (a stop)."""
        with self._lock:
            retiring, self._retiring = self._retiring, []
        return [holder for _, holders in retiring for holder in holders]
