"""The warden: keeps every subscriber queue within its limits.

One process of the pool at a time holds the warden's lease (``<p>warden``)
and does a round every ``retention_interval`` seconds:

1. reads each subscriber queue's record and limits (``<p>subscriptions``)
   and its tally sums, then gearmand's ``status`` (in that order: a copy
   queued in between then looks unconsumed, never consumed);
2. judges each queue (gearhorn/retention.py): entries consumed are
   forgotten; expired copies, then copies over a ``drop-head`` limit, are
   taken from the head as a worker of the queue would (GRAB, then
   WORK_COMPLETE; WORK_FAIL with a reason for a foreground copy), after
   going to ``<queue>.dlq`` when the subscription dead-letters; each one
   is in the ledger as ``dropped`` with its reason;
3. marks ``reject-publish`` queues at their limit in ``<p>full`` (the
   workers make no copy for those);
4. removes a subscription with ``expires`` that had no consumer for that long;
5. writes the largest backlogs (``<p>backlogs``) and the queue store's
   memory against its guard (``<p>store``): the workers refuse fanouts
   while it is over, ``gearhorn status``, the console and ``/readyz`` show it.

The queue's head is what gearmand hands out first, so taking copies there
takes the oldest (one priority; docs/reliability.rst says where that bends).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import redis

from gearhorn import gearman
from gearhorn.config import Config
from gearhorn.limits import EXPIRED, REMOVED, Limits
from gearhorn.messages import Subscription
from gearhorn.naming import is_stream_client
from gearhorn.observers import Observer
from gearhorn.retention import Tallied, Verdict, judge
from gearhorn.store.keys import Keys
from gearhorn.store.redisconn import REDIS_ERRORS
from gearhorn.store.redisutil import text
from gearhorn.store.registry import Registry
from gearhorn.store.room import RoomKeeper
from gearhorn.store.tally import TallyReader
from gearhorn.worker.reaper import Load, Reaper, Server, gearmand_loads

log = logging.getLogger(__name__)

BACKLOGS_KEPT = 20  # largest backlogs in <p>backlogs
# Queues judged between two renewals of the lease in a long round: two
# wardens judging the same queues would both take its surplus.
LEASE_CHECK = 5000
# A round that sees no change reads gearmand's status this often (s) anyway.
STATUS_EVERY = 10.0
# Watched queues (gearhorn/store/tally.py) looked at per round, at most about.
WATCHED_PER_ROUND = 10_000


@dataclass(frozen=True, slots=True)
class WardenSettings:
    """What the warden reads of the configuration."""

    servers: tuple[Server, ...]
    tls: object = None  # gearhorn.gearman's TLS settings, or None
    interval: float = 1.0  # between rounds; the lease lasts three
    defaults: Limits = Limits()  # what a subscription does not say
    store_guard: float = 0.9  # of the queue store's maxmemory

    @classmethod
    def of(cls, config: Config) -> WardenSettings:
        defaults = Limits(config.queue_max_length, config.queue_max_bytes,
                          config.queue_message_ttl, config.queue_expires, config.queue_overflow,
                          config.queue_dead_letter)
        return cls(tuple(config.gearman_servers), config.gearman_tls, config.retention_interval,
                   defaults, config.queue_store_guard)


@dataclass(frozen=True)
class Backlog:
    queue: str
    topic: str
    client_id: str
    depth: int
    size: int
    oldest_age: float | None  # seconds
    consumers: int
    limits: str

    def to_dict(self) -> dict[str, object]:
        return {"queue": self.queue, "topic": self.topic, "client_id": self.client_id,
                "depth": self.depth, "bytes": self.size, "oldest_age": self.oldest_age,
                "consumers": self.consumers, "limits": self.limits}


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
        self.reaper = reaper
        self.observer = observer or Observer()  # the ledger and the metrics
        self.owner = owner or uuid.uuid4().hex
        self.queue_store = queue_store
        self.room = RoomKeeper(self.redis, self.keys)  # reject-publish: claimed at copy time
        self._claimed_before: dict[str, tuple[int, int]] | None = None
        self._full: set[str] = set()
        self._over = ""
        self._cursor = 0  # where the next round goes on in <p>watched
        # Each queue judged lately: (its counts then, when a copy of it
        # comes due, whether it was full, its backlog): see _steady.
        self._last: dict[str, tuple] = {}
        self._status_at = -math.inf  # when gearmand's status was read last
        self._version = -1  # the tallies' version then

    def lead(self) -> bool:
        """Hold the lease for three intervals; True while this process holds it."""
        ttl = max(1000, int(self.settings.interval * 3000))
        key = self.keys.warden
        if self.redis.set(key, self.owner, nx=True, px=ttl):
            # Taken anew: another process may have judged meanwhile, so what
            # this one knew of each queue is stale (see _steady).
            self._last = {}
            return True
        if text(self.redis.get(key) or b"") == self.owner:
            self.redis.pexpire(key, ttl)
            return True
        return False

    def round(self, now: float | None = None) -> dict[str, Verdict]:
        """One pass over the subscriber queues that may need it; the
        verdicts, for tests."""
        now = time.time() if now is None else now
        # What workers claimed up to the last round: copies claimed since may
        # not be in gearmand's count yet, so they are taken off the room too.
        # Read before the subscriptions: a room opened after this read (its
        # record written first) is one this round must not take away.
        claimed_now, had_room = self.room.snapshot()
        claimed_before = claimed_now if self._claimed_before is None else self._claimed_before
        if not self._scanned() and not self._scan():
            return {}
        # A default ``expires`` makes every subscription one whose consumers
        # are looked for: each round reads them all (docs/scaling.rst).
        everything = bool(self.settings.defaults.expires)
        # A burst of new subscriptions (or of queues given copies) is
        # judged over several rounds, a slice each: a round must end well
        # within its lease.
        self._cursor, watched = self.tally.watched(self._cursor, WATCHED_PER_ROUND)
        expiring = set() if everything else self.registry.expiring()
        renewed = self.registry.renewed(WATCHED_PER_ROUND)
        # Judged whatever their counts say: a subscription made or changed
        # since, a room claimed since, consumers to look for.
        always = renewed | self._claimed(claimed_now, claimed_before) | expiring
        version = self.tally.version()
        if not everything and self._quiet(always, version, now):
            return {}  # nothing moved that a round could see without gearmand
        if everything:
            subscriptions = self.registry.subscriptions()
            looked_at = set(subscriptions)
        else:
            looked_at = watched | always
        # Tally sums before gearmand's counts: a copy queued in between then
        # looks unconsumed, never consumed.
        sums = self.tally.sums(sorted(looked_at))
        loads = gearmand_loads(self.settings.servers, self.settings.tls)
        self._status_at, self._version = now, version
        if not self.lead():
            return self._gave_up(renewed)
        if not everything:
            loaded = [q for q, load in loads.items() if load.depth and q not in sums]
            if not self._in_chunks(loaded, lambda some: sums.update(self.tally.sums(some))):
                return self._gave_up(renewed)
            steady = self._steady(sums, loads, always, now)
            subscriptions = {}
            if not self._in_chunks([q for q in sums if q not in steady],
                                   lambda some: subscriptions.update(self.registry.records(some))):
                return self._gave_up(renewed)
        else:
            steady = {}
        # A stream subscription has no queue to bound (gearhorn/stomp/streams.py).
        subscriptions = {queue: sub for queue, sub in subscriptions.items()
                         if not is_stream_client(sub[0].get("client_id", ""))}
        # The lease renewed between the long reads too: a second warden would
        # start the same round (judging every queue: it knows no verdict
        # yet), and the lease would go back and forth between them.
        verdicts, backlogs, full = (self._judge_all(subscriptions, sums, loads, now)
                                    if self.lead() else (None, [], set()))
        if verdicts is None:  # the lease went in a long round: the new holder goes on
            return self._gave_up(renewed)
        for queue, (was_full, backlog, judged_at) in steady.items():
            if was_full:
                full.add(queue)
            if backlog is not None:  # as judged then, its oldest copy older by now
                age = backlog.oldest_age
                backlogs.append(dataclasses.replace(
                    backlog, oldest_age=None if age is None else age + now - judged_at))
        self._mark_full(full)
        rooms = [(q, v.room, v.room_bytes) for q, v in verdicts.items() if v.room is not None]
        # Rooms of queues judged and no longer reject-publish, or gone; one
        # not judged keeps its room (unsubscribing takes it away).
        judged = had_room if everything else had_room & (set(sums) - set(steady))
        self.room.set(rooms, claimed_before, judged - {q for q, _, _ in rooms})
        self._claimed_before = claimed_now
        emptied = {q for q, (count, _) in sums.items() if not count}  # after what was forgotten
        self.tally.unwatch(sorted(watched & emptied))
        # Tallies found outside the set (a worker that could not add to it,
        # or written before there was one) are watched from now on.
        self.tally.watch(sorted(q for q in verdicts
                                if sums[q][0] and q not in watched and q not in emptied))
        self._publish(backlogs, now)
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

    def _in_chunks(self, queues: list[str], read: Callable[[list[str]], object]) -> bool:
        """``read`` each chunk of ``queues``, the lease renewed after each
        (100,000 queues read at once outlived it); False once it went."""
        for start in range(0, len(queues), LEASE_CHECK):
            read(queues[start:start + LEASE_CHECK])
            if not self.lead():
                return False
        return True

    def _gave_up(self, renewed: set[str]) -> dict[str, Verdict]:
        """A round that lost its lease: what it took is left for the next."""
        if renewed:
            self.redis.sadd(self.keys.renewed, *renewed)
        return {}

    def _quiet(self, always: set[str], version: int, now: float) -> bool:
        """Whether this round may skip gearmand's ``status`` (one line per
        function it knows: half a second at 100,000) and so itself: nothing
        tallied, subscribed, claimed or with ``expires`` since the last
        round, no copy's TTL coming due, and the last status is recent. What
        only gearmand shows, copies consumed and copies sent by others, is
        then seen within STATUS_EVERY seconds."""
        if always or version != self._version or now - self._status_at >= STATUS_EVERY:
            return False
        return all(now * 1000 < seen[1] for seen in self._last.values())

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
            verdicts[queue] = verdict
            self.tally.forget(queue, tallied.window[:verdict.consumed_entries])
            left = sums[queue][0] - sum(e.count for e in tallied.window[:verdict.consumed_entries])
            sums[queue] = (left, sums[queue][1])
            taken = self._enforce(queue, entry, limits, load, verdict)
            if verdict.full:
                full.add(queue)
            if self._expired(queue, entry, limits, load, now):
                continue
            backlog = None
            if load.depth:
                oldest = verdict.oldest_ms
                age = None if oldest is None else max(0.0, now - oldest / 1000)
                backlog = Backlog(queue, entry.get("topic", ""), entry.get("client_id", ""),
                                  load.depth, verdict.size, age, load.workers,
                                  limits.describe())
                backlogs.append(backlog)
            if not taken and not limits.expires:
                last[queue] = ((load.depth, load.running, load.workers, left),
                               _due(verdict, limits), verdict.full, backlog, now)
        self._last.update(last)
        return verdicts, backlogs, full

    def _steady(self, sums: dict[str, tuple[int, int]], loads: dict[str, Load],
                always: set[str], now: float) -> dict[str, tuple]:
        """Queues judged last round whose counts have not moved since (the
        same copies queued, running and tallied, the same consumers) and
        none of whose copies comes due: the same verdict again, so not
        judged again. A wide topic whose subscribers do not read costs a
        round its counts, not a judgement each."""
        steady = {}
        for queue, (count, _) in sums.items():
            seen = self._last.get(queue)
            load = loads.get(queue, Load())
            if (seen is not None and queue not in always and now * 1000 < seen[1]
                    and seen[0] == (load.depth, load.running, load.workers, count)):
                steady[queue] = seen
        self._last = steady  # the judged ones join them (_judge_all)
        return {q: seen[2:] for q, seen in steady.items()}

    @staticmethod
    def _claimed(claimed_now: dict[str, tuple[int, int]],
                 claimed_before: dict[str, tuple[int, int]]) -> set[str]:
        """The reject-publish queues that workers claimed room in since the
        last round."""
        return {q for q, c in claimed_now.items() if claimed_before.get(q) != c}

    def _enforce(self, queue: str, entry: dict, limits: Limits, load: Load,
                 verdict: Verdict) -> int:
        """Take what ``verdict`` says from the head; how many were taken."""
        taken = 0
        for count, reason in ((verdict.expire, EXPIRED), (verdict.drop, verdict.drop_reason)):
            if count:
                taken += self._drop(queue, entry, count, reason, load, limits.dead_letter)
        return taken

    def _drop(self, queue: str, entry: dict, count: int, reason: str, load: Load,
              dead_letter: bool | None) -> int:
        uniques = self.reaper.take(queue, count, load.waiting, reason if dead_letter else None)
        if uniques:
            self.observer.dropped(reason, entry.get("topic", ""), queue, uniques)
        for server in load.waiting:  # what the next judge of this round sees
            load.waiting[server] = max(0, load.waiting[server] - len(uniques))
        if uniques:
            log.info("%s: %d copies dropped (%s)%s", queue, len(uniques), reason,
                     ", dead-lettered" if dead_letter else "")
        return len(uniques)

    def _expired(self, queue: str, entry: dict, limits: Limits, load: Load,
                 now: float) -> bool:
        """Remove a subscription unused for ``expires`` seconds; True if removed."""
        if not limits.expires:
            return False
        if load.workers:
            self.redis.set(self.keys.consumed(queue), str(now))
            return False
        seen = float(text(self.redis.get(self.keys.consumed(queue)) or b"0") or 0)
        last = max(seen, float(entry.get("since", now)))
        if now - last < limits.expires:
            return False
        if entry.get("topic"):
            self.registry.unsubscribe(Subscription(entry["topic"], entry["client_id"]))
        else:  # a bounded /queue/: no subscription, only its record
            self.registry.unbound_queue(queue)
        emptied = self._drop(queue, entry, load.depth, REMOVED, load, limits.dead_letter)
        gearman.drop_function(self.settings.servers, queue, self.settings.tls)
        log.info("%s: subscription expired after %.0fs without a consumer; %d copies removed",
                 queue, now - last, emptied)
        return True

    def _mark_full(self, full: set[str]) -> None:
        if full == self._full and self.redis.scard(self.keys.full) == len(full):
            return
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self.keys.full)
        if full:
            pipe.sadd(self.keys.full, *full)
        pipe.execute()
        self._full = full
        self._announce()

    def _announce(self) -> None:
        """Workers read ``<p>full`` and ``<p>store`` again at once (pressure.py)."""
        self.redis.publish(self.keys.channel, json.dumps({"op": "pressure"}))

    def _publish(self, backlogs: list[Backlog], now: float) -> None:
        backlogs.sort(key=lambda b: -b.depth)
        store = self._store_state(backlogs)
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(self.keys.backlogs, json.dumps({
            "at": now, "queues": [b.to_dict() for b in backlogs[:BACKLOGS_KEPT]]}))
        pipe.hset(self.keys.store, mapping={k: str(v) for k, v in store.items()})
        pipe.execute()
        if store["over"] != self._over:
            self._over = store["over"]
            self._announce()
        self.observer.flush()  # what this round dropped is in the ledger now

    def _store_state(self, backlogs: list[Backlog]) -> dict[str, object]:
        """The queue store's memory against the guard, and the one-line reason
        fanouts are refused while it is over (empty when it is not)."""
        client = self.queue_store() if self.queue_store else None
        if client is None:
            return {"used": 0, "max": 0, "guard": 0, "over": ""}
        try:
            memory = client.info("memory")
        except REDIS_ERRORS as exc:
            return {"used": 0, "max": 0, "guard": 0, "over": "", "error": str(exc)}
        used, most = int(memory.get("used_memory", 0)), int(memory.get("maxmemory", 0))
        guard = int(most * self.settings.store_guard) if most else 0
        over = ""
        if guard and used >= guard:
            largest = ", ".join(f"{b.queue} ({b.depth:,} copies)" for b in backlogs[:3])
            over = (f"queue store full: {_mib(used)} of {_mib(most)} used, over the guard of "
                    f"{_mib(guard)}; largest backlogs: {largest or 'none'}")
        return {"used": used, "max": most, "guard": guard, "over": over}


def _due(verdict: Verdict, limits: Limits) -> float:
    """When (ms) the oldest queued copy's TTL runs out; never: inf."""
    if limits.message_ttl and verdict.oldest_ms is not None:
        return verdict.oldest_ms + limits.message_ttl * 1000
    return math.inf


def _mib(n: int) -> str:
    return f"{n / 1048576:.0f} MiB"
