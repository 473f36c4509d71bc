"""Dead letters: list them without consuming, move them back, or drop them.

Why it is shaped so: docs/design/notes.rst, "gearhorn/store/deadletters.py".
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

import redis

from gearhorn import gearman
from gearhorn.rules.naming import dead_letter_queue, header_id_of, queue_copy_unique, stomp_unique
from gearhorn.store import durability
from gearhorn.store.durability import NO_DURABILITY, Durability
from gearhorn.store.headers import HeaderStore
from gearhorn.store.heldcopies import HeldCopies, HeldCopy
from gearhorn.store.keys import Keys
from gearhorn.store.redisutil import text
from gearhorn.store.stats import Stats
from gearhorn.store.tally import TallyWriter

PREVIEW_BYTES = 200
DLQ_HEADER_PREFIX = "dlq-"
GRAB_BATCH = 100


@dataclass(frozen=True)
class DeadLetter:
    header_id: str
    at: float  # epoch seconds
    reason: str
    deliveries: int
    size: int
    preview: str

    def to_dict(self) -> dict[str, object]:
        return {"id": self.header_id, "at": self.at, "reason": self.reason,
                "deliveries": self.deliveries, "size": self.size, "preview": self.preview}


def preview_of(body: bytes) -> str:
    head = body[:PREVIEW_BYTES].decode("utf-8", "replace")
    return head + ("..." if len(body) > PREVIEW_BYTES else "")


class DeadLetterIndex:
    """What the bridge writes when it dead-letters, and what ``list`` reads."""

    def __init__(self, client: redis.Redis, keys: Keys, stats: Stats | None = None) -> None:
        self.redis = client
        self.keys = keys
        self.stats = stats

    def record(self, queue: str, header_id: str, reason: str, deliveries: int,
               body: bytes, now: float | None = None) -> None:
        at = time.time() if now is None else now
        info = {"at": at, "reason": reason, "deliveries": deliveries, "size": len(body),
                "preview": preview_of(body)}
        pipe = self.redis.pipeline(transaction=False)
        # Microseconds: two letters in one millisecond (two NACKs read
        # together) tied, and Redis then ordered them by their random ids.
        pipe.zadd(self.keys.dead(queue), {header_id: int(at * 1_000_000)})
        pipe.hset(self.keys.dead_info(queue), header_id, json.dumps(info))
        if self.stats is not None:
            self.stats.dead_letter(queue, pipe)
        pipe.execute()

    def list(self, queue: str, limit: int = 100) -> list[DeadLetter]:
        """The oldest ``limit`` dead letters of ``queue`` still indexed."""
        ids = [text(i) for i in self.redis.zrange(self.keys.dead(queue), 0, limit - 1)]
        if not ids:
            return []
        letters = []
        for header_id, raw in zip(ids, self.redis.hmget(self.keys.dead_info(queue), ids),
                                  strict=True):
            info = json.loads(raw) if raw else {}
            letters.append(DeadLetter(header_id, info.get("at", 0.0), info.get("reason", "?"),
                                      info.get("deliveries", 0), info.get("size", 0),
                                      info.get("preview", "")))
        return letters

    def indexed(self, queue: str) -> int:
        return self.redis.zcard(self.keys.dead(queue))

    def forget(self, queue: str, header_ids: Sequence[str]) -> None:
        if header_ids:
            pipe = self.redis.pipeline(transaction=False)
            pipe.zrem(self.keys.dead(queue), *header_ids)
            pipe.hdel(self.keys.dead_info(queue), *header_ids)
            pipe.execute()


def queued(servers: Sequence[tuple[str, int]], function: str,
           tls: gearman.TlsFiles | None = None) -> int:
    """Jobs of ``function`` waiting, summed over every gearmand."""
    found = gearman.totals(servers, tls).get(function)
    return found.queued if found else 0


class DeadLetterMover:
    """Takes dead letters off ``<queue>.dlq`` on every gearmand."""

    def __init__(self, servers: Sequence[tuple[str, int]], index: DeadLetterIndex,
                 headers: HeaderStore, tls: gearman.TlsFiles | None = None,
                 durability: Durability = NO_DURABILITY,
                 held: HeldCopies | None = None) -> None:
        self.servers = tuple(servers)
        # copies = held: requeued copies are kept as records, under a holder
        # with no heartbeat, so a worker's holder takes them over at its next
        # look (about a second) and hands them; else they go to gearmand.
        self.held = held
        self.index = index
        self.headers = headers
        self.tls = tls
        # Requeued copies on disk before their dead letters are completed.
        self.durability = durability
        self.tally = TallyWriter(index.redis, index.keys)

    def requeue(self, queue: str, count: int | None = None) -> int:
        """Move up to ``count`` (all: None) dead letters back to ``queue``."""
        return self._drain(queue, count, resubmit=True)

    def purge(self, queue: str) -> int:
        """Drop every dead letter of ``queue``; returns how many."""
        return self._drain(queue, None, resubmit=False)

    def _drain(self, queue: str, count: int | None, resubmit: bool) -> int:
        moved = 0
        client = gearman.Client(self.servers, tls=self.tls) if resubmit else None
        # A bounded queue's copies are tallied (the warden's ages and sizes).
        tallied = resubmit and self.index.redis.hexists(self.index.keys.subscriptions, queue)
        try:
            for host, port in self.servers:
                if count is not None and moved >= count:
                    break
                left = None if count is None else count - moved
                moved += self._drain_server(host, port, queue, left, client, tallied)
        finally:
            if client is not None:
                client.close()
        return moved

    def _drain_server(self, host: str, port: int, queue: str, count: int | None,
                      client: gearman.Client | None, tallied: bool = False) -> int:
        worker = gearman.WorkerConnection(host, port, [dead_letter_queue(queue)],
                                          client_id="gearhorn-dlq", tls=self.tls)
        worker.open()
        moved = 0
        try:
            while count is None or moved < count:
                want = GRAB_BATCH if count is None else min(GRAB_BATCH, count - moved)
                jobs = worker.grab(want)
                if not jobs:
                    break
                if client is not None:
                    copies = self._back_to_queue(queue, jobs)
                    self._submit(client, copies)
                    if tallied:
                        self.tally.add(copies)
                        self.tally.flush()
                    self.durability.wait()
                for job in jobs:
                    worker.complete(job.handle)
                self.index.forget(queue, [h for j in jobs if (h := header_id_of(j.unique))])
                moved += len(jobs)
        finally:
            worker.close()
        return moved

    def _submit(self, client: gearman.Client, copies: list[gearman.Copy]) -> None:
        if self.held is None:
            client.submit_background(copies)
            return
        holder = f"dlq-requeue:{uuid.uuid4().hex[:12]}"
        self.held.keep([HeldCopy(c.function, c.unique, c.data, holder) for c in copies])

    def _back_to_queue(self, queue: str, jobs: list[gearman.GrabbedJob]) -> list[gearman.Copy]:
        """Each job as a new message of ``queue``, with its headers but not the
        ``dlq-*`` ones (a fresh delivery count)."""
        found = self.headers.for_uniques(j.unique for j in jobs)
        copies = []
        for job in jobs:
            headers = {k: v for k, v in found.get(job.unique, {}).items()
                       if not k.startswith(DLQ_HEADER_PREFIX)}
            message_id = uuid.uuid4().hex
            if headers:
                self.headers.put(message_id, headers)
                unique = queue_copy_unique(message_id)
            else:
                unique = stomp_unique(message_id)
            copies.append(gearman.Copy(queue, unique, job.data))
        return copies


def for_config(config, client: redis.Redis) -> tuple[DeadLetterIndex, DeadLetterMover]:
    """The index and mover for ``config``'s servers (the CLI and the console)."""
    keys = Keys.for_config(config)
    index = DeadLetterIndex(client, keys, Stats(client, keys, config.metrics_enabled))
    held = HeldCopies(client, keys) if config.copies == "held" else None
    mover = DeadLetterMover(config.gearman_servers, index,
                            HeaderStore(client, keys, config.headers_ttl), config.gearman_tls,
                            durability.for_config(config, client), held)
    return index, mover
