"""What happens to messages, told once to whoever keeps account of it.

The fanout service, the warden and the bridge hold one :class:`Observer`
and call its hooks; they never call the delivery ledger or the metrics
themselves. The ledger and the metrics are observers, each listening to
the hooks it records (dramatiq's middleware is the model: every hook is a
no-op until overridden), and :class:`Observers` tells several at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gearhorn.rules.events import Event
from gearhorn.store.ledger import Ledger
from gearhorn.store.stats import Stats

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class FailedCopy:
    """A foreground copy its receiver failed or did not answer in time."""

    queue: str
    unique: str
    reason: str


class Observer:
    """Every hook; each does nothing here."""

    def fanned_out(self, topic: str, per_message: Sequence[tuple[str, Sequence[tuple[str, str]]]],
                   width: int, failed: Sequence[FailedCopy] = (),
                   seconds: float | None = None) -> None:
        """A fanout's messages (message id, its copies as (queue, unique))
        went to gearmand; ``width`` subscribers were looked up for each;
        ``seconds`` since the job came."""

    def not_made(self, reason: str, topic: str,
                 copies: Sequence[tuple[str, str, str]]) -> None:
        """Copies (message id, queue, unique) a full queue refused."""

    def dropped(self, reason: str, topic: str, queue: str, uniques: Sequence[str]) -> None:
        """Queued copies a queue's limits did not keep."""

    def refused(self, function: str, reason: str) -> None:
        """A job refused: bad input, or no service."""

    def dead_lettered(self, queue: str, unique: str, reason: str) -> None:
        """A bridge moved a message to ``<queue>.dlq``."""

    def attached(self, queue: str) -> None:
        """A STOMP subscription started reading ``queue``."""

    def delivered(self, queue: str, unique: str, redelivered: bool) -> None:
        """A bridge handed a message of ``queue`` to a STOMP client."""

    def acked(self, queue: str, unique: str) -> None:
        """Its STOMP client acknowledged it (or it was sent, in auto mode)."""

    def streamed(self, queue: str, span: str) -> None:
        """A stream subscription (``queue``: ``<topic>_<client_id>``) was
        given a run of its topic's offsets (``span``: events.stream_span)."""

    def flush(self) -> None:
        """Write what is buffered now (the flushers also do, every 0.1-0.2 s)."""


class Observers(Observer):
    """Tells each of ``observers`` everything, in order.

    One failing observer does not keep the others from hearing, nor fail
    the fanout or delivery it was told of (dramatiq isolates its middleware
    the same way): its exception is logged. ``flush`` is the exception: it
    tells every observer, then raises the first failure, because a caller
    that flushes before it answers (the ledger before an acknowledgement)
    must not answer as if it had been written."""

    def __init__(self, *observers: Observer) -> None:
        self.observers = observers

    def _tell(self, hook: str, *args: object) -> None:
        for observer in self.observers:
            try:
                getattr(observer, hook)(*args)
            except Exception:
                log.exception("observer %s failed in %s", type(observer).__name__, hook)

    def fanned_out(self, topic, per_message, width, failed=(), seconds=None) -> None:
        self._tell("fanned_out", topic, per_message, width, failed, seconds)

    def not_made(self, reason, topic, copies) -> None:
        self._tell("not_made", reason, topic, copies)

    def dropped(self, reason, topic, queue, uniques) -> None:
        self._tell("dropped", reason, topic, queue, uniques)

    def refused(self, function, reason) -> None:
        self._tell("refused", function, reason)

    def dead_lettered(self, queue, unique, reason) -> None:
        self._tell("dead_lettered", queue, unique, reason)

    def attached(self, queue) -> None:
        self._tell("attached", queue)

    def delivered(self, queue, unique, redelivered) -> None:
        self._tell("delivered", queue, unique, redelivered)

    def streamed(self, queue, span) -> None:
        self._tell("streamed", queue, span)

    def acked(self, queue, unique) -> None:
        self._tell("acked", queue, unique)

    def flush(self) -> None:
        first: Exception | None = None
        for observer in self.observers:
            try:
                observer.flush()
            except Exception as exc:
                first = first or exc
        if first is not None:
            raise first


class LedgerObserver(Observer):
    """Every step into the delivery ledger (buffered: its flusher writes).
    ``recorded`` hears of each bridge event (the bridge flushes early when
    many are buffered)."""

    def __init__(self, ledger: Ledger, recorded: Callable[[], None] | None = None) -> None:
        self.ledger = ledger
        self._recorded = recorded

    def fanned_out(self, topic, per_message, width, failed=(), seconds=None) -> None:
        # Per message, the width looked up apart from the copies gearmand
        # accepted: a copy made for no one or never made shows up in the
        # reconciliation as a width mismatch.
        for message_id, copies in per_message:
            self.ledger.published(topic, message_id, copies, width)
        for f in failed:
            self.ledger.failed(f.reason, topic, f.queue, f.unique)

    def not_made(self, reason, topic, copies) -> None:
        for message_id, queue, unique in copies:
            self.ledger.dropped(reason, topic, queue, unique, message_id)

    def dropped(self, reason, topic, queue, uniques) -> None:
        for unique in uniques:
            self.ledger.dropped(reason, topic, queue, unique)

    def refused(self, function, reason) -> None:
        self.ledger.failed(f"{function}: {reason}")

    def dead_lettered(self, queue, unique, reason) -> None:
        self.ledger.failed(f"dead-lettered: {reason}", subscriber=queue, unique=unique)

    def attached(self, queue) -> None:
        self._record(Event.ATTACHED, queue)

    def delivered(self, queue, unique, redelivered) -> None:
        self._record(Event.DELIVERED, queue, unique, redelivered)

    def acked(self, queue, unique) -> None:
        self._record(Event.ACKED, queue, unique)

    def streamed(self, queue, span) -> None:
        self._record(Event.STREAMED, queue, span)

    def flush(self) -> None:
        self.ledger.flush()

    def _record(self, event: str, queue: str, unique: str = "",
                redelivered: bool = False) -> None:
        self.ledger.record(event, queue, unique, redelivered)
        if self._recorded is not None:
            self._recorded()


class StatsObserver(Observer):
    """The counters behind the metrics (gearhorn/store/stats.py)."""

    def __init__(self, stats: Stats) -> None:
        self.stats = stats

    def fanned_out(self, topic, per_message, width, failed=(), seconds=None) -> None:
        copies = sum(len(c) for _, c in per_message)
        self.stats.fanout(topic, len(per_message), copies, seconds)

    def dropped(self, reason, topic, queue, uniques) -> None:
        self.stats.dropped(topic, reason, len(uniques))

    # No flush: the worker's flusher thread alone writes the counters.
