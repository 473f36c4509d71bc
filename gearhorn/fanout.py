"""The worker: ``subscribe_fanout``, ``unsubscribe_fanout``, ``fanout``.

:class:`FanoutService` is the logic (bytes in, JSON bytes out, BadRequest
for bad input); :class:`WorkerProcess` feeds it jobs from gearmand with
``gear.Worker`` and keeps this process's heartbeat and cache listener.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time

import gear

from gearhorn import gearman, redisconn
from gearhorn.background import Backoff, Outage
from gearhorn.cache import InvalidationListener, SubscriberCache
from gearhorn.config import Config
from gearhorn.delayed import DelayedItem, Releaser, Scheduler
from gearhorn.errors import GearhornError
from gearhorn.headers import HeaderStore
from gearhorn.janitor import Janitor
from gearhorn.keys import Keys
from gearhorn.ledger import Flusher, Ledger
from gearhorn.messages import (
    BadRequest,
    Fanout,
    copy_unique,
    header_id_for,
    message_ids_for,
    parse_fanout,
    parse_subscription,
)
from gearhorn.naming import delayed_unique
from gearhorn.redisconn import REDIS_ERRORS
from gearhorn.registry import Recipient, Registry, new_worker_id
from gearhorn.replay import DashedFunctions
from gearhorn.stats import Stats

log = logging.getLogger(__name__)

SUBSCRIBE = "subscribe_fanout"
SUBSCRIBE_ALIAS = "register_fanout_subscriber"
UNSUBSCRIBE = "unsubscribe_fanout"
FANOUT = "fanout"
FUNCTIONS = (SUBSCRIBE, SUBSCRIBE_ALIAS, UNSUBSCRIBE, FANOUT)


class Unavailable(GearhornError):
    """Redis or gearmand cannot take the request now; the message says which."""


def _dumps(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


class FanoutService:
    """What the Gearman functions do, independent of how jobs arrive."""

    def __init__(self, config: Config, registry: Registry, cache: SubscriberCache,
                 client: gearman.Client, ledger: Ledger | None = None,
                 sleep=time.sleep, stats: Stats | None = None) -> None:
        self.config = config
        self.registry = registry
        self.cache = cache
        self.client = client
        self.ledger = ledger
        self.stats = stats
        self.headers = HeaderStore(registry.redis, registry.keys, config.headers_ttl)
        self.scheduler = Scheduler(registry.redis, registry.keys, config.delay_shard_seconds,
                                   config.delay_lease, config.delay_lanes)
        self._sleep = sleep  # between retries of failed copies
        self._handlers = {SUBSCRIBE: self.subscribe, SUBSCRIBE_ALIAS: self.subscribe,
                          UNSUBSCRIBE: self.unsubscribe, FANOUT: self.fanout}

    def handle(self, function: str, data: bytes, job_unique: str = "",
               received: float | None = None) -> bytes:
        """Run one job; raises BadRequest (bad input) or Unavailable.

        ``job_unique`` is the Gearman unique key of the job, which makes a
        fanout's message ids the same each time the job runs; ``received``
        (``time.monotonic()``) is when it came, for the latency metric."""
        handler = self._handlers.get(function)
        if handler is None:  # looked up apart: a KeyError inside a handler is a bug
            raise BadRequest(f"unknown function {function!r}")
        try:
            if function == FANOUT:
                return self.fanout(data, job_unique, received)
            return handler(data)
        except REDIS_ERRORS as exc:
            raise Unavailable(f"registry unavailable (redis: {exc})") from None
        except gearman.GearmanError as exc:
            raise Unavailable(f"gearmand unavailable: {exc}") from None

    def subscribe(self, data: bytes) -> bytes:
        sub = parse_subscription(data)
        count = self.registry.subscribe(sub)
        return _dumps({"topic": sub.topic, "client_id": sub.client_id, "subscribers": count})

    def unsubscribe(self, data: bytes) -> bytes:
        sub = parse_subscription(data)
        count = self.registry.unsubscribe(sub)
        return _dumps({"topic": sub.topic, "client_id": sub.client_id, "subscribers": count})

    def fanout(self, data: bytes, job_unique: str = "", received: float | None = None) -> bytes:
        request = parse_fanout(data, self.config.max_payload_bytes)
        message_ids = message_ids_for(job_unique, len(request.bodies))
        header_ids = self._keep_headers(request, message_ids)
        if request.deliver_at is not None and self._schedule(request, message_ids, header_ids):
            return _dumps({"topic": request.topic, "copies": 0, "background": True,
                           "scheduled": True, "deliver_at": request.deliver_at,
                           **_ids(message_ids)})
        return _dumps(self.deliver(request, message_ids, header_ids, received))

    def _keep_headers(self, request: Fanout, message_ids: list[str],
                      needed: bool = False) -> list[str] | None:
        """Store the request's headers once per message (with the topic it was
        published to, for prefix subscribers); None without headers, unless
        ``needed``."""
        if not request.headers and not needed:
            return None
        headers = {**request.headers, "destination": f"/topic/{request.topic}"}
        header_ids = [header_id_for(m, request.unique) for m in message_ids]
        for header_id in header_ids:
            self.headers.put(header_id, headers)
        return header_ids

    def _schedule(self, request: Fanout, message_ids: list[str],
                  header_ids: list[str] | None) -> bool:
        """Keep a delayed fanout in Redis; False if it is due already by
        Redis's clock (the caller sends it now)."""
        item = DelayedItem(request.deliver_at, tuple(message_ids), request.bodies,
                           topic=request.topic, unique=request.unique,
                           priority=request.priority, header_ids=tuple(header_ids or ()))
        return self.scheduler.schedule(item)

    def release(self, item: DelayedItem) -> None:
        """Send a delayed message that is due (called by the worker's releaser)."""
        if item.queue:  # the bridge set its unique key (headers mark included)
            unique = item.unique or delayed_unique(item.message_ids[0])
            self.client.submit_background([gearman.Copy(item.queue, unique, item.bodies[0])],
                                          item.priority)
            return
        request = Fanout(item.topic, item.bodies, item.unique, True, item.priority)
        self.deliver(request, list(item.message_ids), list(item.header_ids) or None)

    def deliver(self, request: Fanout, message_ids: list[str],
                header_ids: list[str] | None = None,
                received: float | None = None) -> dict[str, object]:
        """Queue one copy of each message per subscriber; the fanout's result.
        Counted (gearhorn/stats.py) before the job is answered."""
        recipients = self.cache.recipients(request.topic)
        if header_ids is None and any(r.pattern is not None for r in recipients):
            # A prefix subscriber's STOMP MESSAGE names the topic published to,
            # which only the headers can carry.
            header_ids = self._keep_headers(request, message_ids, needed=True)
        copies = make_copies(request, message_ids, recipients, header_ids)
        result: dict[str, object] = {"topic": request.topic, "copies": len(copies),
                                     "background": request.background, **_ids(message_ids)}
        if request.background:
            self.client.submit_background(copies, request.priority)
            failed = []
        else:
            outcomes, attempts = self._run_copies(copies, request.priority)
            targets = recipients * len(request.bodies)
            failed = [({"client_id": r.client_id, "queue": r.queue, "status": o.status,
                        "reason": o.reason, "attempts": n}, c.unique)
                      for r, o, c, n in zip(targets, outcomes, copies, attempts, strict=True)
                      if not o.ok]
            result.update(completed=len(copies) - len(failed), failed=[f for f, _ in failed])
        self._record(request.topic, message_ids, copies, failed)
        if self.stats is not None:
            elapsed = None if received is None else time.monotonic() - received
            self.stats.fanout(request.topic, len(message_ids), len(copies), elapsed)
        return result

    def _run_copies(self, copies: list[gearman.Copy],
                    priority: str) -> tuple[list[gearman.Outcome], list[int]]:
        """Foreground copies; a copy whose receiver failed is tried again after
        a growing pause, up to ``max_deliveries`` times in all, within the
        fanout timeout. A late one is not: it is still queued."""
        deadline = time.monotonic() + self.config.fanout_timeout
        outcomes = self.client.submit_foreground(copies, self.config.fanout_timeout, priority)
        attempts = [1] * len(copies)
        backoff = Backoff(self.config.retry_backoff)
        for attempt in range(2, self.config.max_deliveries + 1):
            again = [i for i, o in enumerate(outcomes) if o.status == "failed"]
            left = deadline - time.monotonic()
            if not again or left <= backoff.pause:
                break
            self._sleep(backoff.failed())
            retried = self.client.submit_foreground(
                [copies[i] for i in again], deadline - time.monotonic(), priority)
            for i, outcome in zip(again, retried, strict=True):
                outcomes[i], attempts[i] = outcome, attempt
        return outcomes, attempts

    def _record(self, topic: str, message_ids: list[str], copies: list[gearman.Copy],
                failed: list[tuple[dict, str]]) -> None:
        """Ledger entries for a fanout (buffered; the ledger's flusher writes them)."""
        if self.ledger is None:
            return
        width = len(copies) // len(message_ids)
        for i, message_id in enumerate(message_ids):
            mine = copies[i * width:(i + 1) * width]
            self.ledger.published(topic, message_id, [(c.function, c.unique) for c in mine])
        for failure, unique in failed:
            self.ledger.failed(f"{failure['status']}: {failure['reason']}", topic,
                               failure["queue"], unique)

    def record_rejection(self, function: str, reason: str) -> None:
        if self.ledger is not None:
            self.ledger.failed(f"{function}: {reason}")


def make_copies(request: Fanout, message_ids: list[str], recipients: tuple[Recipient, ...],
                header_ids: list[str] | None = None) -> list[gearman.Copy]:
    """One Gearman job per message and recipient, each with its own unique key.

    Message by message, so every subscriber's queue receives them in order.
    """
    copies = []
    for i, (body, message_id) in enumerate(zip(request.bodies, message_ids, strict=True)):
        base = request.unique or message_id
        header_id = header_ids[i] if header_ids else None
        for r in recipients:
            who = r.client_id if r.pattern is None else f"{r.pattern}:{r.client_id}"
            copies.append(gearman.Copy(r.queue, copy_unique(base, who, header_id), body))
    return copies


def _ids(message_ids: list[str]) -> dict[str, object]:
    if len(message_ids) == 1:
        return {"message_id": message_ids[0]}
    return {"message_ids": message_ids}


class WorkerProcess:
    """One worker process: gets jobs from gearmand until told to stop."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.worker_id = new_worker_id()
        self.redis = redisconn.for_config(config, socket_timeout=10, socket_connect_timeout=5,
                                          health_check_interval=30)
        keys = Keys(config.key_prefix, config.matchmaking_channel)
        self.registry = Registry(self.redis, keys)
        self.cache = SubscriberCache(self.registry, config.cache_size)
        dashed = DashedFunctions(self.redis, keys)
        tls = config.gearman_tls
        self.client = gearman.Client(config.gearman_servers, batch=config.submit_batch,
                                     before_background=dashed.record, tls=tls)
        self.ledger = Ledger(self.redis, keys, config.ledger_maxlen, config.ledger_enabled,
                             source=self.worker_id, shards=config.ledger_shards)
        self.stats = Stats(self.redis, keys, config.metrics_enabled,
                           buffered=not config.metrics_write_through)
        self.service = FanoutService(config, self.registry, self.cache, self.client,
                                     self.ledger, stats=self.stats)
        self.flusher = Flusher(self.ledger, self.stats)
        # Due delayed messages go out from a thread of their own, with their
        # own Gearman connection (a Client is not shared between threads).
        self.release_client = gearman.Client(config.gearman_servers, batch=config.submit_batch,
                                             before_background=dashed.record, tls=tls)
        releasing = FanoutService(config, self.registry, self.cache, self.release_client,
                                  self.ledger, stats=self.stats)
        self.releaser = Releaser(releasing.scheduler, releasing.release,
                                 config.delay_poll_interval)
        self.listener = InvalidationListener(self.redis, keys.channel, self.cache)
        self.janitor = Janitor(self.registry, lambda function: gearman.drop_function(
            config.gearman_servers, function, tls))
        self.worker = gearman.NoDelayWorker(client_id=self.worker_id)
        self.jobs_done = 0
        self.started = time.time()
        self._draining = threading.Event()

    def run(self) -> None:
        """Serve jobs until :meth:`drain` is called; the job in hand is finished."""
        self.listener.start()
        self.flusher.start()
        self.releaser.start()
        threading.Thread(target=self._heartbeats, name="gearhorn-heartbeat", daemon=True).start()
        for host, port in self.config.gearman_servers:
            gearman.add_server(self.worker, host, port, self.config.gearman_tls)
        for name in FUNCTIONS:
            self.worker.registerFunction(name)
        log.info("worker %s serving %s on %s", self.worker_id, ", ".join(FUNCTIONS),
                 ", ".join(f"{h}:{p}" for h, p in self.config.gearman_servers))
        try:
            while not self._draining.is_set():
                try:
                    job = self.worker.getJob()
                except gear.InterruptedError:
                    continue
                self.serve(job)
        finally:
            self._shutdown()

    def serve(self, job: gear.WorkerJob) -> None:
        received = time.monotonic()
        unique = job.unique.decode("utf-8", "replace") if job.unique else ""
        try:
            result = self._handle_when_available(job, unique, received)
        except BadRequest as exc:
            self._fail(job, str(exc))
            self.service.record_rejection(job.name, str(exc))
        except Unavailable:
            return  # draining during an outage: gearmand requeues the job when we leave
        except Exception as exc:  # a bug must not kill the worker
            log.exception("job %s on %s failed", job.handle, job.name)
            self._fail(job, f"internal error: {type(exc).__name__}: {exc}")
        else:
            self._send(job.sendWorkComplete, result)
        self.jobs_done += 1

    def _handle_when_available(self, job: gear.WorkerJob, unique: str,
                               received: float) -> bytes:
        """Run the job; while Redis or gearmand is away, keep it and try again
        with a growing pause instead of failing it (a failed background job
        would be gone). The worker takes no other job meanwhile, so new work
        waits in gearmand. A foreground client gets one WORK_WARNING saying why."""
        backoff, warned, since = Backoff(0.2), False, time.monotonic()
        while True:
            try:
                result = self.service.handle(job.name, job.arguments, unique, received)
            except Unavailable as exc:
                if self._draining.is_set():
                    raise
                if not warned:
                    log.warning("%s job %s waits: %s; retrying with backoff", job.name,
                                job.handle, exc)
                    self._send(job.sendWorkWarning, f"{exc}; retrying".encode())
                    warned = True
                self._draining.wait(backoff.failed())
                continue
            if warned:
                log.info("%s job %s done after %.1fs of outage", job.name, job.handle,
                         time.monotonic() - since)
            return result

    def _fail(self, job: gear.WorkerJob, reason: str) -> None:
        # WARNING then FAIL: every client (the gearman CLI too) sees the reason;
        # WORK_EXCEPTION would end the job in gearmand (DESIGN.md).
        log.info("rejected %s job: %s", job.name, reason)
        self._send(job.sendWorkWarning, reason.encode())
        self._send(job.sendWorkFail)

    def _send(self, method, *args) -> None:
        try:
            method(*args)
        except Exception as exc:  # the gearmand connection went away; it requeues
            log.warning("could not answer gearmand: %s", exc)

    def drain(self) -> None:
        """Stop taking jobs; safe to call from a signal handler."""
        self._draining.set()
        # stopWaitingForJobs takes a lock getJob may hold: never in the handler.
        threading.Thread(target=self.worker.stopWaitingForJobs, daemon=True).start()

    def _heartbeats(self) -> None:
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": self.started}
        outage = Outage(log, "redis (heartbeat)")
        while not self._draining.is_set():
            try:
                self.registry.heartbeat(self.worker_id, self.config.worker_ttl,
                                        {**info, "jobs": self.jobs_done})
                self.janitor.sweep()  # after bridges that died without a word
                outage.succeeded()
            except REDIS_ERRORS as exc:
                outage.failed(exc)
            self._draining.wait(self.config.heartbeat_interval)

    def _shutdown(self) -> None:
        self.listener.stop()
        self.releaser.stop()
        self.releaser.join(timeout=10)
        self.flusher.stop()
        self.worker.shutdown()
        self.client.close()
        self.release_client.close()
        try:
            self.registry.retire(self.worker_id)
        except REDIS_ERRORS as exc:
            log.warning("could not retire %s: %s", self.worker_id, exc)
        log.info("worker %s stopped after %d jobs", self.worker_id, self.jobs_done)
