"""Request and reply over STOMP (runs under gevent): a SEND to ``/queue/Q``
with ``reply-to: /temp-queue/...`` is a foreground Gearman job, and its
result comes back on the requester's temp queue."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

import gevent

from gearhorn import gearman
from gearhorn.rules.naming import queue_copy_unique
from gearhorn.stomp.protocol.sendheaders import SendOptions
from gearhorn.stomp.queues.publisher import Publisher
from gearhorn.stomp.queues.registrations import Registrations
from gearhorn.store.headers import HeaderStore
from gearhorn.store.redisconn import REDIS_ERRORS

log = logging.getLogger(__name__)


class Requester:
    """Submits requests and forwards their answers."""

    def __init__(self, publisher: Publisher, headers: HeaderStore,
                 registrations: Registrations, timeout: float) -> None:
        self.publisher = publisher
        self.headers = headers
        self.registrations = registrations
        self.timeout = timeout

    def request(self, function: str, body: bytes, options: SendOptions,
                reply_queue: str, done: Callable[[], None] | None = None) -> None:
        """A foreground job, so a Gearman worker of ``function`` answers with
        its result; the result (or the failure) arrives on ``reply_queue``
        with the request's correlation-id. A STOMP consumer of the queue
        instead replies by SEND to the reply-to it received, and its ACK
        completes the job with an empty result, which is not forwarded.
        Returns once gearmand accepted the job."""
        message_id = uuid.uuid4().hex
        self.headers.put(message_id, options.headers)
        job = gearman.Copy(function, queue_copy_unique(message_id), body)
        # A client of its own: the answer may take the timeout to come, and
        # arrives on the connection that submitted the job.
        client = self.publisher.new_client()
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
            (outcome,) = placed.wait(self.timeout)
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
            if self.registrations.temp_queue_exists(reply_queue):  # else the requester
                self.publisher.send_own(reply_queue, outcome.data, headers)  # left
        except (gearman.GearmanError, *REDIS_ERRORS) as exc:
            log.warning("reply to %s lost: %s", reply_queue, exc)
