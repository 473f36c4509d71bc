"""Dead letters of the bridge's queues: a message delivered
``max_deliveries`` times moves to ``<queue>.dlq`` (runs under gevent)."""

from __future__ import annotations

import logging

from gearhorn.rules.naming import dead_letter_queue
from gearhorn.stomp.queues.dispatchers import Delivery
from gearhorn.stomp.queues.publisher import Publisher
from gearhorn.store.deadletters import DeadLetterIndex
from gearhorn.store.observers import Observer
from gearhorn.store.redisconn import REDIS_ERRORS

log = logging.getLogger(__name__)


class DeadLetterer:
    """Moves a message to its dead-letter queue, indexed and in the ledger."""

    def __init__(self, publisher: Publisher, index: DeadLetterIndex,
                 observer: Observer) -> None:
        self.publisher = publisher
        self.index = index
        self.observer = observer

    def __call__(self, delivery: Delivery, reason: str) -> None:
        """Queue the copy with the reason and count; then complete the original job."""
        function = delivery.job.function
        kept = {k: v for k, v in delivery.headers.items() if k != "destination"}
        headers = {**kept, "dlq-reason": reason,
                   "dlq-delivery-count": str(delivery.deliveries),
                   "dlq-original-destination": f"/queue/{function}"}
        header_id = self.publisher.send_own(dead_letter_queue(function), delivery.body, headers)
        try:
            self.index.record(function, header_id, reason, delivery.deliveries, delivery.body)
        except REDIS_ERRORS as exc:  # the dead letter is queued: only the index missed
            log.warning("%s: dead letter %s not indexed: %s", function, header_id, exc)
        log.info("%s: message %s dead-lettered after %d deliveries: %s", function,
                 delivery.unique, delivery.deliveries, reason)
        self.observer.dead_lettered(function, delivery.unique, reason)
        delivery.worker.complete(delivery.job.handle)
