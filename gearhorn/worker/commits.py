"""Answering a worker's jobs once an fsync covers them, while the worker
takes the next ones (group commit, as ocamlmq and RabbitMQ do it).

Why it is shaped so: docs/design/notes.rst, "gearhorn/worker/commits.py".
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from gearhorn.runtime.background import Outage
from gearhorn.store.durability import Durability
from gearhorn.store.fsync import BarrierUnavailable, FsyncFailed

log = logging.getLogger(__name__)

# Answer(reason) writes a group's answers ("" or why its fsync failed) and
# returns the connections to flush.
Answer = Callable[[str], set]


@dataclass
class Group:
    answer: Answer
    durable: bool  # its answers promise what an fsync must cover
    marks: tuple[int, ...] = ()  # Durability.marks() before its writes
    redo: object = None  # what the worker runs again if Redis may have lost it
    size: int = 1  # jobs it answers


class Committer(threading.Thread):
    def __init__(self, durability: Durability, flush: Callable[[set], None],
                 wake: Callable[[], None], most: int = 8,
                 leaving: threading.Event | None = None,
                 before_answers: Callable[[], None] = lambda: None) -> None:
        """``before_answers``: writes what the answers must follow (never raises)."""
        super().__init__(name="gearhorn-commit", daemon=True)
        self.durability, self._flush, self._wake = durability, flush, wake
        self._before_answers = before_answers
        self.most = most
        # Set when the worker leaves: a group that cannot be queued then is
        # dropped unanswered (gearmand gives its jobs to another worker).
        self.leaving = leaving or threading.Event()
        self.done = 0  # jobs answered
        self._waiting: deque[Group] = deque()
        self._redo: list[object] = []
        self._changed = threading.Condition()
        self._busy = False
        self._stopping = False
        self._outage = Outage(log, "fsync barrier")

    def put(self, group: Group) -> None:
        """Queue a group's answers (waits while ``most`` groups wait: the
        worker takes no more jobs than the disk keeps up with)."""
        with self._changed:
            while len(self._waiting) >= self.most and not self._stopping:
                if self.leaving.is_set():
                    return
                self._changed.wait(0.5)
            self._waiting.append(group)
            self._changed.notify_all()

    def take_redo(self) -> list[object]:
        """Groups to run again (a Redis connection broke after their writes)."""
        with self._changed:
            redo, self._redo = self._redo, []
            return redo

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every group queued is answered (or sent back)."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._waiting and not self._busy,
                                          timeout)

    def stop(self, timeout: float = 10.0) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        self.join(timeout)

    def run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._waiting or self._stopping)
                if not self._waiting:
                    return
                groups = list(self._waiting)
                self._waiting.clear()
                self._busy = True
                self._changed.notify_all()
            try:
                self._commit(groups)
            except Exception:  # a bug must not stop the answers
                log.exception("answering %d groups of jobs failed", len(groups))
            finally:
                with self._changed:
                    self._busy = False
                    self._changed.notify_all()

    def _commit(self, groups: list[Group]) -> None:
        self._before_answers()  # before the fsync too: it covers them
        reason, lost = self._on_disk([g for g in groups if g.durable])
        workers: set = set()
        for group in groups:
            if group.durable and lost:
                continue
            workers |= group.answer(reason if group.durable else "")
            self.done += group.size
        self._flush(workers)
        if lost:
            with self._changed:
                self._redo += [g.redo for g in groups if g.durable]
            self._wake()

    def _on_disk(self, durable: list[Group]) -> tuple[str, bool]:
        """One fsync for every durable group: ("", False) once on disk, (the
        reason, False) if the fsync failed or the barrier stayed unavailable
        for barrier_timeout, ("", True) if Redis may have lost their writes
        (they go back to the worker)."""
        if not durable:
            return "", False
        marks = durable[0].marks  # the oldest writes: a break since then covers all
        try:
            self.durability.wait(marks)
            self._outage.succeeded()
            return "", False
        except FsyncFailed as exc:
            log.error("%s", exc)
            return str(exc), False
        except BarrierUnavailable as exc:
            if exc.lost:
                log.warning("%s: %d groups of jobs run again", exc, len(durable))
                return "", True
            self._outage.failed(exc, f": {len(durable)} groups of jobs fail with the reason")
            return str(exc), False
