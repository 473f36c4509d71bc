"""Which waiting message goes to which subscriber: pure, no I/O.

One :class:`Dispatch` per Gearman function a bridge serves: the messages
grabbed and waiting, the subscribers with their credit (prefetch left),
round-robin among them, and what a message's redelivery means (the
``redelivered`` flag, the delivery count, when it is exhausted). The
I/O around it (grabbing from gearmand, ack timers, completing jobs) is
:class:`gearhorn.stomp.queues.dispatchers.QueueDispatcher`'s; tests drive this one with
plain objects.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Protocol


class Taker(Protocol):
    """What a dispatch needs from a STOMP subscription."""

    ack_timeout: float | None

    def credit(self) -> int: ...


class Message(Protocol):
    """What a dispatch keeps of a message."""

    consumer: Taker | None
    redelivered: bool
    deliveries: int


class Dispatch:
    """Waiting messages and the subscribers they may go to.

    >>> class Sub:
    ...     ack_timeout = None
    ...     def __init__(self): self.held = 0
    ...     def credit(self): return 1 - self.held
    >>> class Msg:
    ...     consumer, redelivered, deliveries = None, False, 0
    >>> dispatch, a, b = Dispatch(), Sub(), Sub()
    >>> dispatch.add(a); dispatch.add(b)
    >>> dispatch.waiting.extend([Msg(), Msg(), Msg()])
    >>> for message, sub in dispatch.assignments():
    ...     sub.held += 1
    >>> (a.held, b.held, len(dispatch.waiting))
    (1, 1, 1)
    """

    def __init__(self, max_deliveries: int = 0) -> None:
        self.max_deliveries = max_deliveries  # 0: redeliver forever
        self.consumers: list[Taker] = []
        self.waiting: deque[Message] = deque()
        self._next = 0

    def add(self, consumer: Taker) -> None:
        self.consumers.append(consumer)

    def remove(self, consumer: Taker) -> None:
        if consumer in self.consumers:
            self.consumers.remove(consumer)

    def credit(self) -> int:
        """Messages the subscribers can take now, all together."""
        return sum(max(0, c.credit()) for c in self.consumers)

    def wanted(self) -> int:
        """How many more messages to grab: credit not met by waiting ones."""
        return self.credit() - len(self.waiting)

    def assignments(self, avoid: Taker | None = None) -> Iterator[tuple[Message, Taker]]:
        """Waiting messages with the subscriber each goes to, round-robin
        among those with credit, one at a time: the caller delivers each
        (which uses the credit) before asking for the next. ``avoid`` (the
        one that just gave a message back) gets one only if no other can."""
        while self.waiting:
            consumer = self._pick(avoid)
            if consumer is None:
                return
            message = self.waiting.popleft()
            message.consumer = consumer
            message.deliveries += 1
            yield message, consumer

    def _pick(self, avoid: Taker | None) -> Taker | None:
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

    def exhausted(self, message: Message) -> bool:
        """Delivered ``max_deliveries`` times already: dead-letter it."""
        return bool(self.max_deliveries) and message.deliveries >= self.max_deliveries

    def requeue(self, message: Message, front: bool = True) -> None:
        """Back in line (first, when given back); a message that had been
        delivered is ``redelivered`` from now on."""
        if message.consumer is not None:
            message.redelivered = True
        message.consumer = None
        if front:
            self.waiting.appendleft(message)
        else:
            self.waiting.append(message)

    def requeue_all(self, messages: list[Message]) -> None:
        """Several messages given back at once (a subscriber left): they go
        first, in the order they were delivered."""
        for message in reversed(messages):
            self.requeue(message, front=True)
