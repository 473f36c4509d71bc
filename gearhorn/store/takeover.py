"""Taking over the copies of holders found dead, without handing twice what
is still live in gearmand (docs/design/held-copies.rst)."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from gearhorn import gearman
from gearhorn.store.durability import Durability
from gearhorn.store.gearmands import Gearmands
from gearhorn.store.heldcopies import HeldCopies, HeldCopy
from gearhorn.store.holders import FENCED, Holders
from gearhorn.store.lease import HolderLease
from gearhorn.store.redisutil import text

log = logging.getLogger(__name__)

TAKEOVER_EVERY = 1.0  # seconds between looks for dead holders
BATCH = 1000  # copies taken and handed at a time
VERIFY_EACH = 500  # taken copies asked after per look, in turn, until answered
WALK_EACH = 100  # <p>owners:* keys looked at per look (the backstop walk)
# Leases a taker waits, after fencing a holder, for its connections to go
# before it hands again a copy gearmand no longer knows (the holder may be
# paused with the answer unread; past that, a listed connection is a dead
# host's half-open one).
OWNER_WAIT = 3


class Holding(Protocol):
    """What a takeover uses of its holder (gearhorn/store/holding.py)."""

    client: gearman.Client
    lease: HolderLease
    gearmands: Gearmands
    durability: Durability

    def hand(self, held: Sequence[HeldCopy], precedence: str | None = None,
             servers: Sequence[int | None] | None = None,
             said: dict[str, tuple[bool, int]] | None = None) -> None: ...


class Takeover:
    """One holder's part in taking over from the dead: judging, taking
    their queues one at a time, and asking after what it took."""

    def __init__(self, holding: Holding, holders: Holders, store: HeldCopies,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.holding, self.holders, self.store = holding, holders, store
        self._clock = clock
        self._next_look = 0.0
        self._lock = threading.Lock()
        self._pending: set[str] = set()  # queues moved to this holder, not all taken yet
        # Taken copies not yet answered: (queue, key) -> (server, handed unique)
        self._taken: OrderedDict[tuple[str, str], tuple[int, str]] = OrderedDict()
        # Taken copies not handed: their job, live when first asked, was
        # not by the time of the take (answered meanwhile?): as read from
        # their old owner, to be decided again
        self._unsure: dict[tuple[str, str], HeldCopy] = {}
        self._walker: Iterator | None = None
        # Old owners first seen with no connection left, by name: their
        # unknown copies go again one look later, once what they read
        # last is forgotten (they forget, then close)
        self._gone: dict[str, float] = {}

    def tick(self) -> None:
        """A look, once every TAKEOVER_EVERY: nobody is judged while this
        holder's own lease is not fresh or after an outage of its own."""
        now = self._clock()
        if now < self._next_look:
            return
        self._next_look = now + TAKEOVER_EVERY
        lease = self.holding.lease
        if not lease.may_judge():
            return
        me = lease.name
        fenced = self.holders.judge(me)
        if fenced is None:
            return
        for queue in sorted(self._pending):
            self._take_queue(queue, me)
        self._decide_unsure(me)
        for dead in fenced:
            if dead != me:
                self._take_holder(dead, me)
        self._verify_some()
        self._walk(me)

    def settled(self, held: tuple[str, str]) -> None:
        """The copy (queue, key) was answered: no more asking after it."""
        with self._lock:
            self._taken.pop(held, None)

    def forget_all(self) -> None:
        """This holder was fenced: what it took is its taker's now."""
        with self._lock:
            self._pending.clear()
            self._taken.clear()
            self._unsure.clear()
            self._gone.clear()

    def _take_holder(self, dead: str, me: str) -> None:
        took = handed = 0
        done: set[str] = set()  # a queue listed again (a zombie's write) waits a look
        while (queues := set(self.holders.some_queues(dead, 100))) - done:
            for queue in queues - done:
                done.add(queue)
                if self.holders.move_queue(queue, dead, me):  # this queue is ours to take
                    with self._lock:
                        self._pending.add(queue)
                    attached, again = self._take_queue(queue, me)
                    took, handed = took + attached + again, handed + again
        self.holders.drop(dead)
        if took:
            log.info("holder %s is gone: took over its %d held copies (%d still live in "
                     "gearmand, attached to; %d handed again)", dead, took, took - handed,
                     handed)

    def _take_queue(self, queue: str, me: str) -> tuple[int, int]:
        """Every record in ``queue`` of a holder that is dead for good (fenced
        there first, so that it writes nothing more there): how many were
        attached to live jobs, and how many handed again. The queue stays
        pending while some copy waits for its old owner's connection to go."""
        leases = self.holders.leases()
        dead = [h for h in self.store.owners(queue) if h != me and leases.get(h, FENCED) <= 0]
        fenced = self.store.fence(queue, dead)
        orphans = [c for c in self.store.records(queue) if c.holder in fenced]
        attached = again = waiting = 0
        connected: dict[int, set[str] | None] = self._waited_for_long(queue)
        for at in range(0, len(orphans), BATCH):
            decided = [d for d in self._decide(orphans[at:at + BATCH], connected) if d[1] >= 0]
            waiting += min(BATCH, len(orphans) - at) - len(decided)
            marks = self.holding.durability.marks()
            taken = self.store.take(queue, me, [(c, g) for c, g, _ in decided])
            self.holding.durability.wait(marks)  # on disk before it is handed
            read = {c.key: (c, s) for c, _, s in decided}
            taken, servers = self._still_live(taken, read)
            self._hand(queue, taken, servers)
            live = sum(1 for at_server in servers if at_server is not None)
            attached, again = attached + live, again + len(taken) - live
        if not waiting:
            with self._lock:
                self._pending.discard(queue)
        return attached, again

    def _hand(self, queue: str, taken: Sequence[HeldCopy],
              servers: Sequence[int | None]) -> None:
        """Hand ``taken`` (each to its server: None for its home), and ask
        after each until it is answered."""
        attaching = [c for c, s in zip(taken, servers, strict=True) if s is not None]
        said: dict[str, tuple[bool, int]] = {}
        self.holding.hand(taken, servers=servers, said=said if attaching else None)
        self._made_again([c.handed().unique for c in attaching], said)
        with self._lock:
            for copy, at_server in zip(taken, servers, strict=True):
                home = self.holding.client.home(queue) if at_server is None else at_server
                self._taken[(queue, copy.key)] = (home, copy.handed().unique)

    def _made_again(self, uniques: Sequence[str], said: dict[str, tuple[bool, int]]) -> None:
        """Say which attaches found one client, their own, just after: the
        job was answered in the instant before (a round trip's window
        after the last look) and made again, so it runs once more; or it
        was abandoned in that instant (it vanishes, and goes again).
        docs/design/held-copies.rst, "The bounds"."""
        alone = [u for u in uniques if said.get(u, (False, 0)) == (True, 1)]
        if alone:
            log.warning("%d held copies taken over had one client after the attach, the "
                        "taker: answered just before and made again (they come once more), or "
                        "abandoned (they go again); their jobs: %s", len(alone),
                        " ".join(alone[:20]))

    def _still_live(self, taken: Sequence[HeldCopy], read: dict[str, tuple[HeldCopy, int | None]]
                    ) -> tuple[list[HeldCopy], list[int | None]]:
        """The copies to hand now, and their servers. A job found live is
        asked after again just before the attach: the take and its fsync
        came between, and a job a receiver answered meanwhile is gone, so
        its unique submitted again would be a new job, run twice. Such a
        copy is not handed but decided again later (its old owner, paused,
        forgets it once back). What is left is a round trip's window."""
        servers = [read[c.key][1] for c in taken]
        attaching = [c.handed().unique for c, s in zip(taken, servers, strict=True)
                     if s is not None]
        if not attaching:
            return list(taken), servers
        said = self.holding.gearmands.status(attaching)
        hand, where = [], []
        for copy, server in zip(taken, servers, strict=True):
            known, clients = said[server].get(copy.handed().unique, (True, 1)) \
                if server is not None else (True, 1)
            if known and clients > 0:
                hand.append(copy)
                where.append(server)
            else:
                with self._lock:
                    self._unsure[(copy.queue, copy.key)] = read[copy.key][0].at(copy.generation)
        return hand, where

    def _decide_unsure(self, me: str) -> None:
        """The copies taken but not handed, while still this holder's at
        the generation taken: decided as the orphans are (their old owner
        forgets them once back; if it goes instead, they go again)."""
        with self._lock:
            unsure = dict(self._unsure)
        if not unsure:
            return
        current = {(c.queue, c.key): c for c in self.store.find(list(unsure))}
        by_queue: dict[str, list[HeldCopy]] = {}
        for held, copy in unsure.items():
            now = current.get(held)
            if now is not None and now.holder == me and now.generation == copy.generation:
                by_queue.setdefault(copy.queue, []).append(copy)
            else:  # forgotten by its old owner, or gone on
                with self._lock:
                    self._unsure.pop(held, None)
        for queue, copies in by_queue.items():
            decided = [d for d in self._decide(copies, self._waited_for_long(queue))
                       if d[1] >= 0]
            with self._lock:
                for copy, _, _ in decided:
                    self._unsure.pop((queue, copy.key), None)
            # The same generation first: nothing between the look and the attach
            same = [(c, s) for c, g, s in decided if g == c.generation]
            self._hand(queue, [HeldCopy(c.queue, c.unique, c.data, me, c.precedence,
                                        c.generation) for c, _ in same], [s for _, s in same])
            marks = self.holding.durability.marks()
            newer = self.store.hand_again([c for c, g, _ in decided if g != c.generation], me)
            self.holding.durability.wait(marks)  # on disk before it is handed
            self._hand(queue, newer, [None] * len(newer))

    def _decide(self, copies: Sequence[HeldCopy], connected: dict[int, set[str] | None]
                ) -> list[tuple[HeldCopy, int, int | None]]:
        """Each copy's generation to hand (-1: not now), and the server to
        hand it to (None: its home), from what gearmand says of its job:

        - known with a client waiting (its holder's open connection): the
          same generation, to that server: the taker attaches to the job;
        - known with none (abandoned: gearmand would free it unrun and
          strand what attaches to it): the next generation;
        - unknown while its old owner still has a connection to its home:
          it was answered, and that owner drops the record (or is paused,
          its answer unread): not now;
        - unknown otherwise (freed unrun, or answered to a connection gone
          with its answer): the same generation again, with which a
          zombie's late hand coalesces.
        """
        uniques = [c.handed().unique for c in copies]
        said = self.holding.gearmands.status(uniques)
        decided = []
        for copy, unique in zip(copies, uniques, strict=True):
            found = [(n, s[unique]) for n, s in enumerate(said) if unique in s]
            live = [n for n, (known, clients) in found if known and clients > 0]
            if live:
                decided.append((copy, copy.generation, live[0]))
            elif any(known for _, (known, _) in found):
                decided.append((copy, copy.generation + 1, None))
            elif self._still_connected(copy, connected):
                decided.append((copy, -1, None))
            else:
                decided.append((copy, copy.generation, None))
        return decided

    def _waited_for_long(self, queue: str) -> dict:
        """The holders fenced in ``queue`` for over OWNER_WAIT leases (by
        Redis's clock), under the key ``"long"``: a connection gearmand still
        lists for one of them is taken for what a dead host leaves (gearmand
        keeps a half-open connection for hours), not for a paused owner."""
        seconds, micros = self.store.redis.time()
        now = seconds * 1000 + micros // 1000
        bound = OWNER_WAIT * self.holding.lease.ttl * 1000
        return {"long": {h for h, at in self.store.owners(queue).items()
                         if at and now - at > bound}}

    def _still_connected(self, copy: HeldCopy, connected: dict) -> bool:
        """Has the copy's old owner a connection open to some gearmand (the
        copy may have gone to any while its home was away), fenced not long
        ago, or did it close its last less than a look ago?"""
        if copy.holder in connected["long"]:
            return False
        for index in range(len(self.holding.client.connections)):
            if index not in connected:
                connected[index] = self.holding.gearmands.connected(index)
            if copy.holder in (connected[index] or ()):
                self._gone.pop(copy.holder, None)
                return True
        now = self._clock()
        if len(self._gone) > 1000:  # dead names pile up no further
            self._gone = {h: t for h, t in self._gone.items() if now - t < 60}
        gone = self._gone.setdefault(copy.holder, now)
        return now - gone < TAKEOVER_EVERY

    def _verify_some(self) -> None:
        """Ask after some taken copies, in turn: one attached to a job in
        the instant it was abandoned vanishes unanswered (Holder.verify)."""
        with self._lock:
            some = []
            for _ in range(min(VERIFY_EACH, len(self._taken))):
                held, where = self._taken.popitem(last=False)
                self._taken[held] = where
                some.append(where)
        by_server: dict[int, list[str]] = {}
        for server, unique in some:
            by_server.setdefault(server, []).append(unique)
        for server, uniques in by_server.items():
            self.holding.gearmands.verify(server, uniques)

    def _walk(self, me: str) -> None:
        """The backstop: a page of ``<p>owners:*`` a look, read in one round
        trip. A queue where a holder dead for good was never fenced may
        hold a record no index lists (a Redis Cluster, a holder killed
        between the two writes of one pipeline): it is taken like the
        others."""
        if self._walker is None:
            self._walker = self.store.redis.scan_iter(match=self.store.keys.owners_pattern,
                                                      count=WALK_EACH)
        prefix = len(self.store.keys.owners("")) - 1
        queues = [text(key)[prefix:-1] for key in itertools.islice(self._walker, WALK_EACH)]
        if len(queues) < WALK_EACH:
            self._walker = None  # walked through: from the start next look
        if not queues:
            return
        owners_of = self.store.owners_of(queues)
        # Read after the owners: a holder registers its lease before it can
        # write a queue's owners, so one listed there is in these leases
        # unless it was fenced since (read before, a holder new meanwhile
        # would be taken for dead).
        leases = self.holders.leases()
        for queue, owners in zip(queues, owners_of, strict=True):
            if any(h != me and not state and leases.get(h, FENCED) <= 0
                   for h, state in owners.items()):
                self.holders.add_queue(me, queue)  # in our index before we take
                with self._lock:
                    self._pending.add(queue)
                self._take_queue(queue, me)
