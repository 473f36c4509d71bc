"""What the warden's verdicts do to a queue: copies taken from its head
(expired, over a drop-head limit: gearhorn/worker/reaper.py takes them as a
worker of the queue would, dead-lettered first when the subscription says
so), each in the ledger as ``dropped``; and a subscription with
``expires`` removed once it had no consumer for that long."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from gearhorn import gearman
from gearhorn.rules.limits import EXPIRED, REMOVED, Limits
from gearhorn.rules.messages import Subscription
from gearhorn.rules.retention import Verdict
from gearhorn.store.observers import Observer
from gearhorn.store.redisutil import text
from gearhorn.store.registry import Registry
from gearhorn.worker.reaper import Load, Reaper

log = logging.getLogger(__name__)


class Enforcing:
    """Carries out verdicts on the queues (the lease holder's alone)."""

    def __init__(self, servers: Sequence[tuple[str, int]], tls: gearman.TlsFiles | None,
                 registry: Registry, reaper: Reaper, observer: Observer) -> None:
        self.servers, self.tls = tuple(servers), tls
        self.registry = registry
        self.redis, self.keys = registry.redis, registry.keys
        self.reaper = reaper
        self.observer = observer

    def enforce(self, queue: str, entry: dict, limits: Limits, load: Load,
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

    def expired(self, queue: str, entry: dict, limits: Limits, load: Load,
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
        gearman.drop_function(self.servers, queue, self.tls)
        log.info("%s: subscription expired after %.0fs without a consumer; %d copies removed",
                 queue, now - last, emptied)
        return True
