"""A fanout, from its parsed request to its copies in gearmand.

Every fanout takes one path, :meth:`Fanouts.deliver`: resolve (pressure,
the subscriber look-up with the history appends riding along), make (the
copies, but for full reject-publish queues), submit (one write to gearmand),
then the tally and the observers. A run of plain fanouts goes through it as
one group; a fanout with a dedup id, headers or a delay first passes
:meth:`Fanouts.publish`, and a delayed one comes back through
:meth:`Fanouts.release` when it is due.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gearhorn import gearman
from gearhorn.errors import BadRequest
from gearhorn.rules.limits import FULL
from gearhorn.rules.messages import Fanout
from gearhorn.rules.naming import delayed_unique, header_id_for, new_message_id, queue_name
from gearhorn.store.dedup import Deduplicator
from gearhorn.store.delayed import DelayedItem, Scheduler
from gearhorn.store.headers import HeaderStore
from gearhorn.store.history import Entry, History
from gearhorn.store.ledgerentries import SharedSubscribers, SubscriberCopies
from gearhorn.store.observers import FailedCopy, Observer
from gearhorn.store.pressure import Pressure
from gearhorn.store.registry import Recipient
from gearhorn.store.rejectroom import RoomKeeper
from gearhorn.store.subscribers import SubscriberCache
from gearhorn.store.tally import TallyWriter
from gearhorn.worker import foreground
from gearhorn.worker.copies import Made, admit, claim_room, cut_copies, make_copies, result_ids
from gearhorn.worker.foreground import ForegroundSettings

PLAIN_KEPT = 10_000  # topics whose plain subscribers are remembered (the cache's size)


@dataclass(frozen=True, slots=True)
class FanoutStores:
    """The Redis stores a fanout writes besides its subscribers' queues."""

    headers: HeaderStore
    dedup: Deduplicator
    history: History
    room: RoomKeeper
    scheduler: Scheduler


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A fanout on its way: its request, its messages' ids, the ids of their
    stored headers (if any), and when its job came (for the latency metric)."""

    request: Fanout
    message_ids: list[str]
    header_ids: list[str] | None = None
    received: float | None = None


def _entries(out: Outgoing) -> tuple[str, list[Entry]]:
    """A fanout's messages as its topic's history keeps them."""
    request = out.request
    return request.topic, [(message_id, body, request.headers)
                           for message_id, body in zip(out.message_ids, request.bodies,
                                                       strict=True)]


class Fanouts:
    """Publishes fanouts: the one resolve -> make -> submit path."""

    def __init__(self, settings: ForegroundSettings, stores: FanoutStores, cache: SubscriberCache,
                 client: gearman.Client, observer: Observer | None = None,
                 tally: TallyWriter | None = None, pressure: Pressure | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.settings = settings
        self.stores = stores
        self.cache = cache
        self.client = client
        self.observer = observer or Observer()  # the ledger and the metrics
        self.tally = tally  # when each queue's copies were queued (gearhorn/store/tally.py)
        self.pressure = pressure  # full queues, a full store (gearhorn/store/pressure.py)
        self._sleep = sleep  # between retries of failed copies
        # topic -> (its recipients as last looked up, their SharedSubscribers
        # or None when some copy is not named the plain way)
        self._plain: dict[str, tuple[tuple[Recipient, ...], SharedSubscribers | None]] = {}

    def publish(self, request: Fanout, job_unique: str = "",
                received: float | None = None) -> dict[str, object]:
        """One fanout, deduplicated, scheduled or sent now; its result."""
        message_ids = request.ids(job_unique)
        dedup = self.stores.dedup
        if request.dedup_id is None:
            result = self._accept(request, message_ids, received)
            if request.unique and dedup.seen_unique(request.topic, request.unique,
                                                    job_unique or new_message_id()):
                result["coalesced"] = True  # gearmand merged its copies still queued
            return result
        first = dedup.claim(request.topic, request.dedup_id, message_ids[0])
        if first != message_ids[0]:
            return {"topic": request.topic, "copies": 0, "duplicate": True,
                    "background": request.background, **result_ids([first])}
        try:
            return self._accept(request, message_ids, received)
        except BadRequest:  # refused before any copy (a full store): a retry may go.
            dedup.release(request.topic, request.dedup_id, message_ids[0])
            raise  # An outage is not released: the worker runs this job again.

    def _accept(self, request: Fanout, message_ids: list[str],
                received: float | None) -> dict[str, object]:
        header_ids = self._keep_headers(request, message_ids)
        if request.deliver_at is not None and self._schedule(request, message_ids, header_ids):
            return {"topic": request.topic, "copies": 0, "background": True,
                    "scheduled": True, "deliver_at": request.deliver_at, **result_ids(message_ids)}
        return self.deliver([Outgoing(request, message_ids, header_ids, received)])[0]

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
            self.stores.headers.put(header_id, headers)
        return header_ids

    def _schedule(self, request: Fanout, message_ids: list[str],
                  header_ids: list[str] | None) -> bool:
        """Keep a delayed fanout in Redis; False if it is due already by
        Redis's clock (the caller sends it now)."""
        item = DelayedItem(request.deliver_at, tuple(message_ids), request.bodies,
                           topic=request.topic, unique=request.unique,
                           priority=request.priority, header_ids=tuple(header_ids or ()))
        return self.stores.scheduler.schedule(item)

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
        self.deliver([Outgoing(request, list(item.message_ids), list(item.header_ids) or None)],
                     client)

    def deliver(self, batch: Sequence[Outgoing], client: gearman.Client | None = None
                ) -> list[dict[str, object]]:
        """Queue one copy of each message per subscriber, for every fanout of
        ``batch`` (one priority; background, or a single foreground one);
        their results. Counted (gearhorn/store/stats.py) before the jobs are
        answered. Raises BadRequest while the queue store is full."""
        client = client or self.client
        made = self._resolve_and_make(batch)
        first = batch[0].request
        if not first.background:
            return [self._answered(batch[0], made[0], client)]
        client.submit_background([c for m in made for c in m.copies], first.priority)
        self._tallied(made)
        for out, m in zip(batch, made, strict=True):
            self._delivered(m, [], out.received)
        return [m.result() for m in made]

    def _resolve_and_make(self, batch: Sequence[Outgoing]) -> list[Made]:
        """Every fanout's copies, from one look-up for all their topics with
        their history appends riding along (run again, in any company, a
        message is appended once: lua/history_append.lua)."""
        full, over = self.pressure.current() if self.pressure else (frozenset(), "")
        if over:
            raise BadRequest(over)
        plan = self.stores.history.plan([_entries(out) for out in batch
                                         if not out.request.in_history], once_each=True)
        misses = self.cache.misses
        recipients, replies = self.cache.recipients_with(
            {out.request.topic: None for out in batch}, plan.calls)
        plan.settle(replies)
        full = self._after_lookup(misses, full)
        return [self._make(out, recipients[out.request.topic], full) for out in batch]

    def _after_lookup(self, misses: int, full: frozenset[str]) -> frozenset[str]:
        """``full``, or read again when the look-up found members the cache
        did not have: a reject-publish subscription made since the last
        read is then bounded from its first copy, not from the warden's
        next round (its room is written before its member: store/registry.py)."""
        if self.pressure is None or self.cache.misses == misses:
            return full
        return self.pressure.read_again()

    def _make(self, out: Outgoing, resolved: tuple[Recipient, ...],
              full: frozenset[str]) -> Made:
        """A fanout's copies for the subscribers the look-up ``resolved``,
        but the full reject-publish ones (recorded as not made)."""
        request, message_ids, header_ids = out.request, out.message_ids, out.header_ids
        kept, refused = admit(resolved, full)
        cut: dict[str, int] = {}
        if self.pressure is not None:
            kept, refused, cut = claim_room(self.stores.room, self.pressure.bounded, request,
                                            kept, refused)
        if header_ids is None and any(r.pattern is not None for r in kept):
            # A prefix subscriber's STOMP MESSAGE names the topic published to,
            # which only the headers can carry.
            header_ids = self._keep_headers(request, message_ids, needed=True)
        per, left = cut_copies(make_copies(request, message_ids, kept, header_ids), cut)
        self._not_made(request, message_ids, refused, header_ids)
        if left:  # reject-publish queues with room for the first messages only
            self.observer.not_made(FULL, request.topic, [
                (message_ids[i], copy.function, copy.unique) for i, copy in left])
        partly = tuple(r for r in kept if r.queue in cut)
        return Made(request, message_ids, per, kept, refused + partly, len(resolved))

    def _not_made(self, request: Fanout, message_ids: list[str],
                  refused: tuple[Recipient, ...], header_ids: list[str] | None) -> None:
        """Ledger entries for the copies reject-publish did not make: each
        with the unique key it would have had and its message id."""
        if not refused:
            return
        per = make_copies(request, message_ids, refused, header_ids)
        self.observer.not_made(FULL, request.topic, [
            (message_id, copy.function, copy.unique)
            for message_id, copies in zip(message_ids, per, strict=True) for copy in copies])

    def _tallied(self, made: Sequence[Made]) -> None:
        """Gearmand has these copies: their tally (bounded queues)."""
        if self.tally is not None:
            self.tally.add([c for m in made for c in m.copies])

    def _answered(self, out: Outgoing, made: Made, client: gearman.Client) -> dict[str, object]:
        """A foreground fanout, sent and waited for: its result with what its
        receivers answered (gearhorn/worker/foreground.py)."""
        request, settings = out.request, self.settings
        placed = client.start_foreground(made.copies, request.priority)
        self._tallied([made])
        answers = foreground.answers(client, made.copies, made.recipients, request, placed,
                                     settings, self._sleep)
        failed = answers.pop("_failed")
        self._delivered(made, failed, out.received)
        return {**made.result(), **answers}

    def _delivered(self, made: Made, failed: list[tuple[dict, str]],
                   received: float | None) -> None:
        """Ledger and metrics of a fanout, before its job is answered."""
        elapsed = None if received is None else time.monotonic() - received
        shared = self._shared(made)
        if shared is not None:  # no (queue, unique) pair per copy to build or record
            per_message = [(message_id, SubscriberCopies(message_id, shared))
                           for message_id in made.message_ids]
        else:
            per_message = [(message_id, [(c.function, c.unique) for c in mine])
                           for message_id, mine in zip(made.message_ids, made.per, strict=True)]
        self.observer.fanned_out(made.request.topic, per_message, made.width, [
            FailedCopy(f["queue"], unique, f"{f['status']}: {f['reason']}")
            for f, unique in failed], elapsed)

    def _shared(self, made: Made) -> SharedSubscribers | None:
        """The subscribers of a fanout whose every copy is named the plain
        way (one per direct subscriber and message; no unique key, headers or
        foreground mark of its own), found once per subscriber list: the
        look-up hands out the same tuple while the topic's members stay."""
        request, recipients = made.request, made.recipients
        if (not request.background or request.unique is not None or request.headers
                or any(len(copies) != len(recipients) for copies in made.per)):
            return None
        known = self._plain.get(request.topic)
        if known is None or known[0] is not recipients:
            plain = all(r.pattern is None and r.queue == queue_name(request.topic, r.client_id)
                        for r in recipients)
            if len(self._plain) >= PLAIN_KEPT:
                self._plain.clear()
            known = self._plain[request.topic] = (
                recipients, SharedSubscribers(request.topic, [r.client_id for r in recipients])
                if plain else None)
        return known[1]
