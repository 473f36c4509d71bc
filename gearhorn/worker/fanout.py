"""The worker: ``subscribe_fanout``, ``unsubscribe_fanout``, ``fanout``.

:class:`FanoutService` is the logic (bytes in, JSON bytes out, BadRequest
for bad input), whatever brings the jobs; gearhorn/worker/process.py's
``WorkerProcess`` feeds it jobs from gearmand and answers them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from gearhorn import gearman
from gearhorn.config import Config
from gearhorn.errors import GearhornError
from gearhorn.limits import FULL
from gearhorn.messages import (
    BadRequest,
    Fanout,
    header_id_for,
    parse_fanout,
    parse_history,
    parse_presence,
    parse_subscription,
)
from gearhorn.naming import delayed_unique, new_message_id
from gearhorn.observers import FailedCopy, Observer
from gearhorn.store.dedup import Deduplicator
from gearhorn.store.delayed import DelayedItem, Scheduler
from gearhorn.store.headers import HeaderStore
from gearhorn.store.history import Entry, History
from gearhorn.store.presence import Presence
from gearhorn.store.pressure import Pressure
from gearhorn.store.redisconn import REDIS_ERRORS
from gearhorn.store.registry import Recipient, Registry
from gearhorn.store.room import RoomKeeper
from gearhorn.store.subscribers import SubscriberCache
from gearhorn.store.tally import TallyWriter
from gearhorn.worker import foreground
from gearhorn.worker.copies import (
    Made,
    admit,
    claim_room,
    cut_copies,
    make_copies,
    plain,
    result_ids,
)

log = logging.getLogger(__name__)

SUBSCRIBE = "subscribe_fanout"
SUBSCRIBE_ALIAS = "register_fanout_subscriber"
UNSUBSCRIBE = "unsubscribe_fanout"
FANOUT = "fanout"
PRESENCE = "topic_presence"
HISTORY = "topic_history"
FUNCTIONS = (SUBSCRIBE, SUBSCRIBE_ALIAS, UNSUBSCRIBE, FANOUT, PRESENCE, HISTORY)


class ServiceUnavailable(GearhornError):
    """Redis or gearmand cannot take the request now; the message says which."""


def _dumps(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True)
class Job:
    """A job as the service sees it: ``unique`` is its Gearman unique key,
    ``received`` when it came (``time.monotonic()``, for the latency metric)."""

    function: str
    data: bytes
    unique: str = ""
    received: float | None = None


Answer = bytes | BadRequest  # a job's result, or why it was refused


def _entries(request: Fanout, message_ids: list[str]) -> tuple[str, list[Entry]]:
    """A fanout's messages as its topic's history keeps them."""
    return request.topic, [(message_id, body, request.headers)
                           for message_id, body in zip(message_ids, request.bodies, strict=True)]


@contextlib.contextmanager
def _unavailable_when_servers_fail() -> Iterator[None]:
    try:
        yield
    except REDIS_ERRORS as exc:
        raise ServiceUnavailable(f"registry unavailable (redis: {exc})") from None
    except gearman.GearmanError as exc:
        raise ServiceUnavailable(f"gearmand unavailable: {exc}") from None


class FanoutService:
    """What the Gearman functions do, independent of how jobs arrive."""

    def __init__(self, config: Config, registry: Registry, cache: SubscriberCache,
                 client: gearman.Client, observer: Observer | None = None,
                 sleep=time.sleep, tally: TallyWriter | None = None,
                 pressure: Pressure | None = None) -> None:
        self.config = config
        self.tally = tally  # when each queue's copies were queued (gearhorn/store/tally.py)
        self.pressure = pressure  # full queues, a full store (gearhorn/store/pressure.py)
        self.registry = registry
        self.cache = cache
        self.client = client
        self.observer = observer or Observer()  # the ledger and the metrics
        self.headers = HeaderStore(registry.redis, registry.keys, config.headers_ttl)
        self.dedup = Deduplicator(registry.redis, registry.keys, config.dedup_window)
        self.history = History(registry.redis, registry.keys, config.history_policy)
        self.room = RoomKeeper(registry.redis, registry.keys)
        self.scheduler = Scheduler(registry.redis, registry.keys, config.delay_shard_seconds,
                                   config.delay_lease, config.delay_lanes)
        self._sleep = sleep  # between retries of failed copies
        self._handlers = {SUBSCRIBE: self.subscribe, SUBSCRIBE_ALIAS: self.subscribe,
                          UNSUBSCRIBE: self.unsubscribe, FANOUT: self.fanout,
                          PRESENCE: self.presence, HISTORY: self.history_of}

    def handle(self, function: str, data: bytes, job_unique: str = "",
               received: float | None = None) -> bytes:
        """Run one job; raises BadRequest (bad input) or ServiceUnavailable.

        ``job_unique`` is the Gearman unique key of the job, which makes a
        fanout's message ids the same each time the job runs; ``received``
        (``time.monotonic()``) is when it came, for the latency metric."""
        handler = self._handlers.get(function)
        if handler is None:  # looked up apart: a KeyError inside a handler is a bug
            raise BadRequest(f"unknown function {function!r}")
        with _unavailable_when_servers_fail():
            if function == FANOUT:
                return self.fanout(data, job_unique, received)
            return handler(data)

    def _run_fanout(self, job: Job, request: Fanout) -> Answer:
        """A fanout parsed already (run alone: not plain)."""
        try:
            with _unavailable_when_servers_fail():
                return self._fanout(request, job.unique, job.received)
        except BadRequest as exc:
            return exc

    def run(self, jobs: Sequence[Job]) -> Iterator[list[Answer]]:
        """Run ``jobs`` in order, yielding the outcomes of each group of them
        as it is done.

        Consecutive plain fanouts (background, one priority, no headers, no
        delay) are one group: one subscriber look-up for all their topics
        and one Gearman write for all their copies, which is what makes a
        worker fast when small fanouts queue up. Any other job is a group of its
        own. Raises ServiceUnavailable (Redis or gearmand away): the groups yielded
        are done, the others are not.
        """
        for group in self._groups(jobs):
            if isinstance(group, list):
                with _unavailable_when_servers_fail():
                    outcomes = self._plain_fanouts(group)
                yield outcomes
                continue
            job, request, refused = group
            if request is not None:
                yield [self._run_fanout(job, request)]
                continue
            if refused is None:
                try:
                    yield [self.handle(job.function, job.data, job.unique, job.received)]
                    continue
                except BadRequest as exc:
                    refused = exc
            yield [refused]

    def _groups(self, jobs: Sequence[Job]
                ) -> Iterator[list[tuple[Job, Fanout]]
                              | tuple[Job, Fanout | None, BadRequest | None]]:
        """Runs of plain fanouts as lists; any other job alone, with its
        parsed fanout, or the reason parsing it refused it (each job is
        parsed once, here)."""
        run: list[tuple[Job, Fanout]] = []
        for job in jobs:
            request, refused = None, None
            if job.function == FANOUT:
                try:
                    request = parse_fanout(job.data, self.config.max_payload_bytes)
                except BadRequest as exc:
                    refused = exc
            grouped = request is not None and plain(request)
            if run and not (grouped and request.priority == run[0][1].priority):
                yield run
                run = []
            if grouped:
                run.append((job, request))
            else:
                yield job, request, refused
        if run:
            yield run

    def _plain_fanouts(self, run: list[tuple[Job, Fanout]]) -> list[Answer]:
        full, over = self._pressure()
        if over:
            return [BadRequest(over) for _, _ in run]
        ids = [request.ids(job.unique) for job, request in run]
        # One round trip for every topic, after every job of the run was
        # taken, with the messages' history appends riding along (run again,
        # in any company, a message is appended once: lua/history_append.lua).
        plan = self.history.plan([_entries(request, message_ids)
                                  for (_, request), message_ids in zip(run, ids, strict=True)
                                  if not request.in_history], once_each=True)
        misses = self.cache.misses
        recipients, replies = self.cache.recipients_with(
            {request.topic: None for _, request in run}, plan.calls)
        plan.settle(replies)
        full = self._after_lookup(misses, full)
        made = [self._make(request, message_ids, recipients[request.topic], full)
                for (_, request), message_ids in zip(run, ids, strict=True)]
        copies = [c for m in made for c in m.copies]
        self.client.submit_background(copies, run[0][1].priority)
        self._sent(made, remember=False)
        outcomes: list[Answer] = []
        for (job, _), m in zip(run, made, strict=True):
            self._delivered(m, [], job.received)
            outcomes.append(_dumps(m.result()))
        return outcomes

    def _make(self, request: Fanout, message_ids: list[str],
              resolved: tuple[Recipient, ...], full: frozenset[str],
              header_ids: list[str] | None = None) -> Made:
        """A fanout's copies for the subscribers the look-up ``resolved``,
        but the full reject-publish ones (recorded as not made)."""
        kept, refused = admit(resolved, full)
        cut: dict[str, int] = {}
        if self.pressure is not None:
            kept, refused, cut = claim_room(self.room, self.pressure.bounded, request, kept,
                                            refused)
        per, left = cut_copies(self._copies(request, message_ids, kept, header_ids), cut)
        self._refused(request, message_ids, refused, header_ids)
        if left:  # reject-publish queues with room for the first messages only
            self.observer.not_made(FULL, request.topic, [
                (message_ids[i], copy.function, copy.unique) for i, copy in left])
        partly = tuple(r for r in kept if r.queue in cut)
        return Made(request, message_ids, per, kept, refused + partly, len(resolved))

    def _pressure(self) -> tuple[frozenset[str], str]:
        return self.pressure.current() if self.pressure else (frozenset(), "")

    def _after_lookup(self, misses: int, full: frozenset[str]) -> frozenset[str]:
        """``full``, or read again when the look-up found members the cache
        did not have: a reject-publish subscription made since the last
        read is then bounded from its first copy, not from the warden's
        next round (its room is written before its member: store/registry.py)."""
        if self.pressure is None or self.cache.misses == misses:
            return full
        return self.pressure.read_again()

    def _sent(self, made: Sequence[Made], remember: bool = True) -> None:
        """Gearmand has these fanouts' copies: their tally (bounded queues)
        and (unless written already) their messages in the topics' history."""
        if self.tally is not None:
            self.tally.add([c for m in made for c in m.copies])
        if remember:
            self._remember(made)

    def _refused(self, request: Fanout, message_ids: list[str],
                 refused: tuple[Recipient, ...], header_ids: list[str] | None = None) -> None:
        """Ledger entries for the copies reject-publish did not make: each
        with the unique key it would have had and its message id."""
        if not refused:
            return
        per = make_copies(request, message_ids, refused, header_ids)
        self.observer.not_made(FULL, request.topic, [
            (message_id, copy.function, copy.unique)
            for message_id, copies in zip(message_ids, per, strict=True) for copy in copies])

    def subscribe(self, data: bytes) -> bytes:
        sub = parse_subscription(data)
        count = self.registry.subscribe(sub)
        return _dumps({"topic": sub.topic, "client_id": sub.client_id, "subscribers": count})

    def unsubscribe(self, data: bytes) -> bytes:
        sub = parse_subscription(data)
        count = self.registry.unsubscribe(sub)
        return _dumps({"topic": sub.topic, "client_id": sub.client_id, "subscribers": count})

    def presence(self, data: bytes) -> bytes:
        return _dumps(Presence(self.registry).of(parse_presence(data)))

    def history_of(self, data: bytes) -> bytes:
        query = parse_history(data)
        return _dumps(self.history.read(query.topic, query.since, query.limit, query.epoch))

    def _remember(self, made: Sequence[Made]) -> None:
        """The messages of these fanouts in their topics' history (if on)."""
        if self.history.enabled:
            self.history.append([_entries(m.request, m.message_ids) for m in made
                                 if not m.request.in_history], once_each=True)

    def fanout(self, data: bytes, job_unique: str = "", received: float | None = None) -> bytes:
        return self._fanout(parse_fanout(data, self.config.max_payload_bytes), job_unique,
                            received)

    def _fanout(self, request: Fanout, job_unique: str, received: float | None) -> bytes:
        message_ids = request.ids(job_unique)
        if request.dedup_id is None:
            result = self._accept(request, message_ids, received)
            if request.unique and self.dedup.seen_unique(request.topic, request.unique,
                                                         job_unique or new_message_id()):
                result["coalesced"] = True  # gearmand merged its copies still queued
            return _dumps(result)
        first = self.dedup.claim(request.topic, request.dedup_id, message_ids[0])
        if first != message_ids[0]:
            return _dumps({"topic": request.topic, "copies": 0, "duplicate": True,
                           "background": request.background, **result_ids([first])})
        try:
            return _dumps(self._accept(request, message_ids, received))
        except BadRequest:  # refused before any copy (a full store): a retry may go.
            self.dedup.release(request.topic, request.dedup_id, message_ids[0])
            raise  # An outage is not released: the worker runs this job again.

    def _accept(self, request: Fanout, message_ids: list[str],
                received: float | None) -> dict[str, object]:
        header_ids = self._keep_headers(request, message_ids)
        if request.deliver_at is not None and self._schedule(request, message_ids, header_ids):
            return {"topic": request.topic, "copies": 0, "background": True,
                    "scheduled": True, "deliver_at": request.deliver_at, **result_ids(message_ids)}
        return self.deliver(request, message_ids, header_ids, received)

    def _keep_headers(self, request: Fanout, message_ids: list[str],
                      needed: bool = False) -> list[str] | None:
        """Store the request's headers once per message (with the topic it was
        published to, for prefix subscribers); None without headers, unless
        ``needed``."""
        if not request.headers and not needed:
            return None
        headers = {**request.headers, "destination": f"/topic/{request.topic}"}
        header_ids = [header_id_for(m, request.unique) for m in message_ids]
        for header_id in header_ids:
            self.headers.put(header_id, headers)
        return header_ids

    def _schedule(self, request: Fanout, message_ids: list[str],
                  header_ids: list[str] | None) -> bool:
        """Keep a delayed fanout in Redis; False if it is due already by
        Redis's clock (the caller sends it now)."""
        item = DelayedItem(request.deliver_at, tuple(message_ids), request.bodies,
                           topic=request.topic, unique=request.unique,
                           priority=request.priority, header_ids=tuple(header_ids or ()))
        return self.scheduler.schedule(item)

    def release(self, item: DelayedItem, client: gearman.Client | None = None) -> None:
        """Send a delayed message that is due (called by the worker's releaser,
        from its own thread: with a ``client`` of its own)."""
        client = client or self.client
        if item.queue:  # the bridge set its unique key (headers mark included)
            unique = item.unique or delayed_unique(item.message_ids[0])
            client.submit_background([gearman.Copy(item.queue, unique, item.bodies[0])],
                                     item.priority)
            return
        request = Fanout(item.topic, item.bodies, item.unique, True, item.priority)
        self.deliver(request, list(item.message_ids), list(item.header_ids) or None,
                     client=client)

    def deliver(self, request: Fanout, message_ids: list[str],
                header_ids: list[str] | None = None, received: float | None = None,
                client: gearman.Client | None = None) -> dict[str, object]:
        """Queue one copy of each message per subscriber; the fanout's result.
        Counted (gearhorn/store/stats.py) before the job is answered."""
        client = client or self.client
        full, over = self._pressure()
        if over:
            raise BadRequest(over)
        misses = self.cache.misses
        resolved = self.cache.recipients_of([request.topic])[request.topic]
        full = self._after_lookup(misses, full)
        made = self._make(request, message_ids, resolved, full, header_ids)
        copies = made.copies
        result = made.result()
        if request.background:
            client.submit_background(copies, request.priority)
            self._sent([made])
            failed = []
        else:
            placed = client.start_foreground(copies, request.priority)
            self._sent([made])
            result.update(self._answers(request, made, client, placed))
            failed = result.pop("_failed")
        self._delivered(made, failed, received)
        return result

    def _copies(self, request: Fanout, message_ids: list[str],
                recipients: tuple[Recipient, ...],
                header_ids: list[str] | None = None) -> list[list[gearman.Copy]]:
        if header_ids is None and any(r.pattern is not None for r in recipients):
            # A prefix subscriber's STOMP MESSAGE names the topic published to,
            # which only the headers can carry.
            header_ids = self._keep_headers(request, message_ids, needed=True)
        return make_copies(request, message_ids, recipients, header_ids)

    def _delivered(self, made: Made, failed: list[tuple[dict, str]],
                   received: float | None) -> None:
        """Ledger and metrics of a fanout, before its job is answered."""
        elapsed = None if received is None else time.monotonic() - received
        per_message = [(message_id, [(c.function, c.unique) for c in mine])
                       for message_id, mine in zip(made.message_ids, made.per, strict=True)]
        self.observer.fanned_out(made.request.topic, per_message, made.width, [
            FailedCopy(f["queue"], unique, f"{f['status']}: {f['reason']}")
            for f, unique in failed], elapsed)

    def _answers(self, request: Fanout, made: Made, client: gearman.Client,
                 placed: gearman.Placed) -> dict[str, object]:
        """A foreground fanout's receivers answered (gearhorn/worker/foreground.py):
        ``completed``, ``failed`` and, gathered, ``answers``; ``_failed`` for the ledger."""
        copies, config = made.copies, self.config
        attempts = request.answering.attempts or config.fanout_attempts
        outcomes, tries = foreground.run_copies(client, copies, request.priority, placed,
                                                attempts, config.fanout_timeout,
                                                config.retry_backoff, self._sleep)
        by_queue = {r.queue: r for r in made.recipients}
        targets = [by_queue[c.function] for c in copies]
        failed = foreground.failures(targets, outcomes, copies, tries)
        answers = {"completed": len(copies) - len(failed), "failed": [f for f, _ in failed],
                   "_failed": failed}
        if request.answering.gather:
            answers.update(foreground.gathered(targets, outcomes, tries,
                                               config.gather_max_bytes))
        return answers

    def record_rejection(self, function: str, reason: str) -> None:
        self.observer.refused(function, reason)
