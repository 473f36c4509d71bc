"""What a stream subscription was given, as the ledger keeps it (pure).

A queue subscriber's copies are in the ledger one by one (enqueued,
delivered, acked). A stream subscriber has no copies: it is given its
topic's history offsets in order, so the ledger keeps runs of them, one
``streamed`` row per run (gearhorn/rules/events.py has the row's format). The
reconciliation then finds any offset a subscriber skipped, or was given
twice, between its first and its last (gearhorn/pipeline/transforms.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gearhorn.rules.events import stream_span

MOST_PER_RUN = 1000  # offsets per row: a run is recorded at least this often
MOST_SECONDS = 1.0  # ... or once this old, when the next offset comes


class StreamRuns:
    """The runs of offsets one subscription was given; ``record`` hears of
    each run once it ends (the next offset does not follow it, the epoch
    changed, it is long or old enough, or the subscription ended)."""

    def __init__(self, record: Callable[[str], None]) -> None:
        self.record = record
        self._run: tuple[str, int, int, bool] | None = None  # epoch, first, last, told
        self._started = 0.0

    def given(self, epoch: str, offset: int, told_gap: bool = False) -> None:
        """``offset`` of ``epoch`` was handed to the client; ``told_gap``: its
        MESSAGE said ``x-recovered:false`` (offsets before it are not owed)."""
        run = self._run
        if (run is not None and run[0] == epoch and offset == run[2] + 1 and not told_gap
                and offset - run[1] < MOST_PER_RUN
                and time.monotonic() - self._started < MOST_SECONDS):
            self._run = (epoch, run[1], offset, run[3])
            return
        self.end()
        self._run, self._started = (epoch, offset, offset, told_gap), time.monotonic()

    def end(self) -> None:
        """Record the run in progress, if any."""
        if self._run is not None:
            self.record(stream_span(*self._run))
            self._run = None
