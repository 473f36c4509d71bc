"""The bridge's ledger events, buffered and written in the background
(runs under gevent)."""

from __future__ import annotations

import gevent

from gearhorn.stomp.queues.bounds import QueueBounds
from gearhorn.store.ledger import Ledger
from gearhorn.store.stats import Stats

# Written every this many seconds, or sooner at this many events.
FLUSH_SECONDS = 0.2
FLUSH_EVENTS = 1000


class LedgerFlusher:
    """Writes the ledger's events (and the tallies of bounded ``/queue/``
    destinations) every ``FLUSH_SECONDS``, and soon after ``FLUSH_EVENTS``
    are buffered (:meth:`recorded` hears of each)."""

    def __init__(self, ledger: Ledger, bounds: QueueBounds, stats: Stats | None = None) -> None:
        self.ledger = ledger
        self.bounds = bounds
        self.stats = stats  # the metrics the bridge counts itself, buffered
        self._flush_soon = False
        self._stopped = False
        self._flusher: gevent.Greenlet | None = None

    def recorded(self) -> None:
        if self.ledger.buffered >= FLUSH_EVENTS and not self._flush_soon:
            # Never write here: callers are in the middle of a dispatch, and a
            # Redis round trip would let another greenlet deliver (and reorder)
            # messages before this one is sent.
            self._flush_soon = True
            gevent.spawn(self.flush)

    def flush(self, everything: bool = False) -> None:
        self._flush_soon = False
        self.ledger.flush(everything)
        self.bounds.flush()
        if self.stats is not None:
            self.stats.flush()

    def start(self) -> None:
        self._flusher = gevent.spawn(self._flush_forever)

    def stop(self) -> None:
        """Let a flush under way finish, then write what is left."""
        self._stopped = True
        if self._flusher is not None:
            self._flusher.join(timeout=5)
        self.flush(everything=True)  # the audit's counts too

    def _flush_forever(self) -> None:
        while not self._stopped:
            gevent.sleep(FLUSH_SECONDS)
            self.flush()
