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

import json
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import redis

from gearhorn import gearman
from gearhorn.config import Config
from gearhorn.limits import EXPIRED, REMOVED, Limits
from gearhorn.messages import Subscription
from gearhorn.naming import (
    FOREGROUND_MARK,
    dead_letter_queue,
    is_stream_client,
    queue_copy_unique,
)
from gearhorn.observers import Observer
from gearhorn.retention import Tallied, Verdict, judge
from gearhorn.store.deadletters import DeadLetterIndex
from gearhorn.store.headers import HeaderStore
from gearhorn.store.keys import Keys
from gearhorn.store.redisconn import REDIS_ERRORS
from gearhorn.store.redisutil import text
from gearhorn.store.registry import Registry
from gearhorn.store.room import RoomKeeper
from gearhorn.store.stats import Stats
from gearhorn.store.tally import TallyReader

log = logging.getLogger(__name__)

GRAB_BATCH = 100
BACKLOGS_KEPT = 20  # largest backlogs in <p>backlogs
Server = tuple[str, int]


def default_limits(config: Config) -> Limits:
    """The config's ``queue_*`` settings: what a subscription does not say."""
    return Limits(config.queue_max_length, config.queue_max_bytes, config.queue_message_ttl,
                  config.queue_expires, config.queue_overflow, config.queue_dead_letter)


@dataclass
class Load:
    """A queue in gearmand, over every server: jobs (with the ones running),
    running, and workers; ``waiting`` per server for the reaper."""

    depth: int = 0
    running: int = 0
    workers: int = 0
    waiting: dict[Server, int] = field(default_factory=dict)


def gearmand_loads(servers: Sequence[Server], tls=None) -> dict[str, Load]:
    loads: dict[str, Load] = {}
    for server in servers:
        for name, queued, running, workers in gearman.status_rows(*server, tls=tls):
            load = loads.setdefault(name, Load())
            load.depth += queued
            load.running += running
            load.workers += workers
            load.waiting[server] = queued - running
    return loads


class Reaper:
    """Takes copies from the head of a queue, on each gearmand in proportion
    to what it holds; dead-letters them first when asked."""

    def __init__(self, servers: Sequence[Server], headers: HeaderStore,
                 index: DeadLetterIndex, tls=None) -> None:
        self.servers = tuple(servers)
        self.headers = headers
        self.index = index
        self.tls = tls

    def take(self, queue: str, count: int, waiting: dict[Server, int],
             dead_letter_reason: str | None) -> list[str]:
        """Up to ``count`` copies off ``queue``'s head; their unique keys."""
        taken: list[str] = []
        for server, share in _shares(count, waiting):
            taken += self._take_from(server, queue, share, dead_letter_reason)
        return taken

    def _take_from(self, server: Server, queue: str, count: int,
                   dead_letter_reason: str | None) -> list[str]:
        worker = gearman.WorkerConnection(*server, [queue], client_id="gearhorn-warden",
                                          tls=self.tls)
        worker.open()
        uniques: list[str] = []
        try:
            while len(uniques) < count:
                jobs = worker.grab(min(GRAB_BATCH, count - len(uniques)))
                if not jobs:
                    break
                if dead_letter_reason:
                    self._dead_letter(queue, jobs, dead_letter_reason)
                for job in jobs:
                    if job.unique.startswith(FOREGROUND_MARK):
                        worker.warn(job.handle, f"dropped by the queue's limits "
                                                f"({dead_letter_reason or 'policy'})".encode())
                        worker.fail(job.handle)
                    else:
                        worker.complete(job.handle)
                uniques += [job.unique for job in jobs]
            _echo(worker)  # gearmand has taken every answer before we hang up
        finally:
            worker.close()
        return uniques

    def _dead_letter(self, queue: str, jobs: list[gearman.GrabbedJob], reason: str) -> None:
        """Each job to ``<queue>.dlq`` with ``dlq-reason``, before it is completed
        (a crash in between leaves a duplicate, not a loss)."""
        found = self.headers.for_uniques(j.unique for j in jobs)
        dlq = dead_letter_queue(queue)
        copies = []
        for job in jobs:
            message_id = uuid.uuid4().hex
            kept = {k: v for k, v in found.get(job.unique, {}).items() if k != "destination"}
            self.headers.put(message_id, {**kept, "dlq-reason": reason,
                                          "dlq-original-destination": f"/queue/{queue}"})
            copies.append(gearman.Copy(dlq, queue_copy_unique(message_id), job.data))
            try:
                self.index.record(queue, message_id, reason, 0, job.data)
            except REDIS_ERRORS as exc:
                log.warning("%s: dead letter %s not indexed: %s", queue, message_id, exc)
        client = gearman.Client(self.servers, tls=self.tls)
        try:
            client.submit_background(copies)
        finally:
            client.close()


def _echo(worker: gearman.WorkerConnection) -> None:
    from gearhorn.gearman.packets import P, encode

    worker.conn.send(encode(P.ECHO_REQ, b"warden"))
    while worker.conn.read().type != P.ECHO_RES:
        pass


def _shares(count: int, waiting: dict[Server, int]) -> list[tuple[Server, int]]:
    """``count`` spread over the servers by what each has waiting, largest first."""
    total = sum(max(0, n) for n in waiting.values())
    if total <= 0 or count <= 0:
        return []
    shares, left = [], count
    for server, n in sorted(waiting.items(), key=lambda item: -item[1]):
        share = min(max(0, n), left, -(-count * max(0, n) // total))
        if share:
            shares.append((server, share))
            left -= share
    return shares


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

    def __init__(self, config: Config, client: redis.Redis, observer: Observer | None = None,
                 stats: Stats | None = None, owner: str = "",
                 queue_store: Callable[[], redis.Redis | None] | None = None) -> None:
        self.config = config
        self.redis = client
        self.keys = Keys.for_config(config)
        self.registry = Registry(client, self.keys)
        self.tally = TallyReader(client, self.keys)
        self.observer = observer or Observer()  # the ledger and the metrics
        self.owner = owner or uuid.uuid4().hex
        self.defaults = default_limits(config)
        headers = HeaderStore(client, self.keys, config.headers_ttl)
        self.reaper = Reaper(config.gearman_servers, headers,
                             DeadLetterIndex(client, self.keys, stats), config.gearman_tls)
        self.queue_store = queue_store
        self.room = RoomKeeper(client, self.keys)  # reject-publish: room claimed at copy time
        self._claimed_before: dict[str, tuple[int, int]] | None = None
        self._full: set[str] = set()
        self._over = ""

    def lead(self) -> bool:
        """Hold the lease for three intervals; True while this process holds it."""
        ttl = max(1000, int(self.config.retention_interval * 3000))
        key = self.keys.warden
        if self.redis.set(key, self.owner, nx=True, px=ttl):
            return True
        if text(self.redis.get(key) or b"") == self.owner:
            self.redis.pexpire(key, ttl)
            return True
        return False

    def round(self, now: float | None = None) -> dict[str, Verdict]:
        """One pass over every subscriber queue; the verdicts, for tests."""
        now = time.time() if now is None else now
        # A stream subscription has no queue to bound (gearhorn/stomp/streams.py).
        subscriptions = {queue: sub for queue, sub in self.registry.subscriptions().items()
                         if not is_stream_client(sub[0].get("client_id", ""))}
        sums = self.tally.sums(list(subscriptions))
        # What workers claimed up to the last round: copies claimed since may
        # not be in gearmand's count yet, so they are taken off the room too.
        claimed_now = self.room.claimed()
        claimed_before = claimed_now if self._claimed_before is None else self._claimed_before
        loads = gearmand_loads(self.config.gearman_servers, self.config.gearman_tls)
        active = {q: s for q, s in sums.items() if s[0] or q in loads}
        tallies = self.tally.read(active)
        verdicts, backlogs, full = {}, [], set()
        for queue, (entry, given) in subscriptions.items():
            limits = given.over(self.defaults)
            load = loads.get(queue, Load())
            tallied = tallies.get(queue, Tallied(0, 0, ()))
            verdict = judge(tallied, load.depth, load.running, limits, int(now * 1000))
            verdicts[queue] = verdict
            self.tally.forget(queue, tallied.window[:verdict.consumed_entries])
            self._enforce(queue, entry, limits, load, verdict)
            if verdict.full:
                full.add(queue)
            if self._expired(queue, entry, limits, load, now):
                continue
            if load.depth:
                oldest = verdict.oldest_ms
                age = None if oldest is None else max(0.0, now - oldest / 1000)
                backlogs.append(Backlog(queue, entry.get("topic", ""), entry.get("client_id", ""),
                                        load.depth, verdict.size, age, load.workers,
                                        limits.describe()))
        self._mark_full(full)
        self.room.set([(q, v.room, v.room_bytes) for q, v in verdicts.items()
                       if v.room is not None], claimed_before)
        self._claimed_before = claimed_now
        self._publish(backlogs, now)
        return verdicts

    def _enforce(self, queue: str, entry: dict, limits: Limits, load: Load,
                 verdict: Verdict) -> None:
        for count, reason in ((verdict.expire, EXPIRED), (verdict.drop, verdict.drop_reason)):
            if count:
                self._drop(queue, entry, count, reason, load, limits.dead_letter)

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
        gearman.drop_function(self.config.gearman_servers, queue, self.config.gearman_tls)
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
        guard = int(most * self.config.queue_store_guard) if most else 0
        over = ""
        if guard and used >= guard:
            largest = ", ".join(f"{b.queue} ({b.depth:,} copies)" for b in backlogs[:3])
            over = (f"queue store full: {_mib(used)} of {_mib(most)} used, over the guard of "
                    f"{_mib(guard)}; largest backlogs: {largest or 'none'}")
        return {"used": used, "max": most, "guard": guard, "over": over}


def _mib(n: int) -> str:
    return f"{n / 1048576:.0f} MiB"
