"""``gearhorn audit`` without ``--master``: the live audit, count first.

The writers count what they make and settle per queue and enqueue bucket
(gearhorn/rules/auditcounts.py) into small counts streams beside the
ledger's. Every ``audit_interval`` this process reads what is new there,
adds it up (gearhorn/pipeline/balance.py) and, for the few buckets whose
counts do not balance once due, reads those queues' ledger rows and names
the copies (gearhorn/pipeline/closer.py). Its cost grows with queues and
buckets, not with copies per second; it needs no Spark and no Java, so
``gearhorn up`` runs it by default. Why: docs/design/audit.rst.

A closer look reads a minute of the ledger (every queue's rows: they are
not kept by queue), seconds of work at the pool's full rate: it runs in a
thread of its own while the rounds go on counting, and what it finds is
told in the first round after it ends. The looks not yet done are saved
with the state, and run again after a restart.

Restart-safe as the Spark audit is: a round's findings are written under
its number, then the state (the streams' positions, the books, what was
reported) is saved with that number, and only then told. A round run again
after a kill -9 rewrites the same file and is told once.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import astuple

import redis

from gearhorn.pipeline import closer, verdicts
from gearhorn.pipeline.audit import AuditSettings, Publisher
from gearhorn.pipeline.balance import Books, Look
from gearhorn.pipeline.verdicts import AuditState, Finding
from gearhorn.rules.auditcounts import STREAMED, bucket_of
from gearhorn.store.auditfeed import CountsFeed, ledger_rows
from gearhorn.store.keys import Keys
from gearhorn.store.ledger import now_ms
from gearhorn.store.redisconn import REDIS_ERRORS

log = logging.getLogger(__name__)


class CountAudit:
    """One audit: its state, its feed, and a :meth:`round` at a time."""

    def __init__(self, client: redis.Redis, keys: Keys, settings: AuditSettings,
                 tell: Callable[[AuditState, list[Finding]], None],
                 clock: Callable[[], int] = now_ms) -> None:
        self.redis, self.keys, self.settings, self.tell = client, keys, settings, tell
        self.clock = clock
        os.makedirs(settings.folder, exist_ok=True)
        self.state = verdicts.load(settings.state, settings.deadline_ms, clock())
        self.books = Books.from_json(self.state.books, settings.deadline_ms,
                                     settings.lateness_ms)
        self.feed = CountsFeed(client, keys, settings.shards, self.state.positions)
        self._look: Looking | None = None  # the closer look in its thread

    @property
    def looking(self) -> bool:
        """Whether closer looks are still to be done (or running)."""
        return bool(self.state.looking)

    def begin(self) -> None:
        """A first start reads from the streams' ends (``from_start``: from
        their beginnings, the counts kept). Buckets before the one it starts
        in are not judged; in that one, copies made before the start and
        settled after it only ever count as too many (never a finding)."""
        if self.state.positions:
            return
        if self.settings.from_start:
            self.books.floor = 0  # every bucket whose counts are kept
            return
        self.feed.start_at_heads()
        log.info("audit: first start, judging what happens from now on")
        self.books.floor = bucket_of(self.clock())

    def round(self) -> bool:
        """Take what a closer look that ended found; read, add up, judge,
        start a closer look where needed; save, tell. Whether the streams
        were read to their ends."""
        started = self.clock()
        found = self._looked()
        read, upto = self.feed.read()
        runs: dict[str, list[str]] = {}
        for at_ms, counts in read:
            self.books.add(counts, at_ms)
            for count in counts:
                if count.kind == STREAMED:
                    runs.setdefault(count.queue, []).append(count.span)
        # Judged up to when every stream was read: now, or, while behind,
        # the oldest of the last entries read from the streams with more.
        clock = started if upto is None else upto
        state = self.state
        state.clock_ms = max(state.clock_ms, clock)
        for subscriber, spans in runs.items():
            found += state.streamed(subscriber, spans)
        away = self.books.away
        looks = self.books.judge(state.clock_ms)
        if self.books.away > away:
            log.info("audit: %d copies away (their subscribers settled nothing since)",
                     self.books.away - away)
        state.looking += [[*astuple(look), state.clock_ms] for look in looks]
        if state.looking and self._look is None:
            self._look = Looking(self, [(Look(*saved[:5]), saved[5]) for saved in state.looking])
        self._save(found)
        return upto is None

    def _looked(self) -> list[Finding]:
        """What the closer look that ended found (each copy reported once);
        a Redis error it met is raised here (the looks stay to be done)."""
        look = self._look
        if look is None or look.is_alive():
            return []
        self._look = None
        if look.error is not None:
            raise look.error
        found = []
        for (done, clock_ms), (seen, away) in zip(look.looks, look.results, strict=True):
            self.books.reopen(done, away, clock_ms)
            for finding in seen:
                key = f"{finding.kind == verdicts.DUPLICATE}\t{done.queue}\t{finding.unique}"
                if self.state.duplicate(key, finding) is not None:  # reported once
                    found.append(finding)
        del self.state.looking[:len(look.looks)]
        log.info("audit: %d closer looks in %.2f s (%s), %d findings", len(look.looks),
                 look.took_s, ", ".join(f"{done.queue} {done.kind} {done.short}"
                                        for done, _ in look.looks)[:300], len(found))
        return found

    def wait_for_looks(self, timeout: float) -> None:
        """Until the closer look running has ended (tests; a round takes
        what it found)."""
        if self._look is not None:
            self._look.join(timeout)

    def _save(self, found: list[Finding]) -> None:
        state, books, now = self.state, self.books, self.clock()
        state.count(found, now)
        state.forget_settled()
        state.settled, state.away = books.settled, books.away
        state.state_rows = books.open_rows()
        state.lags_ms.append(max(0, now - state.clock_ms))
        state.batch += 1
        write_findings(self.settings.findings, state.batch, found, now)
        state.positions, state.books = dict(self.feed.positions), books.to_json()
        verdicts.save(self.settings.state, state)
        self.tell(state, found)


class Looking(threading.Thread):
    """Closer looks, each with the clock it was judged at, in a thread:
    the ledger's rows read once for them all, then each one's findings and
    copies away (``results``, in order), or the Redis ``error`` met."""

    def __init__(self, audit: CountAudit, looks: list[tuple[Look, int]]) -> None:
        super().__init__(name="gearhorn-audit-look", daemon=True)
        self.redis, self.keys, self.settings = audit.redis, audit.keys, audit.settings
        self.looks = looks
        self.results: list[tuple[list[Finding], int]] = []
        self.error: Exception | None = None
        self.took_s = 0.0
        self.start()

    def run(self) -> None:
        started, settings = time.monotonic(), self.settings
        queues = {look.queue for look, _ in self.looks}
        try:
            rows = closer.group(ledger_rows(
                self.redis, self.keys, settings.shards,
                closer.span_start([look for look, _ in self.looks], settings.lateness_ms),
                queues), queues)
            self.results = [closer.findings(look, rows[look.queue], clock_ms,
                                            settings.deadline_ms, settings.lateness_ms)
                            for look, clock_ms in self.looks]
        except Exception as exc:  # noqa: BLE001 (raised again by the round that takes it)
            self.error = exc
        self.took_s = time.monotonic() - started


def write_findings(folder: str, number: int, findings: list[Finding], found_ms: int) -> None:
    """``round-<n>.jsonl`` (replaced if the round runs again, removed if it
    then finds nothing: a closer look may end in another round)."""
    path = os.path.join(folder, f"round-{number:09d}.jsonl")
    if not findings:
        if os.path.exists(path):
            os.remove(path)
        return
    os.makedirs(folder, exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as fp:
        for f in findings:
            fp.write(json.dumps({**f.__dict__, "found_ts": found_ms, "batch": number}) + "\n")
        fp.flush()
        os.fsync(fp.fileno())
    os.replace(path + ".tmp", path)


def run(client: redis.Redis, keys: Keys, settings: AuditSettings, say=print) -> int:
    """Until SIGTERM or Ctrl-C."""
    os.makedirs(settings.folder, exist_ok=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    audit = CountAudit(client, keys, settings, Publisher(client, keys, settings, say))
    while not stop.is_set():
        try:
            audit.begin()
            break
        except REDIS_ERRORS as exc:
            log.warning("audit: redis unavailable at start (%s); trying again", exc)
            stop.wait(settings.interval_s)
    say(f"audit: counting the ledger every {settings.interval_s:g} s; a copy not "
        f"delivered within {settings.deadline_ms / 1000:g} s is a finding; state in "
        f"{settings.folder}")
    while not stop.is_set():
        try:
            drained = audit.round()
        except REDIS_ERRORS as exc:
            # What the round read and judged is dropped: from the state saved.
            log.warning("audit: redis unavailable (%s); trying again", exc)
            audit = CountAudit(client, keys, settings, audit.tell)
            drained = True
        if drained:
            stop.wait(settings.interval_s)
    return 0
