"""The live audit's judgement: what a micro-batch of copy outcomes means.

Pure Python, no Spark: the streaming query (gearhorn/pipeline/live.py) says
per copy whether something settled it within the deadline; this module
keeps the little the driver must remember between micro-batches and turns
outcomes into findings. It is saved after every micro-batch with the
batch's id (:class:`AuditState`), so a micro-batch Spark runs again after a
restart is recognised and judged once.

A copy nothing settled within ``deadline_ms`` of its enqueue is judged by
what its subscriber did meanwhile:

- ``never_delivered`` (a loss, the report's word for it): the subscriber
  was given a copy enqueued *after* this one, so this one was passed over;
- ``overdue``: the subscriber took only older copies (it is behind);
- nothing at all when the subscriber settled nothing since the enqueue: it
  is away (a durable subscriber offline, a Gearman worker stopped), and its
  copies wait for it, bounded by its limits, whose drops settle them.
"""

from __future__ import annotations

import json
import os
import re
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from gearhorn.rules.events import STREAM_SPAN

LOST = "never_delivered"
OVERDUE = "overdue"
DUPLICATE = "duplicate"
STREAM_KINDS = ("stream_gap", "stream_duplicate")
KINDS = (LOST, OVERDUE, DUPLICATE, *STREAM_KINDS)

# The findings table's columns (DIR/findings/*.parquet; gearhorn report --findings).
FINDING_FIELDS = (("kind", "string"), ("topic", "string"), ("subscriber", "string"),
                  ("message_id", "string"), ("unique", "string"), ("enqueued_ts", "int64"),
                  ("found_ts", "int64"), ("detail", "string"), ("batch", "int64"))
RECENT = 50  # findings kept for the console
STREAM_IDLE_MS = 24 * 3600 * 1000  # a stream subscription's furthest offset is kept this long
LAGS = 600  # micro-batch lags kept for p50/p99
REPORTED_KEPT_MS = 3600 * 1000  # a finding's copy is reported once within this


@dataclass(frozen=True)
class Finding:
    kind: str
    topic: str | None
    subscriber: str | None
    message_id: str | None
    unique: str | None
    enqueued_ts: int | None
    detail: str

    def line(self) -> str:
        """One line for a log or a terminal."""
        return (f"{self.kind}: message {self.message_id or '-'} for {self.subscriber} "
                f"(topic {self.topic}, copy {self.unique}): {self.detail}")


@dataclass(frozen=True)
class Unsettled:
    """A copy nothing settled within the deadline."""

    subscriber: str
    topic: str | None
    message_id: str | None
    unique: str | None
    enqueued_ts: int


@dataclass(frozen=True)
class Presence:
    """A subscriber's settlements in one micro-batch: the newest enqueue
    time among the copies settled, and the newest settlement time."""

    subscriber: str
    newest_enqueued_ts: int
    newest_settled_ts: int
    copies: int


@dataclass
class AuditState:
    """What the driver remembers between micro-batches."""

    deadline_ms: int
    batch: int = -1
    clock_ms: int = 0  # the newest event time seen (the export's ticks move it)
    # subscriber -> [newest enqueue ts among its settled copies, newest settlement ts]
    subscribers: dict[str, list[int]] = field(default_factory=dict)
    # copy key -> enqueue ts of copies reported duplicate (reported once)
    duplicates: dict[str, int] = field(default_factory=dict)
    # "subscriber<TAB>epoch" -> [furthest offset given, clock when last given]
    streams: dict[str, list[int]] = field(default_factory=dict)
    totals: dict[str, dict[str, int]] = field(default_factory=dict)  # topic -> kind -> n
    settled: int = 0
    away: int = 0  # copies judged while their subscriber was away: not counted
    state_rows: int = 0  # rows in Spark's state after the last micro-batch (bounded)
    started_ms: int = 0
    last_finding_ms: int = 0
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT))
    lags_ms: deque = field(default_factory=lambda: deque(maxlen=LAGS))
    # The count-first audit's (gearhorn/pipeline/countaudit.py): the counts
    # streams' positions, and its books (balance.Books.to_json)
    positions: dict[str, str] = field(default_factory=dict)
    books: dict = field(default_factory=dict)
    # its closer looks not yet done: [kind, queue, first ms, last ms, short,
    # the clock they were judged at] each (run again after a restart)
    looking: list = field(default_factory=list)

    # -- judging ---------------------------------------------------------------

    def settle(self, presence: Iterable[Presence]) -> None:
        """Remember who took what (before judging the batch's unsettled)."""
        for seen in presence:
            known = self.subscribers.setdefault(seen.subscriber, [0, 0])
            known[0] = max(known[0], seen.newest_enqueued_ts)
            known[1] = max(known[1], seen.newest_settled_ts)
            self.settled += seen.copies

    def judge(self, copy: Unsettled) -> Finding | None:
        """The finding for a copy nothing settled in time, or None (away)."""
        newest_enqueued, newest_settled = self.subscribers.get(copy.subscriber, (0, 0))
        if newest_enqueued > copy.enqueued_ts:
            kind, detail = LOST, (f"not delivered within {self.deadline_ms / 1000:g} s while "
                                  f"copies enqueued after it were")
        elif newest_settled > copy.enqueued_ts:
            kind, detail = OVERDUE, (f"not delivered within {self.deadline_ms / 1000:g} s; "
                                     f"its subscriber took only older copies meanwhile")
        else:
            self.away += 1
            return None
        return Finding(kind, copy.topic, copy.subscriber, copy.message_id, copy.unique,
                       copy.enqueued_ts, detail)

    def duplicate(self, key: str, finding: Finding) -> Finding | None:
        """A copy delivered twice as new: reported once however many times."""
        if key in self.duplicates:
            return None
        self.duplicates[key] = finding.enqueued_ts or self.clock_ms
        return finding

    def streamed(self, subscriber: str, runs: Iterable[str]) -> list[Finding]:
        """A stream subscription's runs of offsets (``stream_span`` texts) in
        one micro-batch, checked as transforms.stream_problems checks them:
        in order of their offsets (a micro-batch's rows come in no promised
        order), each against the furthest offset given before it."""
        findings = []
        parsed = sorted((m.group(1), int(m.group(2)), int(m.group(3)), bool(m.group(4)), run)
                        for run in runs if (m := re.match(STREAM_SPAN, run or "")))
        for epoch, first, last, told, run in parsed:
            key = f"{subscriber}\t{epoch}"
            furthest = self.streams.get(key, [None])[0]
            if furthest is not None and first > furthest + 1 and not told:
                findings.append(self._stream_finding("stream_gap", subscriber, run,
                                                     f"offsets {furthest + 1}-{first - 1} "
                                                     f"never given"))
            elif furthest is not None and first <= furthest:
                findings.append(self._stream_finding("stream_duplicate", subscriber, run,
                                                     f"offsets {first}-{min(furthest, last)} "
                                                     f"given again"))
            self.streams[key] = [last if furthest is None else max(furthest, last),
                                 self.clock_ms]
        return findings

    @staticmethod
    def _stream_finding(kind: str, subscriber: str, run: str, detail: str) -> Finding:
        topic = subscriber.rpartition("_")[0] or None
        return Finding(kind, topic, subscriber, None, run, None, detail)

    def count(self, findings: Iterable[Finding], now_ms: int) -> None:
        for finding in findings:
            per_topic = self.totals.setdefault(finding.topic or "", {})
            per_topic[finding.kind] = per_topic.get(finding.kind, 0) + 1
            self.recent.append({**finding.__dict__, "found_ms": now_ms})
            self.last_finding_ms = now_ms

    def forget_settled(self) -> None:
        """Drop what no later outcome can need (bounded state): presence
        older than twice the deadline before the clock, and duplicate marks
        past the window in which the query can pair deliveries."""
        horizon = self.clock_ms - 2 * self.deadline_ms
        self.subscribers = {s: v for s, v in self.subscribers.items() if v[1] >= horizon}
        # An hour at least: the count-first audit may look at a copy again
        # (a neighbouring bucket's look, an away span) long after its enqueue.
        reported = self.clock_ms - max(2 * self.deadline_ms, REPORTED_KEPT_MS)
        self.duplicates = {k: ts for k, ts in self.duplicates.items() if ts >= reported}
        idle = self.clock_ms - STREAM_IDLE_MS
        self.streams = {k: v for k, v in self.streams.items() if v[1] >= idle}

    # -- reading ---------------------------------------------------------------

    def kind_totals(self) -> dict[str, int]:
        totals = dict.fromkeys(KINDS, 0)
        for kinds in self.totals.values():
            for kind, n in kinds.items():
                totals[kind] = totals.get(kind, 0) + n
        return totals

    def lag_quantiles(self) -> dict[str, float | None]:
        ordered = sorted(self.lags_ms)
        if not ordered:
            return {"p50_s": None, "p99_s": None}
        pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000  # noqa: E731
        return {"p50_s": pick(0.5), "p99_s": pick(0.99)}

    def summary_line(self, now_ms: int, window_ms: int) -> str:
        """The console's line: nothing lost in the last N minutes, or what was."""
        lag = self.lag_quantiles()["p50_s"]
        behind = f", {lag:.1f} s behind the ledger" if lag is not None else ""
        if self.last_finding_ms and now_ms - self.last_finding_ms <= window_ms:
            totals = {k: n for k, n in self.kind_totals().items() if n}
            return f"audit: FINDINGS {totals} (latest: {self.recent[-1]['kind']}){behind}"
        quiet_ms = now_ms - max(self.last_finding_ms, self.started_ms)
        span = (f"the last {window_ms / 60_000:g} min" if quiet_ms >= window_ms
                else f"the {quiet_ms / 1000:.0f} s since it started")
        return f"audit: nothing lost in {span} ({self.settled:,} copies settled{behind})"

    # -- saving ------------------------------------------------------------------

    def to_json(self) -> str:
        saved = {**self.__dict__, "recent": list(self.recent), "lags_ms": list(self.lags_ms)}
        return json.dumps(saved, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str, deadline_ms: int) -> AuditState:
        saved = json.loads(text)
        saved["deadline_ms"] = deadline_ms  # the setting now, not the one before
        saved["recent"] = deque(saved.get("recent", []), maxlen=RECENT)
        saved["lags_ms"] = deque(saved.get("lags_ms", []), maxlen=LAGS)
        return cls(**saved)


def load(path: str, deadline_ms: int, now_ms: int) -> AuditState:
    """The state saved at ``path``, or a new one."""
    if not os.path.exists(path):
        return AuditState(deadline_ms, started_ms=now_ms)
    with open(path, encoding="utf-8") as fp:
        return AuditState.from_json(fp.read(), deadline_ms)


def save(path: str, state: AuditState) -> None:
    """Atomically, and synced: the batch id in it says what was judged."""
    with open(path + ".tmp", "w", encoding="utf-8") as fp:
        fp.write(state.to_json())
        fp.flush()
        os.fsync(fp.fileno())
    os.replace(path + ".tmp", path)
