"""``/control/`` destinations' answers: messages waiting in a queue and
subscribers of a queue or topic, from gearmand's status and the registry."""

from __future__ import annotations

from gearhorn import gearman
from gearhorn.stomp.protocol.rules import Destination
from gearhorn.stomp.queues.attachments import Attachments
from gearhorn.store.registry import Registry


class QueueCounts:
    """Counts as a STOMP client asks for them."""

    def __init__(self, attachments: Attachments, registry: Registry) -> None:
        self.attachments = attachments
        self.registry = registry

    def answer(self, dest: Destination) -> dict[str, str]:
        """The RECEIPT headers of a SEND to ``/control/<count>/<kind>/<name>``."""
        if dest.control == "count-msgs":
            return {"num-messages": str(self.count_messages(dest.name))}
        if dest.target == "queue":
            return {"num-subscribers": str(self.count_queue_subscribers(dest.name))}
        return {"num-subscribers": str(self.count_topic_subscribers(dest.name))}

    def count_messages(self, function: str) -> int:
        found = self._status(function)
        return found.queued - found.running if found else 0

    def count_queue_subscribers(self, function: str) -> int:
        """Gearman workers of ``function``, counting this bridge's STOMP
        subscribers one by one instead of its own worker connections."""
        found = self._status(function)
        workers = found.workers if found else 0
        dispatcher = self.attachments.dispatchers.get(function)
        if dispatcher is None:
            return workers
        return max(0, workers - dispatcher.connected) + len(dispatcher.consumers)

    def count_topic_subscribers(self, topic: str) -> int:
        return len(self.registry.subscribers(topic))

    def _status(self, function: str) -> gearman.FunctionStatus | None:
        return gearman.totals(self.attachments.servers, self.attachments.tls).get(function)
