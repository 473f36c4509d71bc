"""One worker process: takes jobs from every gearmand, several at a time
(:class:`gearman.JobSource`), runs them through the :class:`FanoutService`
and answers them; around it, this process's heartbeat, cache listener,
ledger and metrics flusher, delayed-message releaser and the warden's rounds
when it holds the lease (gearhorn/worker/service.py is the logic, and
gearhorn/worker/wiring.py builds what it runs with).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

from gearhorn import gearman
from gearhorn.config import Config
from gearhorn.errors import BadRequest
from gearhorn.runtime.background import Backoff, Fault, Outage
from gearhorn.store.redisconn import REDIS_ERRORS
from gearhorn.store.registry import new_worker_id
from gearhorn.worker.commits import Committer, Group
from gearhorn.worker.jobs import FUNCTIONS, Answer, Job, ServiceUnavailable
from gearhorn.worker.wiring import build_worker

log = logging.getLogger(__name__)


def _store_full(exc: Exception) -> bool:
    """gearmand's answer when its persistent queue refuses a job (the queue
    Redis at maxmemory, say)."""
    return "QUEUE_ERROR" in str(exc)


def _warnings(pending: list[tuple[gearman.WorkerConnection, gearman.GrabbedJob, Job]],
              text: bytes) -> Group:
    """WORK_WARNING to each job's client (a foreground one sees it)."""
    def answer(_: str) -> set[gearman.WorkerConnection]:
        for worker, grabbed, _ in pending:
            worker.warn(grabbed.handle, text)
        return {worker for worker, _, _ in pending}
    return Group(answer, durable=False, size=0)


def _jobs_named(taken: list[tuple[object, gearman.GrabbedJob, Job]]) -> str:
    """``fanout job H:1``, or ``3 jobs from fanout job H:1 on``, for the log."""
    _, first, _ = taken[0]
    name = f"{first.function} job {first.handle.decode(errors='replace')}"
    return name if len(taken) == 1 else f"{len(taken)} jobs from {name} on"


class WorkerProcess:
    """One worker process: gets jobs from gearmand until told to stop."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.worker_id = new_worker_id()
        parts = build_worker(config, self.worker_id, FUNCTIONS)  # gearhorn/worker/wiring.py
        self.parts = parts
        self.registry, self.ledger, self.service = parts.registry, parts.ledger, parts.service
        self.flusher, self.durability, self.jobs = parts.flusher, parts.durability, parts.jobs
        self._draining = threading.Event()
        # Answers wait for an fsync that covers them, in a thread of their
        # own while this one takes the next jobs.
        # The answers' ledger entries are in Redis before them (the committer
        # writes them, a round trip for all the groups it answers): a worker
        # killed after answering takes no entry with it, so the
        # reconciliation knows every copy it made.
        self.committer = Committer(self.durability, self._flush, self.jobs.wake,
                                   leaving=self._draining, before_answers=self.ledger.flush)
        self.started = time.time()

    def run(self) -> None:
        """Serve jobs until :meth:`drain` is called (see :meth:`serve` for
        what happens to the jobs in hand)."""
        self.parts.listener.start()
        self.committer.start()
        self.flusher.start()
        self.parts.releaser.start()
        if self.parts.holding is not None:
            # Alive before holding anything: a holder not seen alive has its
            # copies taken over by the other processes.
            self.registry.heartbeat(self.worker_id, self.config.worker_ttl, {})
            self.parts.holding.start()
        threading.Thread(target=self._heartbeats, name="gearhorn-heartbeat", daemon=True).start()
        if self.parts.warden is not None:
            threading.Thread(target=self._guard_queues, name="gearhorn-warden",
                             daemon=True).start()
        log.info("worker %s serving %s on %s", self.worker_id, ", ".join(FUNCTIONS),
                 ", ".join(f"{h}:{p}" for h, p in self.config.gearman_servers))
        try:
            while not self._draining.is_set():
                taken = [t for group in self.committer.take_redo() for t in group]
                taken = taken or self.jobs.take(timeout=1.0)
                if taken:
                    self.serve(taken)
                    self.flusher.poke()  # their counts and tallies
        finally:
            self._shutdown()

    def serve(self, taken: list[tuple[gearman.WorkerConnection, gearman.GrabbedJob]]) -> None:
        """Run the jobs taken together and answer each on its connection.

        Once :meth:`drain` was called, the group of jobs running is finished
        and the rest is left unanswered: C gearmand gives those to another
        worker when this one leaves (gear.Server fails them)."""
        received = time.monotonic()
        pending = [(worker, grabbed, Job(grabbed.function, grabbed.data, grabbed.unique,
                                         received)) for worker, grabbed in taken]
        backoff, warned, since = Backoff(0.2), False, time.monotonic()
        while pending:
            try:
                marks = self.durability.marks()  # before the writes the answers cover
                for outcomes in self.service.run([job for _, _, job in pending]):
                    done = pending[:len(outcomes)]
                    self._answer(done, outcomes, marks)
                    pending = pending[len(outcomes):]
                    if self._draining.is_set():
                        return  # the jobs not started go back to gearmand as we leave
            except ServiceUnavailable as exc:
                # Keep the jobs and try again with a growing pause instead of
                # failing them (a failed background job would be gone); new
                # work waits in gearmand meanwhile. A foreground client gets
                # one WORK_WARNING saying why.
                if self._draining.is_set():
                    return  # gearmand requeues them when we leave
                if _store_full(exc) and time.monotonic() - since >= self.config.fanout_timeout / 2:
                    self._refuse_all(pending, self._store_full_reason(exc))
                    return
                if not warned:
                    log.warning("%s waits: %s; retrying with backoff", _jobs_named(pending), exc)
                    self.committer.put(_warnings(pending, f"{exc}; retrying".encode()))
                    warned = True
                self._draining.wait(backoff.failed())
            except Exception as exc:  # a bug must not kill the worker
                # Refuse the first job not answered (the culprit, or one of
                # its group: the others then go the same way) and run the rest.
                culprit, pending = pending[:1], pending[1:]
                log.exception("job %s on %s failed", culprit[0][1].handle, culprit[0][2].function)
                self._refuse_all(culprit, f"internal error: {type(exc).__name__}: {exc}")
        if warned:
            log.info("jobs done after %.1fs of outage", time.monotonic() - since)

    def _answer(self, done: list[tuple[gearman.WorkerConnection, gearman.GrabbedJob, Job]],
                outcomes: list[Answer], marks: tuple[int, ...]) -> None:
        """Hand a group's answers to the committer, which sends them once an
        fsync covers what they acknowledge (gearhorn/worker/commits.py)."""
        for (_, _, job), outcome in zip(done, outcomes, strict=True):
            if isinstance(outcome, BadRequest):
                self.service.record_rejection(job.function, str(outcome))

        def answer(failed: str) -> set[gearman.WorkerConnection]:
            for (worker, grabbed, job), outcome in zip(done, outcomes, strict=True):
                if isinstance(outcome, BadRequest):
                    self._refuse(worker, grabbed, job, str(outcome))
                elif failed:  # the fsync covering it failed: the promise cannot be kept
                    self._refuse(worker, grabbed, job, failed)
                    self.service.record_rejection(job.function, failed)
                else:
                    worker.complete(grabbed.handle, outcome)
            return {worker for worker, _, _ in done}

        durable = not all(isinstance(outcome, BadRequest) for outcome in outcomes)
        self.committer.put(Group(answer, durable, marks, [(w, g) for w, g, _ in done],
                                 len(done)))

    def _refuse_all(self, pending: list[tuple[gearman.WorkerConnection, gearman.GrabbedJob, Job]],
                    reason: str) -> None:
        """Fail every job in ``pending`` with ``reason`` (the queue store stays
        full: a fanout must fail within ``fanout_timeout``, not hang; or a
        bug). Copies of it gearmand already took stay queued."""
        log.warning("%s refused: %s", _jobs_named(pending), reason)
        for _, _, job in pending:
            self.service.record_rejection(job.function, reason)

        def answer(_: str) -> set[gearman.WorkerConnection]:
            for worker, grabbed, job in pending:
                self._refuse(worker, grabbed, job, reason)
            return {worker for worker, _, _ in pending}
        self.committer.put(Group(answer, durable=False, size=len(pending)))

    def _store_full_reason(self, exc: Exception) -> str:
        pressure = self.parts.pressure
        over = pressure.current()[1] if pressure else ""
        if over:
            return over
        largest = pressure.largest_backlogs() if pressure else "?"
        return f"queue store full: gearmand cannot store the copies ({exc}); " \
               f"largest backlogs: {largest}"

    @staticmethod
    def _refuse(worker: gearman.WorkerConnection, grabbed: gearman.GrabbedJob, job: Job,
                reason: str) -> None:
        # WARNING then FAIL: every client (the gearman CLI too) sees the
        # reason; WORK_EXCEPTION would end the job in gearmand (docs/design/index.rst).
        log.info("rejected %s job: %s", job.function, reason)
        worker.warn(grabbed.handle, reason.encode())
        worker.fail(grabbed.handle)

    @staticmethod
    def _flush(workers: set[gearman.WorkerConnection]) -> None:
        for worker in workers:
            try:
                worker.flush()
            except gearman.GearmanError as exc:  # gone: gearmand requeues its jobs
                log.warning("could not answer gearmand: %s", exc)

    def drain(self) -> None:
        """Stop taking jobs; safe to call from a signal handler."""
        self._draining.set()
        self.jobs.wake()

    def _heartbeats(self) -> None:
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": self.started}
        outage = Outage(log, "redis (heartbeat)")
        while not self._draining.is_set():
            try:
                self.registry.heartbeat(self.worker_id, self.config.worker_ttl,
                                        {**info, "jobs": self.committer.done})
                self.parts.janitor.sweep()  # after bridges that died without a word
                outage.succeeded()
            except REDIS_ERRORS as exc:
                outage.failed(exc)
            self._draining.wait(self.config.heartbeat_interval)

    def _guard_queues(self) -> None:
        """The warden's rounds, while this process holds its lease."""
        outage, fault = Outage(log, "warden"), Fault(log, "warden round")
        warden = self.parts.warden
        while not self._draining.is_set():
            try:
                if warden.lead():
                    warden.round()
                    self.flusher.poke()
                outage.succeeded()
                fault.succeeded()
            except (*REDIS_ERRORS, gearman.GearmanError, OSError) as exc:
                outage.failed(exc)
            except Exception as exc:  # a bug must not stop the rounds
                fault.failed(exc)
            self._draining.wait(self.config.retention_interval)

    def _shutdown(self) -> None:
        parts = self.parts
        parts.listener.stop()
        parts.releaser.stop()
        parts.releaser.join(timeout=10)
        if parts.holding is not None:
            parts.holding.stop()
        self.flusher.stop()
        if not self.committer.wait_idle(10):  # answers waiting for a disk that never came
            log.warning("leaving with answers unsent: gearmand gives their jobs to another worker")
        self.committer.stop()
        self.jobs.close()
        self.durability.close()
        parts.client.close()
        parts.release_client.close()
        if parts.presence_events is not None:
            parts.presence_events.close()
        try:
            self.registry.retire(self.worker_id)
        except REDIS_ERRORS as exc:
            log.warning("could not retire %s: %s", self.worker_id, exc)
        log.info("worker %s stopped after %d jobs", self.worker_id, self.committer.done)
