"""A foreground fanout's copies: tried again when their receiver failed (as
often as the fanout allows), and what the producer is told of each
receiver: who failed and why, and, with ``"gather": true``, every answer.

Why it is shaped so: docs/design/notes.rst, "gearhorn/worker/foreground.py".
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gearhorn import gearman
from gearhorn.config import Config
from gearhorn.rules.messages import Fanout
from gearhorn.runtime.background import Backoff
from gearhorn.store.registry import Recipient

# A receiver's end that another try may change; a timeout is still queued.
RETRIED = frozenset({"failed", "exception", "lost"})


@dataclass(frozen=True, slots=True)
class ForegroundSettings:
    """What a foreground fanout reads of the configuration."""

    attempts: int = 1  # tries of a copy, unless the fanout says
    timeout: float = 30.0  # for all the receivers' answers
    retry_backoff: float = 0.5
    gather_max_bytes: int = 1 << 20

    @classmethod
    def of(cls, config: Config) -> ForegroundSettings:
        return cls(config.fanout_attempts, config.fanout_timeout, config.retry_backoff,
                   config.gather_max_bytes)


def answers(client: gearman.Client, copies: Sequence[gearman.Copy],
            recipients: Sequence[Recipient], request: Fanout, placed: gearman.Placed,
            settings: ForegroundSettings,
            sleep: Callable[[float], None] = time.sleep) -> dict[str, object]:
    """What a foreground fanout's receivers answered: ``completed``,
    ``failed`` and, gathered, ``answers``; ``_failed`` (each failure with
    its copy's unique key) for the ledger."""
    attempts = request.answering.attempts or settings.attempts
    outcomes, tries = run_copies(client, copies, request.priority, placed, attempts,
                                 settings.timeout, settings.retry_backoff, sleep)
    by_queue = {r.queue: r for r in recipients}
    targets = [by_queue[c.function] for c in copies]
    failed = failures(targets, outcomes, copies, tries)
    result: dict[str, object] = {"completed": len(copies) - len(failed),
                                 "failed": [f for f, _ in failed], "_failed": failed}
    if request.answering.gather:
        result.update(gathered(targets, outcomes, tries, settings.gather_max_bytes))
    return result


def run_copies(client: gearman.Client, copies: Sequence[gearman.Copy], priority: str,
               placed: gearman.Placed, attempts: int, timeout: float, backoff: float,
               sleep: Callable[[float], None] = time.sleep
               ) -> tuple[list[gearman.Outcome], list[int]]:
    """The outcome of each copy (``placed``: submitted once already), and
    how many tries it took; a failed copy is tried again after a growing
    pause, up to ``attempts`` tries in all, within ``timeout``."""
    deadline = time.monotonic() + timeout
    outcomes = placed.wait(timeout)
    tries = [1] * len(copies)
    pause = Backoff(backoff, cap=5.0)  # the receivers' pace, not a reconnect
    for attempt in range(2, attempts + 1):
        again = [i for i, o in enumerate(outcomes) if o.status in RETRIED]
        if not again or deadline - time.monotonic() <= pause.pause:
            break
        sleep(pause.failed())
        retried = client.submit_foreground([copies[i] for i in again],
                                           deadline - time.monotonic(), priority)
        for i, outcome in zip(again, retried, strict=True):
            outcomes[i], tries[i] = outcome, attempt
    return outcomes, tries


def failures(targets: Sequence[Recipient], outcomes: Sequence[gearman.Outcome],
             copies: Sequence[gearman.Copy], tries: Sequence[int]
             ) -> list[tuple[dict[str, object], str]]:
    """Each copy that did not complete: its entry in the result's
    ``failed``, and its unique key (for the ledger)."""
    found = []
    for target, outcome, copy, n in zip(targets, outcomes, copies, tries, strict=True):
        if outcome.ok:
            continue
        entry: dict[str, object] = {"client_id": target.client_id, "queue": target.queue,
                                    "status": outcome.status, "reason": outcome.reason,
                                    "attempts": n}
        if outcome.status in ("timeout", "refused"):
            # not withdrawn (a refused held copy is handed again every second):
            # its receiver gets it later
            entry["queued"] = True
        found.append((entry, copy.unique))
    return found


def gathered(targets: Sequence[Recipient], outcomes: Sequence[gearman.Outcome],
             tries: Sequence[int], limit: int) -> dict[str, object]:
    """``answers``: each receiver's answer by client id, as long as their
    data fits ``limit`` bytes together; the rest are listed without data
    (``"truncated": true``) and named in ``answers_truncated``."""
    answers: dict[str, object] = {}
    truncated: list[str] = []
    room = limit
    for target, outcome, n in zip(targets, outcomes, tries, strict=True):
        answer = _answer(outcome, n)
        size = len(outcome.data) + len(outcome.partial)
        if size > room:
            answer = {k: v for k, v in answer.items() if k not in _DATA_KEYS}
            answer["truncated"] = True
            truncated.append(target.client_id)
        else:
            room -= size
        answers[target.client_id] = answer
    return {"answers": answers, **({"answers_truncated": truncated} if truncated else {})}


_DATA_KEYS = frozenset({"data", "data_base64", "partial", "partial_base64"})


def _answer(outcome: gearman.Outcome, tries: int) -> dict[str, object]:
    answer: dict[str, object] = {"status": outcome.status, "attempts": tries}
    if outcome.ok:
        answer.update(_bytes("data", outcome.data))
    else:
        answer["reason"] = outcome.reason
    if outcome.partial:
        answer.update(_bytes("partial", outcome.partial))
    if outcome.warnings:
        answer["warnings"] = [w.decode("utf-8", "replace") for w in outcome.warnings]
    if outcome.progress is not None:
        answer["progress"] = list(outcome.progress)
    return answer


def _bytes(key: str, data: bytes) -> dict[str, str]:
    """UTF-8 text as it is; anything else in base64, under ``<key>_base64``."""
    try:
        return {key: data.decode("utf-8")}
    except UnicodeDecodeError:
        return {f"{key}_base64": base64.b64encode(data).decode()}
