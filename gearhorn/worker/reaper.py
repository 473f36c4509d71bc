"""Taking copies off a queue's head, as a worker of the queue would (the
warden's drops, expiries and dead letters), and gearmand's view of each
queue (:func:`gearmand_loads`)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gearhorn import gearman
from gearhorn.rules.naming import FOREGROUND_MARK, dead_letter_queue, is_held, queue_copy_unique
from gearhorn.store.deadletters import DeadLetterIndex
from gearhorn.store.headers import HeaderStore
from gearhorn.store.redisconn import REDIS_ERRORS

log = logging.getLogger(__name__)

GRAB_BATCH = 100
Server = tuple[str, int]


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
            if not (queued or running or workers):
                continue  # as good as absent: gearmand keeps every function it met
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
                 index: DeadLetterIndex, tls=None,
                 submit: Callable[[Sequence[gearman.Copy]], object] | None = None) -> None:
        self.servers = tuple(servers)
        self.headers = headers
        self.index = index
        self.tls = tls
        # Where dead letters go: held copies' submit (copies = held), or
        # straight into gearmand's queue.
        self.submit = submit or self._submit_to_gearmand

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
                    if job.unique.startswith(FOREGROUND_MARK) or is_held(job.unique):
                        # Its submitter waits for an answer: a foreground
                        # fanout, or a held copy (whose record then goes).
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
        self.submit(copies)

    def _submit_to_gearmand(self, copies: Sequence[gearman.Copy]) -> None:
        client = gearman.Client(self.servers, tls=self.tls)
        try:
            client.submit_background(copies)
        finally:
            client.close()


def _echo(worker: gearman.WorkerConnection) -> None:
    from gearhorn.gearman import P, encode

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
