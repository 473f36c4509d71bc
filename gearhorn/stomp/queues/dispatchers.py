"""A bridge's Gearman queues (runs under gevent).

Why it is shaped so: docs/design/notes.rst, "gearhorn/stomp/queues/dispatchers.py".
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
from gearhorn.rules.naming import GIVEN_BACK, is_held
from gearhorn.stomp.queues import dispatch
from gearhorn.stomp.queues.grabbing import Grabber
from gearhorn.stomp.queues.jobinfo import JobInfo
from gearhorn.store.redeliveries import Redeliveries
from gearhorn.store.redisconn import REDIS_ERRORS

log = logging.getLogger(__name__)



# Calls that wait (for gearmand, for Redis) are made one at a time, in the
# order asked for, off the caller's greenlet: a greenlet each would let a
# slow first call be overtaken, and a queue's dead letters would then be out
# of the order they were given up in.
class InOrder:
    """Runs the calls given to :meth:`later` in one greenlet, in order; a
    call that raises is logged, and the ones behind it still run."""

    def __init__(self, what: str) -> None:
        self.what = what  # for the log
        self._calls: deque[tuple[Callable[[], None], str]] = deque()
        self._running = False

    def later(self, call: Callable[[], None], about: str = "") -> None:
        """Run ``call`` after those before it (``about``: what the log names
        should it raise)."""
        self._calls.append((call, about))
        if not self._running:
            self._running = True
            gevent.spawn(self._run)

    def _run(self) -> None:
        try:
            while self._calls:
                call, about = self._calls.popleft()
                try:
                    call()
                except Exception:  # noqa: BLE001 - a bug; the calls behind it still go
                    log.exception("%s %s", self.what, about)
        finally:
            self._running = False


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
                 handouts: Redeliveries | None = None, give_back: GiveBackFn | None = None,
                 after: gevent.Greenlet | None = None) -> None:
        self.function = function
        self._dead_letter = dead_letter
        self._dead_letters = InOrder(f"{function}: dead-lettering")  # in the order given up
        self._jobinfo = JobInfo(function, lookup, handouts)
        self._give_back = give_back
        self.released: gevent.Greenlet | None = None  # our own give-back, once closed
        self.state = dispatch.Dispatch(max_deliveries)
        self._closed = False
        self._on_empty = on_empty
        self._gearman: Grabber[Delivery] = Grabber(
            function, servers, client_id, self.state.wanted, self._deliveries, self._arrived,
            self._lost, tls, after)

    def start(self) -> None:
        """Connect to every gearmand and grab from then on (before SUBSCRIBE's
        receipt, gearmand counts this bridge as a worker of the queue)."""
        self._gearman.start()

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
        self._gearman.wake.set()

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
            self._jobinfo.settled(delivery.unique, delivery.worker)

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
        self._gearman.wake.set()

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
            if not self._closed and delivery.worker in self._gearman.workers:
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

    def _deliveries(self, worker: gearman.WorkerConnection,
                    jobs: list[gearman.GrabbedJob]) -> list[Delivery]:
        """The grabbed jobs as deliveries, with what Redis knows of each."""
        return [Delivery(job, worker, self, known.headers, unique=known.unique,
                         redelivered=known.redelivered, tracked=known.tracked)
                for job, known in zip(jobs, self._jobinfo.known(jobs), strict=True)]

    def _arrived(self, deliveries: list[Delivery]) -> None:
        self.waiting.extend(deliveries)
        self.dispatch()

    def _lost(self, worker: gearman.WorkerConnection) -> None:
        """Jobs grabbed on a broken connection are gearmand's again: drop them."""
        self.state.waiting = deque(d for d in self.waiting if d.worker is not worker)

    @property
    def connected(self) -> int:
        return len(self._gearman.workers)

    def close(self, give_back: bool = False) -> None:
        """Stop grabbing. ``give_back``: what we hold goes back in order, in
        a greenlet of its own (:attr:`released`); gearmand requeues every
        job still held when the connections close."""
        if self._closed:
            return
        self._closed = True
        self._gearman.stop()
        if self._jobinfo.unwritten:
            gevent.spawn(self._jobinfo.write_settled)
        held = [d for d in self.waiting if not d.done]
        self.waiting.clear()
        if give_back and held and self._give_back is not None:
            self.released = gevent.spawn(self._return_then_close, held)
        else:
            self._gearman.close_workers()

    def _return_then_close(self, held: list[Delivery]) -> None:
        try:
            given = self._give_back(self.function, held)
            for delivery in given:
                delivery.done = True
                if is_held(delivery.job.unique):  # its holder hands it again first in line
                    delivery.worker.exception(delivery.job.handle, GIVEN_BACK)
                else:  # submitted anew: the original goes
                    delivery.worker.complete(delivery.job.handle)
            for worker in self._gearman.workers:
                worker.flush()  # the completions leave before the close
            if given:
                log.info("%s: gave %d of %d held messages back in order", self.function,
                         len(given), len(held))
        except (gearman.GearmanError, *REDIS_ERRORS) as exc:
            log.warning("%s: held messages not given back in order (%s); gearmand "
                        "requeues them", self.function, exc)
        finally:
            self._gearman.close_workers()


def _stop_timer(delivery: Delivery) -> None:
    if delivery.timer is not None:
        delivery.timer.kill(block=False)
        delivery.timer = None
