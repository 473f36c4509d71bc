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
import redis

from gearhorn import gearman
from gearhorn.cache import InvalidationListener, SubscriberCache
from gearhorn.config import Config
from gearhorn.keys import Keys
from gearhorn.ledger import Flusher, Ledger
from gearhorn.messages import (
    BadRequest,
    Fanout,
    copy_unique,
    new_message_id,
    parse_fanout,
    parse_subscription,
)
from gearhorn.registry import Recipient, Registry, new_worker_id

log = logging.getLogger(__name__)

SUBSCRIBE = "subscribe_fanout"
SUBSCRIBE_ALIAS = "register_fanout_subscriber"
UNSUBSCRIBE = "unsubscribe_fanout"
FANOUT = "fanout"
FUNCTIONS = (SUBSCRIBE, SUBSCRIBE_ALIAS, UNSUBSCRIBE, FANOUT)


class Unavailable(Exception):
    """Redis or gearmand cannot take the request now; the message says which."""


def _dumps(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


class FanoutService:
    """What the Gearman functions do, independent of how jobs arrive."""

    def __init__(self, config: Config, registry: Registry, cache: SubscriberCache,
                 client: gearman.Client, ledger: Ledger | None = None) -> None:
        self.config = config
        self.registry = registry
        self.cache = cache
        self.client = client
        self.ledger = ledger
        self._handlers = {SUBSCRIBE: self.subscribe, SUBSCRIBE_ALIAS: self.subscribe,
                          UNSUBSCRIBE: self.unsubscribe, FANOUT: self.fanout}

    def handle(self, function: str, data: bytes) -> bytes:
        """Run one job; raises BadRequest (bad input) or Unavailable."""
        try:
            return self._handlers[function](data)
        except KeyError:
            raise BadRequest(f"unknown function {function!r}") from None
        except redis.RedisError as exc:
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

    def fanout(self, data: bytes) -> bytes:
        request = parse_fanout(data, self.config.max_payload_bytes)
        message_ids = [new_message_id() for _ in request.bodies]
        recipients = self.cache.recipients(request.topic)
        copies = make_copies(request, message_ids, recipients)
        result: dict[str, object] = {"topic": request.topic, "copies": len(copies),
                                     "background": request.background}
        if len(message_ids) == 1:
            result["message_id"] = message_ids[0]
        else:
            result["message_ids"] = message_ids
        if request.background:
            self.client.submit_background(copies)
            failed = []
        else:
            outcomes = self.client.submit_foreground(copies, self.config.fanout_timeout)
            targets = recipients * len(request.bodies)
            failed = [({"client_id": r.client_id, "queue": r.queue, "status": o.status,
                        "reason": o.reason}, c.unique)
                      for r, o, c in zip(targets, outcomes, copies, strict=True) if not o.ok]
            result.update(completed=len(copies) - len(failed), failed=[f for f, _ in failed])
        self._record(request.topic, message_ids, copies, failed)
        return _dumps(result)

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


def make_copies(request: Fanout, message_ids: list[str],
                recipients: tuple[Recipient, ...]) -> list[gearman.Copy]:
    """One Gearman job per message and recipient, each with its own unique key.

    Message by message, so every subscriber's queue receives them in order.
    """
    copies = []
    for body, message_id in zip(request.bodies, message_ids, strict=True):
        base = request.unique or message_id
        for r in recipients:
            who = r.client_id if r.pattern is None else f"{r.pattern}:{r.client_id}"
            copies.append(gearman.Copy(r.queue, copy_unique(base, who), body))
    return copies


class WorkerProcess:
    """One worker process: gets jobs from gearmand until told to stop."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.worker_id = new_worker_id()
        self.redis = redis.Redis.from_url(config.redis_url, socket_timeout=10,
                                          socket_connect_timeout=5, health_check_interval=30)
        keys = Keys(config.key_prefix, config.matchmaking_channel)
        self.registry = Registry(self.redis, keys)
        self.cache = SubscriberCache(self.registry, config.cache_size)
        self.client = gearman.Client(config.gearman_servers, batch=config.submit_batch)
        self.ledger = Ledger(self.redis, keys, config.ledger_maxlen, config.ledger_enabled,
                             source=self.worker_id)
        self.service = FanoutService(config, self.registry, self.cache, self.client,
                                     self.ledger)
        self.flusher = Flusher(self.ledger)
        self.listener = InvalidationListener(self.redis, keys.channel, self.cache)
        self.worker = gearman.NoDelayWorker(client_id=self.worker_id)
        self.jobs_done = 0
        self.started = time.time()
        self._draining = threading.Event()

    def run(self) -> None:
        """Serve jobs until :meth:`drain` is called; the job in hand is finished."""
        self.listener.start()
        self.flusher.start()
        threading.Thread(target=self._heartbeats, name="gearhorn-heartbeat", daemon=True).start()
        for host, port in self.config.gearman_servers:
            self.worker.addServer(host, port)
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
        try:
            result = self.service.handle(job.name, job.arguments)
        except (BadRequest, Unavailable) as exc:
            self._fail(job, str(exc))
            self.service.record_rejection(job.name, str(exc))
        except Exception as exc:  # a bug must not kill the worker
            log.exception("job %s on %s failed", job.handle, job.name)
            self._fail(job, f"internal error: {type(exc).__name__}: {exc}")
        else:
            self._send(job.sendWorkComplete, result)
        self.jobs_done += 1

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
        while not self._draining.is_set():
            try:
                self.registry.heartbeat(self.worker_id, self.config.worker_ttl,
                                        {**info, "jobs": self.jobs_done})
            except redis.RedisError as exc:
                log.warning("heartbeat failed: %s", exc)
            self._draining.wait(self.config.heartbeat_interval)

    def _shutdown(self) -> None:
        self.listener.stop()
        self.flusher.stop()
        self.worker.shutdown()
        self.client.close()
        try:
            self.registry.retire(self.worker_id)
        except redis.RedisError as exc:
            log.warning("could not retire %s: %s", self.worker_id, exc)
        log.info("worker %s stopped after %d jobs", self.worker_id, self.jobs_done)
