"""The bridge's side of Gearman and Redis (runs under gevent).

A :class:`QueueDispatcher` works one Gearman function for every STOMP
subscription of it in this bridge: it grabs only as many jobs as its
subscribers have credit for, hands them out round-robin, and completes a job
only when its STOMP client acknowledged it. NACK, an ack timeout or a
subscriber that leaves gives the job to another subscriber; when the last
one leaves, the dispatcher closes its Gearman connections and gearmand
requeues every job it still held. So a message is never completed before
its ack and never vanishes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import re
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

import gevent
import gevent.event
import gevent.lock
import redis

from gearhorn import gearman
from gearhorn.background import Backoff
from gearhorn.config import Config
from gearhorn.delayed import DelayedItem, Scheduler
from gearhorn.errors import GearhornError
from gearhorn.headers import HeaderStore
from gearhorn.janitor import BridgeLiveness, queue_entry, topic_entry
from gearhorn.ledger import Ledger
from gearhorn.messages import Subscription, copy_unique, validate_topic
from gearhorn.registry import Registry
from gearhorn.replay import DashedFunctions
from gearhorn.stomp.auth import Credentials, Principal
from gearhorn.stomp.sending import PLAIN, SendOptions

log = logging.getLogger(__name__)

# Jobs grabbed per GRAB burst at most; credit beyond it is used next round.
_GRAB_BURST = 64



class FanoutFailed(GearhornError):
    """A fanout job the bridge submitted failed or timed out (not the
    client's fault: its request was valid); the message says why."""

class Consumer(Protocol):
    """What a dispatcher needs from a STOMP subscription."""

    ack_timeout: float | None

    def credit(self) -> int: ...

    def deliver(self, delivery: Delivery) -> None: ...

    def forget(self, delivery: Delivery) -> None: ...


class Delivery:
    """One grabbed Gearman job on its way to (or at) a STOMP subscriber."""

    __slots__ = ("job", "worker", "dispatcher", "consumer", "redelivered", "deliveries",
                 "timer", "done", "message_id", "headers")

    def __init__(self, job: gearman.GrabbedJob, worker: gearman.WorkerConnection,
                 dispatcher: QueueDispatcher, headers: dict[str, str] | None = None) -> None:
        self.job = job
        self.headers = headers or {}  # the sender's, from the HeaderStore
        self.worker = worker
        self.dispatcher = dispatcher
        self.consumer: Consumer | None = None
        self.redelivered = False
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
        self.dispatcher.give_back(self)


class QueueDispatcher:
    """Hands the jobs of one Gearman function to this bridge's subscribers."""

    def __init__(self, function: str, servers: tuple[tuple[str, int], ...],
                 client_id: str, on_empty: Callable[[QueueDispatcher], None], *,
                 lookup: Callable[[list[str]], dict[str, dict[str, str]]] | None = None,
                 dead_letter: Callable[[Delivery, str], None] | None = None,
                 max_deliveries: int = 0) -> None:
        self.function = function
        self._lookup = lookup  # unique keys -> headers of those that have some
        self._dead_letter = dead_letter
        self.max_deliveries = max_deliveries  # 0: redeliver forever
        self.consumers: list[Consumer] = []
        self.waiting: deque[Delivery] = deque()
        self._next = 0
        self._wake = gevent.event.Event()
        self._closed = False
        self._on_empty = on_empty
        self._workers: list[gearman.WorkerConnection] = []
        # Connect (and send CAN_DO) before SUBSCRIBE's receipt, so gearmand
        # counts this bridge as a worker of the queue from then on.
        self._loops = [gevent.spawn(self._grab_loop, self._open(host, port, client_id))
                       for host, port in servers]

    def _open(self, host: str, port: int, client_id: str) -> gearman.WorkerConnection:
        worker = gearman.WorkerConnection(host, port, [self.function], client_id)
        worker.coalesce = _run_soon
        try:
            worker.open()
            self._workers.append(worker)
        except gearman.GearmanError as exc:
            log.warning("queue %s: gearmand %s:%s: %s", self.function, host, port, exc)
        return worker

    # -- consumers -------------------------------------------------------------

    def add(self, consumer: Consumer) -> None:
        self.consumers.append(consumer)
        self.credit_changed()

    def remove(self, consumer: Consumer, unacked: list[Delivery]) -> None:
        """``consumer`` leaves; its ``unacked`` deliveries go to the others."""
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        for delivery in reversed(unacked):
            if not self._exhausted(delivery, "its subscriber went away"):
                self._requeue(delivery, front=True)
        if not self.consumers:
            self.close()
            self._on_empty(self)
        else:
            self.dispatch()

    def credit_changed(self) -> None:
        self.dispatch()
        self._wake.set()

    def _credit(self) -> int:
        return sum(max(0, c.credit()) for c in self.consumers)

    # -- delivery ----------------------------------------------------------------

    def dispatch(self, avoid: Consumer | None = None) -> None:
        """Give waiting jobs to consumers with credit, round-robin."""
        while self.waiting:
            consumer = self._pick(avoid)
            if consumer is None:
                return
            delivery = self.waiting.popleft()
            delivery.consumer = consumer
            delivery.deliveries += 1
            if consumer.ack_timeout:
                delivery.timer = gevent.spawn_later(consumer.ack_timeout, self._expired, delivery)
            consumer.deliver(delivery)

    def _pick(self, avoid: Consumer | None) -> Consumer | None:
        n = len(self.consumers)
        fallback = None
        for i in range(n):
            consumer = self.consumers[(self._next + i) % n]
            if consumer.credit() > 0:
                if consumer is avoid and n > 1:
                    fallback = fallback or consumer
                    continue
                self._next = (self._next + i + 1) % n
                return consumer
        return fallback

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
        self.credit_changed()

    def give_back(self, delivery: Delivery) -> None:
        """NACK: the job goes to another subscriber (or back in line)."""
        if delivery.done or self._exhausted(delivery, "rejected with NACK"):
            return
        previous = delivery.consumer
        self._requeue(delivery, front=True)
        self.dispatch(avoid=previous)
        self._wake.set()

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
        instead of back in line (in a greenlet of its own: it waits for gearmand)."""
        if not self.max_deliveries or self._dead_letter is None \
                or delivery.deliveries < self.max_deliveries:
            return False
        self._settle(delivery)
        delivery.consumer = None
        gevent.spawn(self._move_to_dead_letters, delivery, reason)
        return True

    def _move_to_dead_letters(self, delivery: Delivery, reason: str) -> None:
        try:
            self._dead_letter(delivery, reason)
        except (gearman.GearmanError, redis.RedisError) as exc:
            log.warning("%s: could not dead-letter %s (%s); it stays in the queue",
                        self.function, delivery.job.handle, exc)
            if not self._closed and delivery.worker in self._workers:
                delivery.done = False
                self._requeue(delivery, front=False)
                self.credit_changed()

    def _settle(self, delivery: Delivery) -> None:
        delivery.done = True
        if delivery.timer is not None:
            delivery.timer.kill(block=False)
            delivery.timer = None

    def _requeue(self, delivery: Delivery, front: bool) -> None:
        if delivery.timer is not None:
            delivery.timer.kill(block=False)
            delivery.timer = None
        if delivery.consumer is not None:
            delivery.redelivered = True
        delivery.consumer = None
        if front:
            self.waiting.appendleft(delivery)
        else:
            self.waiting.append(delivery)

    # -- gearman -----------------------------------------------------------------

    def _grab_loop(self, worker: gearman.WorkerConnection) -> None:
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
        while not self._closed:
            want = self._credit() - len(self.waiting)
            if want <= 0:
                self._wake.clear()
                self._wake.wait(1.0)
                continue
            jobs = worker.grab(min(want, _GRAB_BURST))
            if jobs:
                headers = self._headers_of(jobs)
                self.waiting.extend(Delivery(job, worker, self, headers.get(job.unique))
                                    for job in jobs)
                self.dispatch()
            else:
                worker.sleep(1.0)

    def _headers_of(self, jobs: list[gearman.GrabbedJob]) -> dict[str, dict[str, str]]:
        if self._lookup is None:
            return {}
        try:
            return self._lookup([job.unique for job in jobs])
        except redis.RedisError as exc:
            # Never deliver without the headers (a reply-to would be lost):
            # drop the connection, gearmand takes the jobs back, and we retry.
            raise gearman.GearmanError(f"message headers unavailable (redis: {exc})") from None

    @property
    def connected(self) -> int:
        return len(self._workers)

    def _forget_worker(self, worker: gearman.WorkerConnection) -> None:
        """Jobs grabbed on a broken connection are gearmand's again: drop them."""
        worker.close()
        if worker in self._workers:
            self._workers.remove(worker)
        self.waiting = deque(d for d in self.waiting if d.worker is not worker)

    def close(self) -> None:
        """Stop grabbing; gearmand requeues every job still held."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        gevent.killall(self._loops, block=False)
        for worker in self._workers:
            worker.close()
        self._workers.clear()
        self.waiting.clear()


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


def durable_client_id(name: str) -> str:
    """A registry client id for a durable subscription name (stable, no '_')."""
    if re.fullmatch(r"[!-~]{1,100}", name) and "_" not in name and "*" not in name:
        return "d-" + name
    return "d-" + hashlib.sha256(name.encode()).hexdigest()[:32]


class Broker:
    """What the STOMP sessions of one bridge process share."""

    def __init__(self, config: Config, registry: Registry, bridge_id: str,
                 credentials: Credentials | None = None) -> None:
        self.config = config
        self.credentials = credentials or Credentials.open()
        self.registry = registry
        self.bridge_id = bridge_id
        self.dispatchers: dict[str, QueueDispatcher] = {}
        self.ledger = Ledger(registry.redis, registry.keys, config.ledger_maxlen,
                             config.ledger_enabled, source=f"bridge-{bridge_id}")
        self.headers = HeaderStore(registry.redis, registry.keys, config.headers_ttl)
        self.scheduler = Scheduler(registry.redis, registry.keys, config.delay_shard_seconds,
                                   config.delay_lease)
        # The bridge's own jobs (dead letters, replies) share one client, one at a time.
        self.dashed = DashedFunctions(registry.redis, registry.keys)
        self._client = self.new_client()
        self._client_lock = gevent.lock.Semaphore()
        # Five times a worker's: the janitor removes a bridge's subscriptions
        # only when it is surely dead, not merely busy for a few seconds.
        self.liveness = BridgeLiveness(registry, bridge_id, 5 * config.worker_ttl)
        self._flush_soon = False
        self._retired = False
        self._ledger_flusher = gevent.spawn(self._flush_ledger_forever)
        self._heart = gevent.spawn(self._heartbeats)

    def new_client(self) -> gearman.Client:
        """A Gearman client for one connection's jobs."""
        return gearman.Client(self.config.gearman_servers, before_background=self.dashed.record)

    def authenticate(self, login: str | None, passcode: str | None) -> Principal | None:
        """Check a CONNECT's login in a thread (a hash costs ~0.05 s of CPU that
        must not stall every other connection); a refusal takes 0.2 s more."""
        if self.credentials.is_open:
            return self.credentials.authenticate(login, passcode)
        principal = gevent.get_hub().threadpool.apply(self.credentials.authenticate,
                                                      (login, passcode))
        if principal is None:
            gevent.sleep(0.2)
        return principal

    def record(self, event: str, subscriber: str, unique: str = "",
               redelivered: bool = False) -> None:
        """A ledger event; written with others every 0.2 s or 1,000 events."""
        self.ledger.record(event, subscriber, unique, redelivered)
        if self.ledger.buffered >= 1000 and not self._flush_soon:
            # Never write here: callers are in the middle of a dispatch, and a
            # Redis round trip would let another greenlet deliver (and reorder)
            # messages before this one is sent.
            self._flush_soon = True
            gevent.spawn(self.flush_ledger)

    def flush_ledger(self) -> None:
        self._flush_soon = False
        self.ledger.flush()

    def _heartbeats(self) -> None:
        """Tell the pool this bridge lives; if it stops, the pool's janitor
        removes its non-durable subscriptions and temp queues."""
        while True:
            try:
                self.liveness.heartbeat()
            except redis.RedisError as exc:
                log.warning("bridge heartbeat failed: %s", exc)
            gevent.sleep(self.config.heartbeat_interval)

    def retire(self) -> None:
        """A clean stop (after every session ended and cleaned up)."""
        self._heart.kill(block=False)
        self._retired = True
        self._ledger_flusher.join(timeout=5)  # lets a flush under way finish
        self.flush_ledger()  # the last deliveries and acks of the sessions just ended
        try:
            self.liveness.retire()
        except redis.RedisError as exc:
            log.warning("could not retire bridge %s: %s", self.bridge_id, exc)

    def _flush_ledger_forever(self) -> None:
        while not self._retired:
            gevent.sleep(0.2)
            self.flush_ledger()

    def attach(self, function: str, consumer: Consumer) -> QueueDispatcher:
        dispatcher = self.dispatchers.get(function)
        if dispatcher is None:
            dispatcher = QueueDispatcher(function, self.config.gearman_servers,
                                         f"gearhorn-bridge-{self.bridge_id}", self._drop,
                                         lookup=self.headers.for_uniques,
                                         dead_letter=self.dead_letter,
                                         max_deliveries=self.config.max_deliveries)
            self.dispatchers[function] = dispatcher
        dispatcher.add(consumer)
        return dispatcher

    def _drop(self, dispatcher: QueueDispatcher) -> None:
        if self.dispatchers.get(dispatcher.function) is dispatcher:
            del self.dispatchers[dispatcher.function]

    # -- sending -------------------------------------------------------------------

    def send_to_queue(self, client: gearman.Client, function: str,
                      bodies: Sequence[bytes], options: SendOptions = PLAIN) -> None:
        """Background jobs on ``function``, in order, in one pipelined write;
        returns once gearmand accepted them all (or, delayed, Redis kept them)."""
        if options.plain:
            client.submit_background([gearman.Copy(function, f"stomp:{uuid.uuid4().hex}", body)
                                      for body in bodies])
            return
        (body,) = bodies  # a SEND with options is never batched
        message_id = uuid.uuid4().hex
        unique = f"stomp:{message_id}"
        header_ids: tuple[str, ...] = ()
        if options.headers:
            self.headers.put(message_id, options.headers)
            unique, header_ids = copy_unique("", "q", message_id), (message_id,)
        if options.delay is not None:
            item = DelayedItem(time.time() + options.delay, (message_id,), (body,),
                               queue=function, unique=unique, priority=options.priority,
                               header_ids=header_ids)
            if self.scheduler.schedule(item):
                return
        client.submit_background([gearman.Copy(function, unique, body)], options.priority)

    def publish(self, client: gearman.Client, topic: str, bodies: Sequence[bytes],
                options: SendOptions = PLAIN) -> dict:
        """One ``fanout`` job for ``bodies`` (in order); returns once the copies are queued."""
        job: dict[str, object] = {"topic": topic, "background": True}
        try:
            texts = [body.decode("utf-8") for body in bodies]
            job.update({"payload": texts[0]} if len(texts) == 1 else {"payloads": texts})
        except UnicodeDecodeError:
            encoded = [base64.b64encode(body).decode() for body in bodies]
            job.update({"payload_base64": encoded[0]} if len(encoded) == 1
                       else {"payloads_base64": encoded})
        if options.priority != "normal":
            job["priority"] = options.priority
        if options.delay is not None:
            job["delay"] = options.delay
        if options.headers:
            job["headers"] = options.headers
        outcome = client.call("fanout", json.dumps(job).encode(), self.config.fanout_timeout,
                              options.priority)
        if not outcome.ok:
            raise FanoutFailed(f"fanout to {topic} failed: {outcome.reason}")
        return json.loads(outcome.data)

    def request(self, function: str, body: bytes, options: SendOptions,
                reply_queue: str, done: Callable[[], None] | None = None) -> None:
        """A SEND with ``reply-to: /temp-queue/...`` to ``/queue/Q``: a
        foreground job, so a Gearman worker of ``Q`` answers with its result;
        the result (or the failure) arrives on ``reply_queue`` with the
        request's correlation-id. A STOMP consumer of ``Q`` instead replies
        by SEND to the reply-to it received, and its ACK completes the job
        with an empty result, which is not forwarded. Returns once gearmand
        accepted the job."""
        message_id = uuid.uuid4().hex
        self.headers.put(message_id, options.headers)
        job = gearman.Copy(function, copy_unique("", "q", message_id), body)
        errors = []
        for host, port in self.config.gearman_servers:
            conn = gearman.Connection(host, port)
            try:
                conn.open()
                handles = conn.submit([job], background=False, precedence=options.priority)
            except gearman.GearmanError as exc:
                conn.close()
                errors.append(str(exc))
                continue
            gevent.spawn(self._forward_reply, conn, handles, reply_queue,
                         options.headers.get("correlation-id"), done)
            return
        raise gearman.Unavailable(f"no gearmand accepted the request: {'; '.join(errors)}")

    def _forward_reply(self, conn: gearman.Connection, handles: list[bytes], reply_queue: str,
                       correlation_id: str | None, done: Callable[[], None] | None) -> None:
        try:
            outcome = gearman.wait_for_results(conn, handles, self.config.request_timeout)[0]
        finally:
            conn.close()
            if done is not None:
                done()
        if outcome.ok and not outcome.data:
            return  # a STOMP service: it replied with a SEND of its own
        headers = {"gearman-status": outcome.status}
        if correlation_id is not None:
            headers["correlation-id"] = correlation_id
        if outcome.reason:
            headers["gearman-reason"] = outcome.reason
        try:
            if self.temp_queue_exists(reply_queue):  # else the requester left, and a
                self.send_own(reply_queue, outcome.data, headers)  # reply would sit forever
        except (gearman.GearmanError, redis.RedisError) as exc:
            log.warning("reply to %s lost: %s", reply_queue, exc)

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        """Move a message delivered ``max_deliveries`` times to ``<queue>.dlq``,
        with the reason and count; then complete the original job."""
        function = delivery.job.function
        kept = {k: v for k, v in delivery.headers.items() if k != "destination"}
        headers = {**kept, "dlq-reason": reason,
                   "dlq-delivery-count": str(delivery.deliveries),
                   "dlq-original-destination": f"/queue/{function}"}
        self.send_own(f"{function}.dlq", delivery.body, headers)
        log.info("%s: message %s dead-lettered after %d deliveries: %s", function,
                 delivery.job.unique, delivery.deliveries, reason)
        self.ledger.failed(f"dead-lettered: {reason}", subscriber=function,
                           unique=delivery.job.unique)
        delivery.worker.complete(delivery.job.handle)

    def send_own(self, function: str, body: bytes, headers: dict[str, str]) -> None:
        """A background job of the bridge's own, with headers (replies, dead letters)."""
        message_id = uuid.uuid4().hex
        self.headers.put(message_id, headers)
        with self._client_lock:
            self._client.submit_background(
                [gearman.Copy(function, copy_unique("", "q", message_id), body)])

    # -- topics ------------------------------------------------------------------

    def subscribe_topic(self, pattern: str, client_id: str, durable: bool = False) -> None:
        subscription = Subscription(validate_topic(pattern, allow_prefix=True), client_id)
        if not durable:  # listed first, so a crash right after leaves nothing unlisted
            self.liveness.holds(topic_entry(pattern, client_id))
        self.registry.subscribe(subscription)

    def unsubscribe_topic(self, pattern: str, client_id: str) -> None:
        self.registry.unsubscribe(Subscription(pattern, client_id))
        self.liveness.released(topic_entry(pattern, client_id))

    def temp_queue_opened(self, function: str) -> None:
        self.liveness.holds(queue_entry(function))

    def temp_queue_closed(self, function: str) -> None:
        self.liveness.released(queue_entry(function))

    def temp_queue_exists(self, function: str) -> bool:
        """Whether some bridge's connection holds this temp queue now."""
        return bool(self.registry.redis.sismember(self.registry.keys.temp_queues, function))

    def drop_queue(self, function: str) -> None:
        """Delete a queue nobody will read again (a non-durable subscription's)."""
        gearman.drop_function(self.config.gearman_servers, function)

    # -- control -----------------------------------------------------------------

    def count_messages(self, function: str) -> int:
        return sum(f.queued - f.running for f in self._status(function))

    def count_queue_subscribers(self, function: str) -> int:
        """Gearman workers of ``function``, counting this bridge's STOMP
        subscribers one by one instead of its own worker connections."""
        workers = sum(f.workers for f in self._status(function))
        dispatcher = self.dispatchers.get(function)
        if dispatcher is None:
            return workers
        return max(0, workers - dispatcher.connected) + len(dispatcher.consumers)

    def count_topic_subscribers(self, topic: str) -> int:
        return len(self.registry.subscribers(topic))

    def _status(self, function: str) -> list[gearman.FunctionStatus]:
        found = []
        for host, port in self.config.gearman_servers:
            found += [f for f in gearman.status(host, port) if f.name == function]
        return found
