"""What Redis knows of the jobs one queue dispatcher grabs (runs under
gevent): each job's headers, the original of a job that a bridge gave back,
and whether some bridge handed it out before (``redelivered``); and the
hand-out counts of acknowledged jobs, forgotten with the next grab's call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from gearhorn import gearman
from gearhorn.rules.naming import own_unique, returned_token
from gearhorn.runtime.background import Outage
from gearhorn.store.redeliveries import Redeliveries, Returned
from gearhorn.store.redisconn import REDIS_ERRORS

log = logging.getLogger(__name__)

HeadersOf = Callable[[list[str]], dict[str, dict[str, str]]]


class JobAnswers(Protocol):
    """The connection an acked job's WORK_COMPLETE went on
    (gearman.WorkerConnection)."""

    answers_given: int
    answers_read: int  # of those, the ones gearmand surely read

    @property
    def is_open(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class _Settled:
    unique: str
    worker: JobAnswers
    answer: int  # its WORK_COMPLETE's number on that connection

    @property
    def landed(self) -> bool:
        return self.worker.answers_read >= self.answer

    @property
    def lost(self) -> bool:
        """Its connection closed before gearmand surely read it: gearmand may
        hand the job out again, as a redelivery."""
        return not self.landed and not self.worker.is_open


@dataclass(frozen=True, slots=True)
class KnownJob:
    """A grabbed job as the subscribers must see it."""

    unique: str  # the message's own key (a given-back job's original)
    headers: dict[str, str] | None
    redelivered: bool
    tracked: bool  # its hand-out is counted: forget it once it is acked


class JobInfo:
    """Looks grabbed jobs up in Redis, in one round trip per kind per batch.
    ``handouts`` is a shared queue's (``/queue/``, durable subscriptions):
    a private queue counts nothing."""

    def __init__(self, function: str, headers_of: HeadersOf | None = None,
                 handouts: Redeliveries | None = None) -> None:
        self.function = function
        self._headers_of = headers_of
        self._handouts = handouts
        # Acknowledged, to forget in Redis once gearmand has surely read the
        # WORK_COMPLETE: a kill -9 can drop one still in the socket's
        # buffers, gearmand hands the job out again, and a count forgotten
        # already would call it redelivered:false.
        self._settled: list[_Settled] = []
        self._outage = Outage(log, f"redis (hand-outs of {function})")

    def known(self, jobs: list[gearman.GrabbedJob]) -> list[KnownJob]:
        """What the subscribers of ``jobs`` must see. Raises GearmanError when
        Redis cannot say: never deliver a message without its headers (a
        reply-to would be lost) or as someone it is not; the dispatcher drops
        the connection, gearmand takes the jobs back, and it retries."""
        returned = self._returned(jobs)
        uniques = [r.unique if (r := returned.get(job.unique)) else own_unique(job.unique)
                   for job in jobs]
        headers = self._headers(uniques)
        before = self._take(uniques)
        tracked = self._handouts is not None and not self._outage.down
        return [KnownJob(unique, headers.get(unique),
                      seen or (job.unique in returned and returned[job.unique].delivered),
                      tracked)
                for job, unique, seen in zip(jobs, uniques, before, strict=True)]

    def settled(self, unique: str, worker: JobAnswers) -> None:
        """Completed just now on ``worker``: its hand-out count goes too, with
        the call to Redis of the first grab after gearmand read that
        WORK_COMPLETE (or at the close): no round trip of its own."""
        if self._handouts is not None:
            self._settled.append(_Settled(unique, worker, worker.answers_given))

    @property
    def unwritten(self) -> bool:
        return bool(self._settled)

    def write_settled(self) -> None:
        """At the dispatcher's close: forget the counts of the acks gearmand
        surely read. The others stay, to expire with the queue's hash: their
        WORK_COMPLETE may yet be lost, and the job handed out again."""
        uniques = [s.unique for s in self._settled if s.landed]
        self._settled = []
        if not uniques or self._handouts is None:
            return
        try:
            self._handouts.settled(self.function, uniques)
        except REDIS_ERRORS as exc:  # a count left behind expires with the queue's hash
            log.debug("%s: hand-outs of %d acked messages not forgotten: %s",
                      self.function, len(uniques), exc)

    def _returned(self, jobs: list[gearman.GrabbedJob]) -> dict[str, Returned]:
        tokens = {t: job.unique for job in jobs if (t := returned_token(job.unique))}
        if not tokens or self._handouts is None:
            return {}
        try:
            found = self._handouts.originals(list(tokens))
        except REDIS_ERRORS as exc:
            raise gearman.GearmanError(f"given-back messages unknown (redis: {exc})") from None
        return {tokens[t]: r for t, r in found.items()}

    def _take(self, uniques: list[str]) -> list[bool]:
        """Count the hand-outs; True for a message some bridge handed out before.
        Without Redis, every one may have been: say so (``redelivered``)."""
        if self._handouts is None:
            return [False] * len(uniques)
        landed = [s for s in self._settled if s.landed]
        # A count whose WORK_COMPLETE may be lost stays (it expires with the
        # queue's hash): gearmand may hand that job out again.
        self._settled = [s for s in self._settled if not s.landed and not s.lost]
        try:
            before = self._handouts.take(self.function, uniques, [s.unique for s in landed])
            self._outage.succeeded()
            return before
        except REDIS_ERRORS as exc:
            self._outage.failed(exc)
            self._settled = landed + self._settled  # next time
            return [True] * len(uniques)

    def _headers(self, uniques: list[str]) -> dict[str, dict[str, str]]:
        if self._headers_of is None:
            return {}
        try:
            return self._headers_of(uniques)
        except REDIS_ERRORS as exc:
            raise gearman.GearmanError(f"message headers unavailable (redis: {exc})") from None
