"""What the STOMP sessions of one bridge share (runs under gevent): the
Gearman and Redis side of sending, publishing, requests and replies, dead
letters, temp queues, topic subscriptions, the ledger and the bridge's
heartbeats. Queues live in :mod:`gearhorn.stomp.queues`.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence

import gevent
import gevent.event
import gevent.lock

from gearhorn import gearman
from gearhorn.background import Outage
from gearhorn.config import Config
from gearhorn.errors import GearhornError
from gearhorn.limits import Limits
from gearhorn.messages import Subscription, validate_topic
from gearhorn.naming import dead_letter_queue, queue_copy_unique, stomp_unique
from gearhorn.stomp.auth import Credentials, Principal
from gearhorn.stomp.bounds import QueueBounds
from gearhorn.stomp.giveback import GiveBack
from gearhorn.stomp.queues import Delivery, QueueConsumer, QueueDispatcher
from gearhorn.stomp.sending import PLAIN, SendOptions
from gearhorn.store.deadletters import DeadLetterIndex
from gearhorn.store.handouts import Handouts
from gearhorn.store.headers import HeaderStore
from gearhorn.store.ledger import Ledger
from gearhorn.store.redisconn import REDIS_ERRORS
from gearhorn.store.registry import Registry
from gearhorn.store.stats import Stats
from gearhorn.worker.delayed import DelayedItem, Scheduler
from gearhorn.worker.janitor import BridgeLiveness, queue_entry, topic_entry
from gearhorn.worker.replay import DashedFunctions

log = logging.getLogger(__name__)



class FanoutFailed(GearhornError):
    """A fanout job the bridge submitted failed or timed out (not the
    client's fault: its request was valid); the message says why."""

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
                             config.ledger_enabled, source=f"bridge-{bridge_id}",
                             shards=config.ledger_shards)
        self.headers = HeaderStore(registry.redis, registry.keys, config.headers_ttl)
        self.scheduler = Scheduler(registry.redis, registry.keys, config.delay_shard_seconds,
                                   config.delay_lease, config.delay_lanes)
        # The bridge's own jobs (dead letters, replies) share one client, one at a time.
        self.dashed = DashedFunctions(registry.redis, registry.keys)
        self.handouts = Handouts(registry.redis, registry.keys, config.headers_ttl)
        self.bounds = QueueBounds(registry)  # x-max-length on /queue/ (stomp/bounds.py)
        self.give_back = GiveBack(self.handouts, config.gearman_tls, self.dashed.record)
        # Queues whose held messages a closed dispatcher is giving back: a new
        # dispatcher of the same queue grabs only after that.
        self._releasing: dict[str, gevent.Greenlet] = {}
        self._client = self.new_client()
        self._client_lock = gevent.lock.Semaphore()
        # Five times a worker's: the janitor removes a bridge's subscriptions
        # only when it is surely dead, not merely busy for a few seconds.
        self.liveness = BridgeLiveness(registry, bridge_id, 5 * config.worker_ttl)
        self.dead_letters = DeadLetterIndex(registry.redis, registry.keys,
                                            Stats(registry.redis, registry.keys,
                                                  config.metrics_enabled))
        # What the heartbeat tells the console (the server sets it: connections).
        self.describe: Callable[[], dict[str, object]] = dict
        self._flush_soon = False
        self._retired = False
        self._ledger_flusher: gevent.Greenlet | None = None
        self._heart: gevent.Greenlet | None = None

    def start(self) -> None:
        """Start the background work: heartbeats and the ledger's flusher
        (called by the composition root, gearhorn/stomp/app.py)."""
        self._ledger_flusher = gevent.spawn(self._flush_ledger_forever)
        self._heart = gevent.spawn(self._heartbeats)

    def new_client(self) -> gearman.Client:
        """A Gearman client for one connection's jobs."""
        return gearman.Client(self.config.gearman_servers, before_background=self.dashed.record,
                              tls=self.config.gearman_tls)

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
        self.bounds.flush()

    def _heartbeats(self) -> None:
        """Tell the pool this bridge lives; if it stops, the pool's janitor
        removes its non-durable subscriptions and temp queues."""
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        outage = Outage(log, "redis (bridge heartbeat)")
        while True:
            try:
                self.liveness.heartbeat()
                self._publish_info(info)
                outage.succeeded()
            except REDIS_ERRORS as exc:
                outage.failed(exc)
            gevent.sleep(self.config.heartbeat_interval)

    def _publish_info(self, info: dict[str, object]) -> None:
        self.liveness.liveness.tell(self.bridge_id, {**info, **self.describe()},
                                    self.liveness.ttl)

    def retire(self) -> None:
        """A clean stop (after every session ended and cleaned up)."""
        if self._heart is not None:
            self._heart.kill(block=False)
        self._retired = True
        gevent.joinall(list(self._releasing.values()), timeout=10)
        if self._ledger_flusher is not None:
            self._ledger_flusher.join(timeout=5)  # lets a flush under way finish
        self.flush_ledger()  # the last deliveries and acks of the sessions just ended
        try:
            self.liveness.retire()
        except REDIS_ERRORS as exc:
            log.warning("could not retire bridge %s: %s", self.bridge_id, exc)

    def _flush_ledger_forever(self) -> None:
        while not self._retired:
            gevent.sleep(0.2)
            self.flush_ledger()

    def attach(self, function: str, consumer: QueueConsumer,
               shared: bool = True) -> QueueDispatcher:
        """``consumer`` takes messages of ``function`` from now on. ``shared``:
        others may read the queue too (``/queue/``, durable subscriptions), so
        hand-outs are counted across bridges and held messages given back in
        order; a connection's private queue needs neither."""
        dispatcher = self.dispatchers.get(function)
        if dispatcher is None:
            dispatcher = QueueDispatcher(function, self.config.gearman_servers,
                                         f"gearhorn-bridge-{self.bridge_id}", self._drop,
                                         lookup=self.headers.for_uniques,
                                         dead_letter=self.dead_letter,
                                         max_deliveries=self.config.max_deliveries,
                                         tls=self.config.gearman_tls,
                                         handouts=self.handouts if shared else None,
                                         give_back=self.give_back,
                                         after=self._releasing.get(function))
            self.dispatchers[function] = dispatcher
            dispatcher.start()
        dispatcher.add(consumer)
        return dispatcher

    def _drop(self, dispatcher: QueueDispatcher) -> None:
        function, released = dispatcher.function, dispatcher.released
        if self.dispatchers.get(function) is dispatcher:
            del self.dispatchers[function]
        if released is not None:
            self._releasing[function] = released
            released.link(lambda done: self._released(function, done))

    def _released(self, function: str, greenlet: gevent.Greenlet) -> None:
        if self._releasing.get(function) is greenlet:
            del self._releasing[function]

    # -- sending -------------------------------------------------------------------

    def send_to_queue(self, client: gearman.Client, function: str,
                      bodies: Sequence[bytes], options: SendOptions = PLAIN) -> None:
        """Background jobs on ``function``, in order, in one pipelined write;
        returns once gearmand accepted them all (or, delayed, Redis kept them)."""
        self.bounds.admit(function)
        if options.plain:
            copies = [gearman.Copy(function, stomp_unique(uuid.uuid4().hex), body)
                      for body in bodies]
            client.submit_background(copies)
            self.bounds.sent(copies)
            return
        (body,) = bodies  # a SEND with options is never batched
        message_id = uuid.uuid4().hex
        unique = stomp_unique(message_id)
        header_ids: tuple[str, ...] = ()
        if options.headers:
            self.headers.put(message_id, options.headers)
            unique, header_ids = queue_copy_unique(message_id), (message_id,)
        if options.delay is not None:
            item = DelayedItem(time.time() + options.delay, (message_id,), (body,),
                               queue=function, unique=unique, priority=options.priority,
                               header_ids=header_ids)
            if self.scheduler.schedule(item):
                return
        copies = [gearman.Copy(function, unique, body)]
        client.submit_background(copies, options.priority)
        self.bounds.sent(copies)

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
        job = gearman.Copy(function, queue_copy_unique(message_id), body)
        # A client of its own: the answer may take request_timeout to come,
        # and arrives on the connection that submitted the job.
        client = self.new_client()
        try:
            placed = client.start_foreground([job], options.priority)
        except gearman.GearmanError:
            client.close()
            raise
        gevent.spawn(self._forward_reply, client, placed, reply_queue,
                     options.headers.get("correlation-id"), done)

    def _forward_reply(self, client: gearman.Client, placed: gearman.Placed, reply_queue: str,
                       correlation_id: str | None, done: Callable[[], None] | None) -> None:
        try:
            (outcome,) = placed.wait(self.config.request_timeout)
        finally:
            client.close()
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
        except (gearman.GearmanError, *REDIS_ERRORS) as exc:
            log.warning("reply to %s lost: %s", reply_queue, exc)

    def dead_letter(self, delivery: Delivery, reason: str) -> None:
        """Move a message delivered ``max_deliveries`` times to ``<queue>.dlq``,
        with the reason and count; then complete the original job."""
        function = delivery.job.function
        kept = {k: v for k, v in delivery.headers.items() if k != "destination"}
        headers = {**kept, "dlq-reason": reason,
                   "dlq-delivery-count": str(delivery.deliveries),
                   "dlq-original-destination": f"/queue/{function}"}
        queue = dead_letter_queue(function)
        header_id = self.send_own(queue, delivery.body, headers)
        try:
            self.dead_letters.record(function, header_id, reason, delivery.deliveries,
                                     delivery.body)
        except REDIS_ERRORS as exc:  # the dead letter is queued: only the index missed
            log.warning("%s: dead letter %s not indexed: %s", function, header_id, exc)
        log.info("%s: message %s dead-lettered after %d deliveries: %s", function,
                 delivery.unique, delivery.deliveries, reason)
        self.ledger.failed(f"dead-lettered: {reason}", subscriber=function,
                           unique=delivery.unique)
        delivery.worker.complete(delivery.job.handle)

    def send_own(self, function: str, body: bytes, headers: dict[str, str]) -> str:
        """A background job of the bridge's own, with headers (replies, dead
        letters); returns its header id."""
        message_id = uuid.uuid4().hex
        self.headers.put(message_id, headers)
        with self._client_lock:
            self._client.submit_background(
                [gearman.Copy(function, queue_copy_unique(message_id), body)])
        return message_id

    # -- topics ------------------------------------------------------------------

    def bound_queue(self, function: str, limits: Limits) -> None:
        self.bounds.limit(function, limits)

    def subscribe_topic(self, pattern: str, client_id: str, durable: bool = False,
                        limits: Limits | None = None) -> None:
        subscription = Subscription(validate_topic(pattern, allow_prefix=True), client_id,
                                    limits)
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
        gearman.drop_function(self.config.gearman_servers, function, self.config.gearman_tls)

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
            found += [f for f in gearman.status(host, port, tls=self.config.gearman_tls)
                      if f.name == function]
        return found
