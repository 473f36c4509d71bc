"""The live audit's closer look: the ledger's rows of a span, for the few
queues whose counts did not balance (gearhorn/pipeline/balance.py), turned
into findings that name the message and the copy. Pure: rows in (flat
ledger rows, gearhorn/store/ledgerentries.py), findings out.

The definitions are the report's: what settles a copy (delivered, answered,
dropped), a copy passed over (``never_delivered``: its subscriber settled a
copy enqueued after it) against one late (``overdue``: it settled only
older ones), and a ``duplicate`` (two first deliveries of a copy, or two
complete answers of a held copy in two runs: two generations, or two of
gearmand's job handles).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from gearhorn.pipeline.balance import LOOK_DUPLICATES, LOOK_MISSING, Look
from gearhorn.pipeline.verdicts import DUPLICATE, LOST, OVERDUE, Finding
from gearhorn.rules.auditcounts import BUCKET_MS
from gearhorn.rules.events import SETTLING
from gearhorn.rules.events import Event as E

SETTLES = frozenset(SETTLING)  # the report's definition (rules/events.py)


@dataclass
class QueueRows:
    """One queue's rows in the span read."""

    enqueued: dict[str, dict] = field(default_factory=dict)  # unique -> its row
    settled: dict[str, int] = field(default_factory=dict)  # unique -> first settlement ts
    # unique -> the runs that completed it: (generation, gearmand's job handle)
    answers: dict[str, set[tuple[int, str]]] = field(default_factory=dict)
    firsts: dict[str, int] = field(default_factory=dict)  # unique -> first deliveries

    def add(self, row: dict) -> None:
        event, unique = row["event"], row["unique"]
        if not unique:
            return
        if event == E.ENQUEUED:
            self.enqueued.setdefault(unique, row)
            return
        if event not in SETTLES:
            return
        ts = row["ts"] or 0
        self.settled[unique] = min(ts, self.settled.get(unique, ts))
        if event == E.ANSWERED and row["reason"] == "complete" and row["count"] is not None:
            self.answers.setdefault(unique, set()).add((row["count"], row.get("handle") or ""))
        elif event == E.DELIVERED and not row["redelivered"]:
            self.firsts[unique] = self.firsts.get(unique, 0) + 1


def group(rows: Iterable[dict], queues: set[str]) -> dict[str, QueueRows]:
    """The rows of ``queues``, by queue."""
    grouped: dict[str, QueueRows] = {q: QueueRows() for q in queues}
    for row in rows:
        found = grouped.get(row["subscriber"])
        if found is not None:
            found.add(row)
    return grouped


def findings(look: Look, rows: QueueRows, clock_ms: int, deadline_ms: int,
             lateness_ms: int) -> tuple[list[Finding], int]:
    """What ``look`` finds in its queue's rows, judged at ``clock_ms``, and
    how many of its copies are away by the rows (unsettled, and nothing
    settled after them: judged again once their subscriber settles more)."""
    if look.kind == LOOK_DUPLICATES:
        return _duplicates(look.queue, rows), 0
    if look.kind == LOOK_MISSING:
        return _missing(look, rows, clock_ms, deadline_ms, lateness_ms)
    raise ValueError(f"no such look: {look.kind}")


def _missing(look: Look, rows: QueueRows, clock_ms: int, deadline_ms: int,
             lateness_ms: int) -> tuple[list[Finding], int]:
    # The writers' bucket and the ledger's row differ by a few ms (the keep
    # and the fanout's entry): a bucket's edges are read a little wider.
    first, last = look.first_ms - lateness_ms, look.last_ms + lateness_ms
    due = clock_ms - deadline_ms - lateness_ms
    settled_enqueues = [rows.enqueued[u]["ts"] for u in rows.settled if u in rows.enqueued]
    newest_enqueued = max(settled_enqueues, default=0)
    newest_settled = max(rows.settled.values(), default=0)
    out, away = [], 0
    for unique, row in rows.enqueued.items():
        ts = row["ts"]
        if unique in rows.settled or not first <= ts < last or ts > due:
            continue
        if newest_enqueued > ts:
            kind, detail = LOST, (f"not delivered within {deadline_ms / 1000:g} s while "
                                  f"copies enqueued after it were")
        elif newest_settled > ts:
            kind, detail = OVERDUE, (f"not delivered within {deadline_ms / 1000:g} s; "
                                     f"its subscriber took only older copies meanwhile")
        else:
            away += 1
            continue
        out.append(Finding(kind, row["topic"] or _topic(look.queue), look.queue,
                           row["message_id"], unique, ts, detail))
    return sorted(out, key=lambda f: (f.enqueued_ts or 0, f.unique or "")), away


def _duplicates(queue: str, rows: QueueRows) -> list[Finding]:
    out = []
    for unique in sorted(set(rows.answers) | set(rows.firsts)):
        runs = rows.answers.get(unique, ())
        if len(runs) < 2 and rows.firsts.get(unique, 0) < 2:
            continue
        made = rows.enqueued.get(unique, {})
        out.append(Finding(DUPLICATE, made.get("topic") or _topic(queue), queue,
                           made.get("message_id"), unique, made.get("ts"),
                           "delivered more than once as new (or, held, completed in two "
                           "runs: hand-outs, or jobs at gearmand)"))
    return out


def _topic(queue: str) -> str | None:
    return queue.rpartition("_")[0] or None


def span_start(looks: Iterable[Look], lateness_ms: int) -> int:
    """Where the ledger must be read from for ``looks`` (ms)."""
    return min(look.first_ms for look in looks) - lateness_ms - BUCKET_MS
