"""The warden: keeps every subscriber queue within its limits.

One process of the pool at a time holds the warden's lease (``<p>warden``)
and does a round every ``retention_interval`` seconds:

1. reads the tally sums of the queues that may have changed (tallied,
   subscribed or claimed since, or never seen), then how many copies each
   holds (in that order: a copy queued in between then looks unconsumed,
   never consumed): with ``copies = held`` from gearhorn's own records
   (``<p>copies:{Q}``, exact, gearmand up or not), gearmand's ``status``
   only when a copy must be taken, consumers looked for, or every
   STATUS_EVERY for jobs others sent; else from ``status``. Then the
   records and limits (``<p>subscriptions``) of the queues whose counts
   moved (docs/design/workers.rst, "Worker pool": an idle or steady queue costs a
   round nothing);
2. judges each queue (gearhorn/rules/retention.py): entries consumed are
   forgotten; expired copies, then copies over a ``drop-head`` limit, are
   taken from the head as a worker of the queue would (GRAB, then
   WORK_COMPLETE; WORK_FAIL for a foreground copy), dead-lettered first
   when the subscription says so; each is in the ledger as ``dropped``;
3. marks ``reject-publish`` queues at their limit in ``<p>full``;
4. removes a subscription with ``expires`` that had no consumer for that long;
5. writes the largest backlogs (``<p>backlogs``) and the queue store's
   memory against its guard (``<p>store``; gearhorn/worker/round_report.py).

The queue's head is what gearmand hands out first, so taking copies there
takes the oldest (one priority; docs/reliability.rst says where that bends).
"""

from __future__ import annotations

import dataclasses
import heapq
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import redis

from gearhorn.config import Config
from gearhorn.rules.limits import DROP_HEAD, Limits
from gearhorn.rules.naming import is_stream_client
from gearhorn.rules.retention import Tallied, Verdict, judge
from gearhorn.store.heldcopies import HeldCopies
from gearhorn.store.keys import Keys
from gearhorn.store.observers import Observer
from gearhorn.store.redisutil import script, text
from gearhorn.store.registry import Registry
from gearhorn.store.rejectroom import RoomKeeper
from gearhorn.store.tally import TallyReader
from gearhorn.worker.counts import QueueCounts, since
from gearhorn.worker.enforcing import Enforcing
from gearhorn.worker.lastverdicts import LastVerdict, LastVerdicts
from gearhorn.worker.reaper import Load, Reaper, Server, gearmand_loads
from gearhorn.worker.round_report import BACKLOGS_KEPT, Backlog, RoundReport

log = logging.getLogger(__name__)

# Queues judged between two renewals of the lease in a long round: two
# wardens judging the same queues would both take its surplus.
LEASE_CHECK = 5000
# A round that sees no change reads the counts this often (s) anyway; with
# held copies, gearmand's status is read this often at least.
STATUS_EVERY = 10.0
# Watched queues (gearhorn/store/tally.py) looked at per round, at most about.
WATCHED_PER_ROUND = 10_000


@dataclass(frozen=True)
class _Rooms:
    """The reject-publish rooms as a round found them."""

    claimed_now: dict
    claimed_before: dict
    had_room: set[str]


@dataclass
class _Round:
    """What one round read, for :meth:`Warden._judge_round`."""

    subscriptions: dict[str, tuple[dict, Limits]]
    read: dict[str, tuple[int, int]]  # the tally sums read
    sums: dict[str, tuple[int, int]]  # the sums of the queues to judge
    steady: dict[str, LastVerdict]  # queues whose counts did not move: not judged
    loads: dict[str, Load]
    renewed: set[str]
    watched: set[str]
    tallied: set[str]
    rooms: _Rooms
    full: bool  # every subscription read (a default expires)


@dataclass(frozen=True, slots=True)
class WardenSettings:
    """What the warden reads of the configuration."""

    servers: tuple[Server, ...]
    tls: object = None  # gearhorn.gearman's TLS settings, or None
    interval: float = 1.0  # between rounds; the lease lasts three
    defaults: Limits = Limits()  # what a subscription does not say
    store_guard: float = 0.9  # of the queue store's maxmemory
    store_most: int = 0  # that memory where the store's Redis has no maxmemory (0: none)
    held: bool = False  # copies = held: queues counted from their records

    @classmethod
    def of(cls, config: Config) -> WardenSettings:
        defaults = Limits(config.queue_max_length, config.queue_max_bytes,
                          config.queue_message_ttl, config.queue_expires, config.queue_overflow,
                          config.queue_dead_letter)
        return cls(tuple(config.gearman_servers), config.gearman_tls, config.retention_interval,
                   defaults, config.queue_store_guard, config.queue_maxmemory,
                   config.copies == "held")


class Warden:
    """One round at a time; the pool's processes take turns holding the lease."""

    def __init__(self, settings: WardenSettings, registry: Registry, reaper: Reaper,
                 observer: Observer | None = None, owner: str = "",
                 queue_store: Callable[[], redis.Redis | None] | None = None) -> None:
        self.settings = settings
        self.registry = registry
        self.redis: redis.Redis = registry.redis
        self.keys: Keys = registry.keys
        self.tally = TallyReader(self.redis, self.keys)
        self.observer = observer or Observer()  # the ledger and the metrics
        self.enforcing = Enforcing(settings.servers, settings.tls, registry, reaper,
                                   self.observer)
        self.owner = owner or uuid.uuid4().hex
        self.report = RoundReport(self.redis, self.keys, queue_store, settings.store_guard,
                                  settings.store_most)
        self.room = RoomKeeper(self.redis, self.keys)  # reject-publish: claimed at copy time
        self._claimed_before: dict[str, tuple[int, int]] | None = None
        self.seen = LastVerdicts()  # what this process knows of each queue
        self.counts = QueueCounts(
            lambda: gearmand_loads(settings.servers, settings.tls),
            HeldCopies(self.redis, self.keys) if settings.held else None, STATUS_EVERY)
        self._version = -1  # the tallies' version then
        self._renew = script(self.redis, "lease_renew.lua")

    def lead(self) -> bool:
        """Hold the lease for three intervals; True while this process holds it."""
        # Three intervals, or three status reads when one takes longer: a
        # lease that ran out inside a read would be taken by another process.
        ttl = max(1000, int(max(self.settings.interval, self.counts.status_took) * 3000))
        key = self.keys.warden
        if self.redis.set(key, self.owner, nx=True, px=ttl):
            self.seen.forget()  # taken anew: another process may have judged meanwhile
            return True
        return bool(self._renew(keys=[key], args=[self.owner, ttl]))  # if still its own

    def round(self, now: float | None = None) -> dict[str, Verdict]:
        """One pass over the subscriber queues that may need it; the
        verdicts, for tests. A default ``expires`` makes every subscription
        one whose consumers are looked for: then each round reads them all
        (:meth:`_full_round`, docs/scaling.rst); else a round reads only the
        queues that may have moved (:meth:`_incremental_round`)."""
        now = time.time() if now is None else now
        if self.counts.spaced(now) and self.counts.held is None:
            return {}  # gearmand's status is slow to read: rounds spaced out to match
        # What workers claimed up to the last round: copies claimed since may
        # not be in gearmand's count yet, so they are taken off the room too.
        # Read before the subscriptions: a room opened after this read (its
        # record written first) is one this round must not take away.
        claimed_now, had_room = self.room.snapshot()
        claimed_before = claimed_now if self._claimed_before is None else self._claimed_before
        if not self._scanned() and not self._scan():
            return {}
        rooms = _Rooms(claimed_now, claimed_before, had_room)
        if self.settings.defaults.expires:
            return self._full_round(now, rooms)
        return self._incremental_round(now, rooms)

    def _full_round(self, now: float, rooms: _Rooms) -> dict[str, Verdict]:
        renewed = self.registry.renewed(WATCHED_PER_ROUND)
        self._claimed(rooms.claimed_now, rooms.claimed_before)
        version = self.tally.version()
        self.seen.unjudged = set()
        subscriptions = self.registry.subscriptions()
        reads = self._read_counts(set(subscriptions), now, version)
        if reads is None:
            return self._gave_up(renewed)
        read, loads = reads
        return self._judge_round(_Round(subscriptions, read, dict(read), {}, loads, renewed,
                                        set(), set(), rooms, full=True), now)

    def _incremental_round(self, now: float, rooms: _Rooms) -> dict[str, Verdict]:
        watched = self._watched_slice()
        renewed = self.registry.renewed(WATCHED_PER_ROUND)
        # Judged whatever their counts say: a subscription made or changed
        # since, a room claimed since, consumers to look for.
        always = (renewed | self._claimed(rooms.claimed_now, rooms.claimed_before)
                  | self.registry.expiring())
        version = self.tally.version()
        # Taken before the sums: a queue tallied after this is in the next
        # round's set, so every other queue's sums are what this process
        # last read or left (LastVerdict.sums, worker/lastverdicts.py).
        if self._status_recent(always, now):
            if version == self._version:
                return {}  # nothing moved that a round could see without gearmand
            tallied = self.tally.changed() | self.seen.unjudged
            if self._within_limits(tallied):
                self.seen.unjudged, self._version = tallied, version
                self.report.refresh_store()
                return {}  # judged at the next status read
        else:
            tallied = self.tally.changed() | self.seen.unjudged
        self.seen.unjudged = set()
        ask = {q for q in watched | always | tallied | self.seen.unread
               if q in always or q in tallied or not self.seen.knows(q)}
        reads = self._read_counts(ask, now, version)
        if reads is None:
            return self._gave_up(renewed)
        read, loads = reads
        sums, steady = self.seen.sort(read, loads, always, now)
        subscriptions: dict[str, tuple[dict, Limits]] = {}
        if not self._in_chunks([q for q in sums if q not in steady],
                               lambda some: subscriptions.update(self.registry.records(some))):
            return self._gave_up(renewed)
        return self._judge_round(_Round(subscriptions, read, sums, steady, loads, renewed,
                                        watched, tallied, rooms, full=False), now)

    def _read_counts(self, ask: set[str], now: float, version: int
                     ) -> tuple[dict[str, tuple[int, int]], dict[str, Load]] | None:
        """The tally sums of ``ask``, then the counts of those and of the
        queues remembered (their counts say whether they moved), as of the
        tallies' ``version``; None if the lease went meanwhile. Sums first:
        a copy queued in between then looks unconsumed, never consumed."""
        read: dict[str, tuple[int, int]] = {}
        if not self._in_chunks(sorted(ask), lambda some: read.update(self.tally.sums(some))):
            return None
        loads = self.counts.read(sorted(ask | self.seen.last.keys()), now)
        self._version = version
        return (read, loads) if self.lead() else None

    def _judge_round(self, this: _Round, now: float) -> dict[str, Verdict]:
        """Judge and enforce what the round read, then keep the rooms, the
        watched set and the report."""
        # A stream subscription has no queue to bound (gearhorn/stomp/topics/streams.py).
        subscriptions = {queue: sub for queue, sub in this.subscriptions.items()
                         if not is_stream_client(sub[0].get("client_id", ""))}
        sums, steady = this.sums, this.steady
        before = dict(sums)
        # The lease renewed between the long reads too: a second warden would
        # start the same round (judging every queue: it knows no verdict
        # yet), and the lease would go back and forth between them.
        verdicts, backlogs, full = (self._judge_all(subscriptions, sums, this.loads, now)
                                    if self.lead() else (None, [], set()))
        if verdicts is None:  # the lease went in a long round: the new holder goes on
            return self._gave_up(this.renewed)
        if not this.full:
            self.seen.others(sums, steady, subscriptions, this.loads, now)
        full.update(queue for queue, seen in steady.items() if seen.full)
        backlogs += _aged(steady.values(), now)
        self.report.mark_full(full)
        rooms = [(q, v.room, v.room_bytes) for q, v in verdicts.items() if v.room is not None]
        # Rooms of queues judged and no longer reject-publish, or gone; one
        # not judged keeps its room (unsubscribing takes it away).
        had_room = this.rooms.had_room
        judged = had_room if this.full else had_room & (set(sums) - set(steady))
        self.room.set(rooms, this.rooms.claimed_before, judged - {q for q, _, _ in rooms})
        self._claimed_before = this.rooms.claimed_now
        self._watch(this.watched, this.tallied, this.read, before, sums)
        self.report.publish(backlogs, now)
        self.observer.flush()  # what this round dropped is in the ledger now
        return verdicts

    def _scanned(self) -> bool:
        """Whether every subscription was looked at once in this Redis (a
        Redis that lost its data lost the mark with them)."""
        return bool(self.redis.exists(self.keys.warden_scanned))

    def _scan(self, chunk: int = 10_000) -> bool:
        """Once per Redis, for subscriptions made before the rounds read only
        what changed: the queues with a tally are watched, the ones with
        ``expires`` indexed. False if the lease went meanwhile."""
        queues = sorted(text(q) for q in self.redis.hkeys(self.keys.subscriptions))
        for start in range(0, len(queues), chunk):
            some = queues[start:start + chunk]
            self.tally.watch([q for q, (count, _) in self.tally.sums(some).items() if count])
            expiring = [q for q, (_, limits) in self.registry.records(some).items()
                        if limits.expires]
            if expiring:
                self.redis.sadd(self.keys.expiring, *expiring)
            if not self.lead():
                return False
        self.redis.set(self.keys.warden_scanned, "1")
        return True

    def _watched_slice(self) -> set[str]:
        """The next slice of ``<p>watched``, until one whole pass since the
        lease was taken: it finds the tallies holding copies that this
        process knows nothing of (taken over, restarted); after it, a queue
        tallied comes in ``<p>tallied``."""
        if self.seen.swept:
            return set()
        self.seen.cursor, found = self.tally.watched(self.seen.cursor, WATCHED_PER_ROUND)
        self.seen.swept = self.seen.cursor == 0
        return found

    def _watch(self, watched: set[str], tallied: set[str], read: dict[str, tuple[int, int]],
               before: dict[str, tuple[int, int]], sums: dict[str, tuple[int, int]]) -> None:
        """Keep ``<p>watched`` to the tallies that may hold copies: out go
        the ones emptied (by this round's forgetting, or found empty), in
        come the ones found holding copies outside it (a worker that could
        not add to it, a tally from before it)."""
        self.tally.unwatch(sorted(q for q, (count, _) in sums.items()
                                  if not count and (before[q][0] or q in watched)))
        self.tally.watch(sorted(q for q, (count, _) in read.items()
                                if count and sums[q][0] and q not in watched
                                and q not in tallied))

    def _in_chunks(self, queues: list[str], read: Callable[[list[str]], object]) -> bool:
        """``read`` each chunk of ``queues``, the lease renewed after each
        (100,000 queues read at once outlived it); False once it went."""
        for start in range(0, len(queues), LEASE_CHECK):
            read(queues[start:start + LEASE_CHECK])
            if not self.lead():
                return False
        return True

    def _gave_up(self, renewed: set[str]) -> dict[str, Verdict]:
        """A round that lost its lease: what it took is left for the next
        (whoever holds the lease then knows no queue's counts: it reads them)."""
        if renewed:
            self.redis.sadd(self.keys.renewed, *renewed)
        self.seen.forget()
        return {}

    def _status_recent(self, always: set[str], now: float) -> bool:
        """Whether this round may do without reading any counts (gearmand's
        ``status`` is one line per function it knows: a quarter of a second
        at 100,000): nothing subscribed, claimed or with ``expires`` since,
        no copy's TTL coming due, and the last status is recent. Copies
        consumed and copies sent by others are then seen within
        STATUS_EVERY seconds."""
        return (not always and since(self.counts.status_at, now) < STATUS_EVERY
                and now * 1000 < self.seen.next_due)

    def _within_limits(self, queues: set[str]) -> bool:
        """Whether none of ``queues`` (tallied since the last status read)
        can be over a limit or hold a copy that comes due: drop-head queues
        with no TTL and no ``expires`` whose tally (the copies they were
        given, less the ones seen consumed) is within their length and
        bytes. gearmand holds no more than that (copies sent by others
        aside), so their judgement waits for the next status read, and a
        steady stream of fanouts to a few topics does not read it every
        round (100,000 queues holding copies: 0.6 cores)."""
        if len(queues) > WATCHED_PER_ROUND:
            return False
        some = sorted(queues)
        sums, records = self.tally.sums(some), self.registry.records(some)
        for queue, (_, given) in records.items():
            limits = given.over(self.settings.defaults)
            count, size = sums[queue]
            if (limits.message_ttl or limits.expires
                    # reject-publish: a round marks it full, and gives its room back
                    or (limits.overflow != DROP_HEAD and (limits.max_length or limits.max_bytes))
                    or (limits.max_length and count > limits.max_length)
                    or (limits.max_bytes and size > limits.max_bytes)):
                return False
        return True

    def _judge_all(self, subscriptions: dict[str, tuple[dict, Limits]],
                   sums: dict[str, tuple[int, int]], loads: dict[str, Load], now: float
                   ) -> tuple[dict[str, Verdict] | None, list[Backlog], set[str]]:
        """Judge and enforce each queue; (verdicts, backlogs, full ones).
        Verdicts None: the lease went meanwhile."""
        active = {q: s for q, s in sums.items() if q in subscriptions and (s[0] or q in loads)}
        tallies: dict[str, Tallied] = {}
        if not self._in_chunks(list(active), lambda some: tallies.update(
                self.tally.read({q: active[q] for q in some}))):
            return None, [], set()
        verdicts, backlogs, full = {}, [], set()
        last = {}
        for n, (queue, (entry, given)) in enumerate(subscriptions.items(), 1):
            if n % LEASE_CHECK == 0 and not self.lead():
                return None, [], set()
            limits = given.over(self.settings.defaults)
            load = loads.get(queue, Load())
            tallied = tallies.get(queue, Tallied(0, 0, ()))
            verdict = judge(tallied, load.depth, load.running, limits, int(now * 1000))
            if self.counts.from_records and (verdict.takes or limits.expires):
                # Taking copies, or looking for consumers, needs gearmand's
                # counts: read once this round, for every queue.
                self.counts.from_gearmand(loads, now)
                load = loads.get(queue, Load())
                verdict = judge(tallied, load.depth, load.running, limits, int(now * 1000))
            verdicts[queue] = verdict
            consumed = tallied.window[:verdict.consumed_entries]
            if self.tally.forget(queue, consumed):
                left = (sums[queue][0] - sum(e.count for e in consumed),
                        sums[queue][1] - sum(e.size for e in consumed))
            else:  # forgotten by a warden whose lease ran out mid-round: read again
                left = self.tally.sums([queue])[queue]
            sums[queue] = left
            taken = self.enforcing.enforce(queue, entry, limits, load, verdict)
            if verdict.full:
                full.add(queue)
            if self.enforcing.expired(queue, entry, limits, load, now):
                continue
            backlog = None
            if load.depth:
                oldest = verdict.oldest_ms
                age = None if oldest is None else max(0.0, now - oldest / 1000)
                backlog = Backlog(queue, entry.get("topic", ""), entry.get("client_id", ""),
                                  load.depth, verdict.size, age, load.workers,
                                  limits.describe())
                backlogs.append(backlog)
            if load.depth or load.running or left[0]:  # an empty one is idle again
                # Copies taken: gearmand's counts move, judged again next round.
                due = -math.inf if taken or limits.expires else _due(verdict, limits)
                last[queue] = LastVerdict((load.depth, load.running, load.workers, left[0]), left,
                                    due, verdict.full, backlog, now)
        self.seen.judged(last)
        return verdicts, backlogs, full

    @staticmethod
    def _claimed(claimed_now: dict[str, tuple[int, int]],
                 claimed_before: dict[str, tuple[int, int]]) -> set[str]:
        """The reject-publish queues that workers claimed room in since the
        last round."""
        return {q for q, c in claimed_now.items() if claimed_before.get(q) != c}


def _aged(steady: Iterable[LastVerdict], now: float) -> list[Backlog]:
    """The largest backlogs of queues not judged this round, as judged then,
    their oldest copy older by now (only the ones that can be reported:
    100,000 rebuilt each round were half of its time)."""
    largest = heapq.nlargest(BACKLOGS_KEPT, (s for s in steady if s.backlog is not None),
                             key=lambda s: s.backlog.depth)
    return [dataclasses.replace(s.backlog, oldest_age=None if s.backlog.oldest_age is None
                                else s.backlog.oldest_age + now - s.at) for s in largest]


def _due(verdict: Verdict, limits: Limits) -> float:
    """When (ms) the oldest queued copy's TTL runs out; never: inf."""
    if limits.message_ttl and verdict.oldest_ms is not None:
        return verdict.oldest_ms + limits.message_ttl * 1000
    return math.inf

