"""What Redis knows of the jobs one queue dispatcher grabs (runs under
gevent): each job's headers, the original of a job that a bridge gave back,
and whether some bridge handed it out before (``redelivered``); and the
hand-out counts of acknowledged jobs, forgotten with the next grab's call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from gearhorn import gearman
from gearhorn.background import Outage
from gearhorn.naming import returned_token
from gearhorn.store.handouts import Handouts, Returned
from gearhorn.store.redisconn import REDIS_ERRORS

log = logging.getLogger(__name__)

# An acked message's hand-out count is forgotten this long after the ack at
# the earliest: by then gearmand has read the WORK_COMPLETE sent with it.
SETTLE_SECONDS = 1.0

HeadersOf = Callable[[list[str]], dict[str, dict[str, str]]]


@dataclass(frozen=True, slots=True)
class Known:
    """A grabbed job as the subscribers must see it."""

    unique: str  # the message's own key (a given-back job's original)
    headers: dict[str, str] | None
    redelivered: bool
    tracked: bool  # its hand-out is counted: forget it once it is acked


class Recall:
    """Looks grabbed jobs up in Redis, in one round trip per kind per batch.
    ``handouts`` is a shared queue's (``/queue/``, durable subscriptions):
    a private queue counts nothing."""

    def __init__(self, function: str, headers_of: HeadersOf | None = None,
                 handouts: Handouts | None = None) -> None:
        self.function = function
        self._headers_of = headers_of
        self._handouts = handouts
        # Acknowledged (unique, when), to forget in Redis once gearmand has
        # surely read the WORK_COMPLETE: a kill -9 can drop one still in the
        # socket's buffer, gearmand hands the job out again, and a count
        # forgotten already would call it redelivered:false.
        self._settled: list[tuple[str, float]] = []
        self._outage = Outage(log, f"redis (hand-outs of {function})")

    def known(self, jobs: list[gearman.GrabbedJob]) -> list[Known]:
        """What the subscribers of ``jobs`` must see. Raises GearmanError when
        Redis cannot say: never deliver a message without its headers (a
        reply-to would be lost) or as someone it is not; the dispatcher drops
        the connection, gearmand takes the jobs back, and it retries."""
        returned = self._returned(jobs)
        uniques = [r.unique if (r := returned.get(job.unique)) else job.unique for job in jobs]
        headers = self._headers(uniques)
        before = self._take(uniques)
        tracked = self._handouts is not None and not self._outage.down
        return [Known(unique, headers.get(unique),
                      seen or (job.unique in returned and returned[job.unique].delivered),
                      tracked)
                for job, unique, seen in zip(jobs, uniques, before, strict=True)]

    def settled(self, unique: str) -> None:
        """Gone for good: its hand-out count goes too, with the next grab's
        call to Redis (or at the close): no round trip of its own."""
        if self._handouts is not None:
            self._settled.append((unique, time.monotonic()))

    @property
    def unwritten(self) -> bool:
        return bool(self._settled)

    def write_settled(self) -> None:
        uniques, self._settled = [u for u, _ in self._settled], []
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
        ripe = time.monotonic() - SETTLE_SECONDS
        settled = [u for u, at in self._settled if at <= ripe]
        self._settled = [(u, at) for u, at in self._settled if at > ripe]
        try:
            before = self._handouts.take(self.function, uniques, settled)
            self._outage.succeeded()
            return before
        except REDIS_ERRORS as exc:
            self._outage.failed(exc)
            self._settled = [(u, 0.0) for u in settled] + self._settled  # next time
            return [True] * len(uniques)

    def _headers(self, uniques: list[str]) -> dict[str, dict[str, str]]:
        if self._headers_of is None:
            return {}
        try:
            return self._headers_of(uniques)
        except REDIS_ERRORS as exc:
            raise gearman.GearmanError(f"message headers unavailable (redis: {exc})") from None
