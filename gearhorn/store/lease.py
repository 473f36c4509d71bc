"""A holder's lease on its copies, kept by a thread of its own: renewed by
Redis's clock, checked before each hand by the holder's own monotonic clock,
and the news that it was fenced (docs/design/held-copies.rst)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from gearhorn.runtime.background import Outage
from gearhorn.store.heldcopies import Fenced
from gearhorn.store.holders import Holders
from gearhorn.store.redisconn import REDIS_ERRORS

log = logging.getLogger(__name__)


class HolderLease:
    """One process's holder name and lease. ``on_fenced(name)`` is told,
    from whichever thread learned it, that ``name`` was fenced; the holder
    then calls :meth:`register` for a new name."""

    def __init__(self, holders: Holders, process: str, ttl: float, interval: float,
                 on_fenced: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.holders, self.process = holders, process
        self.ttl, self.interval = ttl, interval
        self.on_fenced = on_fenced
        self._clock = clock
        self.name = ""
        self._renewed = float("-inf")  # when the last renewal that counted was sent
        self._quiet_until = 0.0  # judge nobody before (our clock): after an outage
        self._troubled = False  # a call failed: quiet once one works again
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def register(self) -> str:
        """A new name, with its lease: this holder holds nothing yet."""
        sent = self._clock()
        self.name = self.holders.register(self.process, self.ttl)
        self._renewed = sent
        return self.name

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gearhorn-lease", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None and self._thread.is_alive():
            self._thread.join(10)

    def renew(self) -> None:
        """Renew now; a renewal that comes over two intervals after the one
        before (Redis was away, or this process paused) starts a quiet time."""
        name, sent = self.name, self._clock()
        if not name:
            return  # registering again: its holder does it
        try:
            since = self.holders.renew(name, self.ttl)
        except Fenced:
            self.on_fenced(name)
            return
        except REDIS_ERRORS:
            self._troubled = True
            raise
        if self._troubled or since > 2 * self.interval:
            self.quiet()
        self._troubled = False
        if name == self.name:
            self._renewed = sent

    def fresh(self) -> bool:
        """Is the lease surely still ours, by our own clock? (It ends a ttl
        after Redis took the renewal, which came after we sent it.)"""
        return self._clock() - self._renewed < self.ttl - self.interval / 2

    def may_judge(self) -> bool:
        """May this holder take others for dead now: its lease fresh, and
        no outage or pause of its own in the last ttl."""
        return self.fresh() and not self._troubled and self._clock() >= self._quiet_until

    def quiet(self) -> None:
        """Judge nobody for a ttl: every holder gets a chance to renew
        first (after a Redis outage every lease may have ended)."""
        self._quiet_until = self._clock() + self.ttl

    def troubled(self) -> None:
        """A Redis call of this holder's failed: quiet once they work again."""
        self._troubled = True

    def _run(self) -> None:
        outage = Outage(log, "redis (holder lease)")
        while not self._stopping.wait(self.interval):
            try:
                self.renew()
                outage.succeeded()
            except REDIS_ERRORS as exc:
                outage.failed(exc)
