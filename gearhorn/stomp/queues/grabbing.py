"""The Gearman side of a bridge's queue (runs under gevent): one worker
connection per gearmand, GRABbing only as many jobs as the subscribers
have credit for, and the grabbed jobs handed on in the order they came,
after Redis was asked what it knows of them (gearhorn/stomp/queues/dispatchers.py's
:class:`QueueDispatcher` is who gets them)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import gevent
import gevent.event
import gevent.queue

from gearhorn import gearman
from gearhorn.runtime.background import Backoff

log = logging.getLogger(__name__)

# Jobs grabbed per GRAB burst at most; credit beyond it is used next round.
GRAB_BURST = 64

T = TypeVar("T")
Made = Callable[[gearman.WorkerConnection, list[gearman.GrabbedJob]], list[T]]


class Grabber(Generic[T]):
    """Grabs one Gearman function's jobs from every server: ``wanted()``
    says how many, ``make`` turns grabbed jobs into what ``arrived`` takes;
    ``lost`` hears of a connection that broke (its jobs are gearmand's
    again)."""

    def __init__(self, function: str, servers: Sequence[tuple[str, int]], client_id: str,
                 wanted: Callable[[], int], make: Made[T], arrived: Callable[[list[T]], None],
                 lost: Callable[[gearman.WorkerConnection], None],
                 tls: gearman.TlsFiles | None = None,
                 after: gevent.Greenlet | None = None) -> None:
        self.function = function
        self._servers, self._client_id, self._tls = tuple(servers), client_id, tls
        self._wanted, self._make, self._arrived, self._lost = wanted, make, arrived, lost
        self._after = after  # the give-back of this queue's previous dispatcher here
        self._arrivals: gevent.queue.Queue = gevent.queue.Queue()
        self._looking_up = 0  # grabbed, waiting for what Redis knows of them
        self.wake = gevent.event.Event()  # set when credit may have grown
        self.workers: list[gearman.WorkerConnection] = []
        self._loops: list[gevent.Greenlet] = []
        self.closed = False

    def start(self) -> None:
        """Connect to every server and grab from then on. Connects (and sends
        CAN_DO) before it returns, so before SUBSCRIBE's receipt gearmand
        counts this bridge as a worker of the queue."""
        self._loops = [gevent.spawn(self._grab_loop, self._open(host, port))
                       for host, port in self._servers]
        self._loops.append(gevent.spawn(self._arrivals_loop))

    def _open(self, host: str, port: int) -> gearman.WorkerConnection:
        worker = gearman.WorkerConnection(host, port, [self.function], self._client_id,
                                          self._tls)
        worker.coalesce = run_soon
        try:
            worker.open()
            self.workers.append(worker)
        except gearman.GearmanError as exc:
            log.warning("queue %s: gearmand %s:%s: %s", self.function, host, port, exc)
        return worker

    def _grab_loop(self, worker: gearman.WorkerConnection) -> None:
        if self._after is not None:
            # Messages this bridge is giving back go first: wait until they are
            # queued again before grabbing (newer ones would overtake them).
            self._after.join(timeout=30)
        backoff = Backoff()
        while not self.closed:
            try:
                if worker not in self.workers:
                    worker.open()
                    self.workers.append(worker)
                backoff.succeeded()
                self._grab_while_open(worker)
            except gearman.GearmanError as exc:
                if self.closed:
                    return
                pause = backoff.failed()
                log.warning("queue %s: gearmand %s:%s: %s; retrying in %.1fs", self.function,
                            worker.conn.host, worker.conn.port, exc, pause)
                self.forget(worker)
                gevent.sleep(pause)

    def _grab_while_open(self, worker: gearman.WorkerConnection) -> None:
        # Each wake-up is one write, GRABs and a PRE_SLEEP, then a wait for
        # gearmand's NOOP (at once if jobs are left). The GRABs start at 1
        # and double while gearmand has as many jobs as asked: every GRAB is
        # a packet both sides parse, and a subscriber with prefetch 1000
        # woken for one message must not cost 64 GRABs and 63 NO_JOBs (that
        # was the bridge's CPU, and its latency, at light load).
        burst = 1
        while not self.closed:
            want = self._wanted() - self._looking_up
            if want <= 0:
                self.wake.clear()
                self.wake.wait(1.0)
                continue
            asked = min(want, burst)
            jobs = worker.grab(asked, then_sleep=True)
            if jobs:
                # Redis is asked about them in a greenlet of its own, so the
                # next GRAB need not wait for that answer.
                self._looking_up += len(jobs)
                self._arrivals.put((worker, jobs))
            burst = min(burst * 2, GRAB_BURST) if len(jobs) == asked else 1
            worker.wait_for_work(1.0)

    def _arrivals_loop(self) -> None:
        """Grabbed jobs in the order they came: what Redis knows of them (the
        grab loops go on meanwhile), then on. Jobs still here when the
        grabber closes go back through gearmand, not the ordered give-back:
        without Redis's answer the bridge cannot tell a request from a
        message."""
        while not self.closed:
            worker, jobs = self._arrivals.get()
            try:
                if worker not in self.workers:
                    continue  # its connection broke: gearmand has them again
                try:
                    made = self._make(worker, jobs)
                except gearman.GearmanError as exc:
                    log.warning("queue %s: %s; gearmand takes the jobs back", self.function, exc)
                    self.forget(worker)
                    continue
                except Exception:  # a bug must not stop the queue: the jobs go back
                    log.exception("queue %s: grabbed jobs not delivered", self.function)
                    self.forget(worker)
                    continue
            finally:
                self._looking_up -= len(jobs)
            self._arrived(made)
            self.wake.set()

    def forget(self, worker: gearman.WorkerConnection) -> None:
        """Jobs grabbed on a broken connection are gearmand's again."""
        worker.close()
        if worker in self.workers:
            self.workers.remove(worker)
        self._lost(worker)

    def stop(self) -> None:
        """No more grabbing; the connections stay open (:meth:`close_workers`)."""
        self.closed = True
        self.wake.set()
        gevent.killall(self._loops, block=False)

    def close_workers(self) -> None:
        for worker in self.workers:
            worker.close()
        self.workers.clear()


def run_soon(callback: Callable[[], None]) -> None:
    """Run ``callback`` in a greenlet of its own once the current one yields, so
    acks given together leave in one write. Not ``loop.run_callback``: that
    runs in the hub, where a socket write that has to wait is not allowed
    (and a half-written packet would corrupt the connection)."""
    gevent.spawn(_guarded, callback)


def _guarded(callback: Callable[[], None]) -> None:
    try:
        callback()
    except gearman.GearmanError as exc:
        # The connection broke: gearmand requeues what we held; it comes again.
        log.warning("acks not delivered: %s", exc)
