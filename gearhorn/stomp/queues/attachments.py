"""The bridge's queue dispatchers, one per Gearman function read here
(runs under gevent): subscriptions attach to them, and a dispatcher goes
when its last subscription leaves."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import gevent

from gearhorn import gearman
from gearhorn.rules.limits import Limits
from gearhorn.stomp.queues.bounds import QueueBounds
from gearhorn.stomp.queues.dispatchers import Delivery, QueueConsumer, QueueDispatcher
from gearhorn.stomp.queues.giveback import GiveBack
from gearhorn.store.redeliveries import Redeliveries


class Attachments:
    """Which dispatcher reads which queue, and the queues' bounds."""

    def __init__(self, servers: Sequence[tuple[str, int]], tls: gearman.TlsFiles | None,
                 bridge_id: str, *,
                 headers_of: Callable[[list[str]], dict[str, dict[str, str]]],
                 dead_letter: Callable[[Delivery, str], None], max_deliveries: int,
                 handouts: Redeliveries, give_back: GiveBack, bounds: QueueBounds) -> None:
        self.servers, self.tls = tuple(servers), tls
        self.client_id = f"gearhorn-bridge-{bridge_id}"
        self.headers_of = headers_of
        self.dead_letter = dead_letter
        self.max_deliveries = max_deliveries
        self.handouts = handouts
        self.give_back = give_back
        self.bounds = bounds  # x-max-length on /queue/ (stomp/queues/bounds.py)
        self.dispatchers: dict[str, QueueDispatcher] = {}
        # Queues whose held messages a closed dispatcher is giving back: a new
        # dispatcher of the same queue grabs only after that.
        self._releasing: dict[str, gevent.Greenlet] = {}

    def attach(self, function: str, consumer: QueueConsumer,
               shared: bool = True) -> QueueDispatcher:
        """``consumer`` takes messages of ``function`` from now on. ``shared``:
        others may read the queue too (``/queue/``, durable subscriptions), so
        hand-outs are counted across bridges and held messages given back in
        order; a connection's private queue needs neither."""
        dispatcher = self.dispatchers.get(function)
        if dispatcher is None:
            dispatcher = QueueDispatcher(function, self.servers, self.client_id, self._drop,
                                         lookup=self.headers_of, dead_letter=self.dead_letter,
                                         max_deliveries=self.max_deliveries, tls=self.tls,
                                         handouts=self.handouts if shared else None,
                                         give_back=self.give_back,
                                         after=self._releasing.get(function))
            self.dispatchers[function] = dispatcher
            dispatcher.start()
        dispatcher.add(consumer)
        return dispatcher

    def bound_queue(self, function: str, limits: Limits) -> None:
        self.bounds.limit(function, limits)

    def drop_queue(self, function: str) -> None:
        """Delete a queue nobody will read again (a non-durable subscription's)."""
        gearman.drop_function(self.servers, function, self.tls)

    def wait_released(self, timeout: float = 10) -> None:
        """Wait for closed dispatchers to give back what they held (at a stop)."""
        gevent.joinall(list(self._releasing.values()), timeout=timeout)

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
