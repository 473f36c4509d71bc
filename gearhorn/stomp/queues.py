"""A bridge's Gearman queues (runs under gevent).

A :class:`QueueDispatcher` works one Gearman function for every STOMP
subscription of it in this bridge: it grabs only as many jobs as its
subscribers have credit for, hands them out round-robin (which one gets
what is :mod:`gearhorn.stomp.dispatch`'s, pure), and completes a job only
when its STOMP client acknowledged it. NACK, an ack timeout or a subscriber
that leaves gives the job to another subscriber; when the last one leaves,
the dispatcher gives what it held back in order (:mod:`gearhorn.stomp.giveback`)
and closes its Gearman connections; gearmand requeues whatever is left. So a
message is never completed before its ack and never vanishes.

A shared queue's dispatcher (``/queue/``, a durable subscription's) counts
in Redis what it hands out (:mod:`gearhorn.store.handouts`), so a message that
reached a client before is ``redelivered`` whichever bridge delivers it again.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Protocol

import gevent
import gevent.event
import gevent.queue

from gearhorn import gearman
from gearhorn.background import Backoff
from gearhorn.stomp import dispatch
from gearhorn.stomp.inorder import InOrder
from gearhorn.stomp.recall import Recall
from gearhorn.store.handouts import Handouts
from gearhorn.store.redisconn import REDIS_ERRORS

log = logging.getLogger(__name__)

# Jobs grabbed per GRAB burst at most; credit beyond it is used next round.
_GRAB_BURST = 64


class QueueConsumer(dispatch.Taker, Protocol):
    """What a dispatcher needs from a STOMP subscription."""

    def deliver(self, delivery: Delivery) -> None: ...

    def forget(self, delivery: Delivery) -> None: ...


class Delivery:
    """One grabbed Gearman job on its way to (or at) a STOMP subscriber."""

    __slots__ = ("job", "worker", "dispatcher", "consumer", "redelivered", "deliveries",
                 "timer", "done", "message_id", "headers", "unique", "tracked")
    extra = b""  # no header lines of the bridge's own (a stream delivery has some)

    def __init__(self, job: gearman.GrabbedJob, worker: gearman.WorkerConnection,
                 dispatcher: QueueDispatcher, headers: dict[str, str] | None = None, *,
                 unique: str | None = None, redelivered: bool = False,
                 tracked: bool = False) -> None:
        self.job = job
        self.headers = headers or {}  # the sender's, from the HeaderStore
        self.worker = worker
        self.dispatcher = dispatcher
        self.consumer: QueueConsumer | None = None
        # The message's own unique key: a given-back job's original (ledger, headers).
        self.unique = job.unique if unique is None else unique
        self.redelivered = redelivered  # handed to a client before, by any bridge
        self.tracked = tracked  # its hand-out is counted in Redis
        self.deliveries = 0
        self.timer: gevent.Greenlet | None = None
        self.done = False
        self.message_id = ""  # set by the session at each delivery

    @property
    def body(self) -> bytes:
        return self.job.data

    def ack(self) -> None:
        self.dispatcher.ack(self)

    def nack(self) -> None:
        self.dispatcher.give_back([self])


GiveBackFn = Callable[[str, list[Delivery]], list[Delivery]]


class QueueDispatcher:
    """Hands the jobs of one Gearman function to this bridge's subscribers."""

    def __init__(self, function: str, servers: tuple[tuple[str, int], ...],
                 client_id: str, on_empty: Callable[[QueueDispatcher], None], *,
                 lookup: Callable[[list[str]], dict[str, dict[str, str]]] | None = None,
                 dead_letter: Callable[[Delivery, str], None] | None = None,
                 max_deliveries: int = 0, tls: gearman.TlsFiles | None = None,
                 handouts: Handouts | None = None, give_back: GiveBackFn | None = None,
                 after: gevent.Greenlet | None = None) -> None:
        self.function = function
        self._tls = tls
        self._dead_letter = dead_letter
        self._dead_letters = InOrder(f"{function}: dead-lettering")  # in the order given up
        self._recall = Recall(function, lookup, handouts)
        self._give_back = give_back
        self._after = after  # the give-back of this queue's previous dispatcher here
        self.released: gevent.Greenlet | None = None  # our own give-back, once closed
        self._arrivals: gevent.queue.Queue = gevent.queue.Queue()
        self._looking_up = 0  # grabbed, waiting for what Redis knows of them
        self.state = dispatch.Dispatch(max_deliveries)
        self._wake = gevent.event.Event()
        self._closed = False
        self._on_empty = on_empty
        self._workers: list[gearman.WorkerConnection] = []
        self._servers, self._client_id = servers, client_id
        self._loops: list[gevent.Greenlet] = []

    def start(self) -> None:
        """Connect to every server and grab from then on. Connects (and sends
        CAN_DO) before it returns, so before SUBSCRIBE's receipt gearmand
        counts this bridge as a worker of the queue."""
        self._loops = [gevent.spawn(self._grab_loop, self._open(host, port, self._client_id))
                       for host, port in self._servers]
        self._loops.append(gevent.spawn(self._arrivals_loop))

    def _open(self, host: str, port: int, client_id: str) -> gearman.WorkerConnection:
        worker = gearman.WorkerConnection(host, port, [self.function], client_id, self._tls)
        worker.coalesce = _run_soon
        try:
            worker.open()
            self._workers.append(worker)
        except gearman.GearmanError as exc:
            log.warning("queue %s: gearmand %s:%s: %s", self.function, host, port, exc)
        return worker

    @property
    def consumers(self) -> list[QueueConsumer]:
        return self.state.consumers

    @property
    def waiting(self) -> deque[Delivery]:
        return self.state.waiting

    # -- consumers -------------------------------------------------------------

    def add(self, consumer: QueueConsumer) -> None:
        self.state.add(consumer)
        self.credit_changed()

    def remove(self, consumer: QueueConsumer, unacked: list[Delivery],
               give_back: bool = True) -> None:
        """``consumer`` leaves; its ``unacked`` deliveries go to the others,
        first in line, in the order they had been delivered. The last one
        to leave closes the dispatcher; ``give_back``: what it held goes
        back to the queue in order (False: the queue is dropped anyway)."""
        self.state.remove(consumer)
        back = [d for d in unacked if not self._exhausted(d, "its subscriber went away")]
        for delivery in back:
            _stop_timer(delivery)
        self.state.requeue_all(back)
        if not self.consumers:
            self.close(give_back)
            self._on_empty(self)
        else:
            self.dispatch()

    def credit_changed(self) -> None:
        self.dispatch()
        self._wake.set()

    # -- delivery ----------------------------------------------------------------

    def dispatch(self, avoid: QueueConsumer | None = None) -> None:
        """Give waiting jobs to consumers with credit, round-robin."""
        for delivery, consumer in self.state.assignments(avoid):
            if consumer.ack_timeout:
                delivery.timer = gevent.spawn_later(consumer.ack_timeout, self._expired, delivery)
            consumer.deliver(delivery)

    def ack(self, delivery: Delivery) -> None:
        if delivery.done:
            return
        self._settle(delivery)
        try:
            delivery.worker.complete(delivery.job.handle)
        except gearman.GearmanError as exc:
            # gearmand requeued it when the connection broke: it comes again.
            log.warning("ack of %s on %s not delivered: %s", delivery.job.handle,
                        self.function, exc)
        else:
            self._forget(delivery)
        self.credit_changed()

    def _forget(self, delivery: Delivery) -> None:
        if delivery.tracked:
            self._recall.settled(delivery.unique, delivery.worker)

    def give_back(self, deliveries: list[Delivery]) -> None:
        """NACK: the jobs go to another subscriber (or back in line), first
        in line, in the order they had been delivered."""
        back = [d for d in deliveries
                if not d.done and not self._exhausted(d, "rejected with NACK")]
        if not back:
            return
        previous = back[0].consumer
        for delivery in back:
            _stop_timer(delivery)
        self.state.requeue_all(back)
        self.dispatch(avoid=previous)
        self._wake.set()

    def reject(self, deliveries: list[Delivery]) -> None:
        """NACK with ``requeue:false``: straight to the dead-letter queue."""
        if self._dead_letter is None:
            self.give_back(deliveries)
            return
        for delivery in deliveries:
            if not delivery.done:
                self._settle(delivery)
                delivery.consumer = None
                self._dead_letter_later(delivery, "rejected")
        self.credit_changed()

    def _expired(self, delivery: Delivery) -> None:
        if delivery.done or delivery.consumer is None:
            return
        log.info("ack timeout on %s: redelivering %s", self.function, delivery.job.handle)
        previous = delivery.consumer
        previous.forget(delivery)
        delivery.timer = None
        if self._exhausted(delivery, f"not acknowledged within {previous.ack_timeout:g}s"):
            return
        self._requeue(delivery, front=True)
        self.dispatch(avoid=previous)

    def _exhausted(self, delivery: Delivery, reason: str) -> bool:
        """After ``max_deliveries`` the message goes to the dead-letter queue
        instead of back in line."""
        if self._dead_letter is None or not self.state.exhausted(delivery):
            return False
        self._settle(delivery)
        delivery.consumer = None
        self._dead_letter_later(delivery, reason)
        return True

    def _dead_letter_later(self, delivery: Delivery, reason: str) -> None:
        """Off this greenlet (moving waits for gearmand and Redis), one at a
        time: the dead-letter queue and its index keep the order messages
        were given up in."""
        self._dead_letters.later(partial(self._move_to_dead_letters, delivery, reason),
                                 delivery.job.handle)

    def _move_to_dead_letters(self, delivery: Delivery, reason: str) -> None:
        try:
            self._dead_letter(delivery, reason)
            self._forget(delivery)
        except (gearman.GearmanError, *REDIS_ERRORS) as exc:
            log.warning("%s: could not dead-letter %s (%s); it stays in the queue",
                        self.function, delivery.job.handle, exc)
            if not self._closed and delivery.worker in self._workers:
                delivery.done = False
                self._requeue(delivery, front=False)
                self.credit_changed()

    def _settle(self, delivery: Delivery) -> None:
        delivery.done = True
        _stop_timer(delivery)

    def _requeue(self, delivery: Delivery, front: bool) -> None:
        _stop_timer(delivery)
        self.state.requeue(delivery, front)

    # -- gearman -----------------------------------------------------------------

    def _grab_loop(self, worker: gearman.WorkerConnection) -> None:
        if self._after is not None:
            # Messages this bridge is giving back go first: wait until they are
            # queued again before grabbing (newer ones would overtake them).
            self._after.join(timeout=30)
        backoff = Backoff()
        while not self._closed:
            try:
                if worker not in self._workers:
                    worker.open()
                    self._workers.append(worker)
                backoff.succeeded()
                self._grab_while_open(worker)
            except gearman.GearmanError as exc:
                if self._closed:
                    return
                pause = backoff.failed()
                log.warning("queue %s: gearmand %s:%s: %s; retrying in %.1fs", self.function,
                            worker.conn.host, worker.conn.port, exc, pause)
                self._forget_worker(worker)
                gevent.sleep(pause)

    def _grab_while_open(self, worker: gearman.WorkerConnection) -> None:
        # Each wake-up is one write, GRABs and a PRE_SLEEP, then a wait for
        # gearmand's NOOP (at once if jobs are left). The GRABs start at 1
        # and double while gearmand has as many jobs as asked: every GRAB is
        # a packet both sides parse, and a subscriber with prefetch 1000
        # woken for one message must not cost 64 GRABs and 63 NO_JOBs (that
        # was the bridge's CPU, and its latency, at light load).
        burst = 1
        while not self._closed:
            want = self.state.wanted() - self._looking_up
            if want <= 0:
                self._wake.clear()
                self._wake.wait(1.0)
                continue
            asked = min(want, burst)
            jobs = worker.grab(asked, then_sleep=True)
            if jobs:
                # Redis is asked about them in a greenlet of its own, so the
                # next GRAB need not wait for that answer.
                self._looking_up += len(jobs)
                self._arrivals.put((worker, jobs))
            burst = min(burst * 2, _GRAB_BURST) if len(jobs) == asked else 1
            worker.wait_for_work(1.0)

    def _arrivals_loop(self) -> None:
        """Grabbed jobs in the order they came: what Redis knows of them (the
        grab loops go on meanwhile), then to the subscribers. Jobs still here
        when the dispatcher closes go back through gearmand, not the ordered
        give-back: without Redis's answer the bridge cannot tell a request
        from a message."""
        while not self._closed:
            worker, jobs = self._arrivals.get()
            try:
                if worker not in self._workers:
                    continue  # its connection broke: gearmand has them again
                try:
                    deliveries = self._deliveries(worker, jobs)
                except gearman.GearmanError as exc:
                    log.warning("queue %s: %s; gearmand takes the jobs back", self.function, exc)
                    self._forget_worker(worker)
                    continue
                except Exception:  # a bug must not stop the queue: the jobs go back
                    log.exception("queue %s: grabbed jobs not delivered", self.function)
                    self._forget_worker(worker)
                    continue
            finally:
                self._looking_up -= len(jobs)
            self.waiting.extend(deliveries)
            self.dispatch()
            self._wake.set()

    def _deliveries(self, worker: gearman.WorkerConnection,
                    jobs: list[gearman.GrabbedJob]) -> list[Delivery]:
        """The grabbed jobs as deliveries, with what Redis knows of each."""
        return [Delivery(job, worker, self, known.headers, unique=known.unique,
                         redelivered=known.redelivered, tracked=known.tracked)
                for job, known in zip(jobs, self._recall.known(jobs), strict=True)]

    @property
    def connected(self) -> int:
        return len(self._workers)

    def _forget_worker(self, worker: gearman.WorkerConnection) -> None:
        """Jobs grabbed on a broken connection are gearmand's again: drop them."""
        worker.close()
        if worker in self._workers:
            self._workers.remove(worker)
        self.state.waiting = deque(d for d in self.waiting if d.worker is not worker)

    def close(self, give_back: bool = False) -> None:
        """Stop grabbing. ``give_back``: what we hold goes back in order, in
        a greenlet of its own (:attr:`released`); gearmand requeues every
        job still held when the connections close."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        gevent.killall(self._loops, block=False)
        if self._recall.unwritten:
            gevent.spawn(self._recall.write_settled)
        held = [d for d in self.waiting if not d.done]
        self.waiting.clear()
        if give_back and held and self._give_back is not None:
            self.released = gevent.spawn(self._return_then_close, held)
        else:
            self._close_workers()

    def _return_then_close(self, held: list[Delivery]) -> None:
        try:
            given = self._give_back(self.function, held)
            for delivery in given:
                delivery.done = True
                delivery.worker.complete(delivery.job.handle)
            for worker in self._workers:
                worker.flush()  # the completions leave before the close
            if given:
                log.info("%s: gave %d of %d held messages back in order", self.function,
                         len(given), len(held))
        except (gearman.GearmanError, *REDIS_ERRORS) as exc:
            log.warning("%s: held messages not given back in order (%s); gearmand "
                        "requeues them", self.function, exc)
        finally:
            self._close_workers()

    def _close_workers(self) -> None:
        for worker in self._workers:
            worker.close()
        self._workers.clear()


def _run_soon(callback: Callable[[], None]) -> None:
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


def _stop_timer(delivery: Delivery) -> None:
    if delivery.timer is not None:
        delivery.timer.kill(block=False)
        delivery.timer = None
