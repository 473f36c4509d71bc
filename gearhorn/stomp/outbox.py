"""A connection's topic SENDs in flight, in order (runs under gevent).

Waiting for each fanout job's answer before reading the next SEND held a
producer to one message per gearmand and worker round trip (about 1.6 ms
on the benchmark machine): at 1,000 msg/s its messages queued behind each
other in the session. Here the session reads on while a job runs. Jobs
still go one at a time, in order, so every subscriber gets a producer's
messages in the order sent; the SENDs that arrived during a job leave
together as the next one (one job of up to ``MAX_BATCH`` messages). On a
topic with a history the session has appended each SEND before it got
here, so stream subscribers do not wait for any job (docs/design.rst).

RECEIPTs of these SENDs follow their job's answer, as before. Every other
frame but ACK and NACK waits for the outbox to empty first
(:meth:`Outbox.flush`), so a connection's frames still take effect in the
order sent. A SEND whose subscribers all read the history needs no job
(``TopicSend.needs_job``): it is answered in its turn.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import gevent
import gevent.event

from gearhorn import gearman
from gearhorn.stomp.backend import Publishes
from gearhorn.stomp.frames import Frame
from gearhorn.stomp.sending import TopicSend

# Messages an outbox holds before the session stops reading (TCP then
# holds the producer back).
MOST_HELD = 4000


class Outbox:
    """Topic SENDs of one connection whose fanout jobs are queued or running."""

    spawn = staticmethod(gevent.spawn)  # tests run it inline

    def __init__(self, publisher: Publishes, client: Callable[[], gearman.Client],
                 answered: Callable[[list[Frame], dict], None],
                 failed: Callable[[Frame, Exception], None], max_bytes: int,
                 most_held: int = MOST_HELD) -> None:
        self.publisher, self.client = publisher, client
        self.answered, self.failed = answered, failed
        self.max_bytes, self.most_held = max_bytes, most_held
        self._queue: deque[tuple[TopicSend, list[Frame]]] = deque()
        self._held = 0  # messages queued or in the running job
        self._running = False
        self._broken = False
        self._idle = gevent.event.Event()
        self._idle.set()
        self._room = gevent.event.Event()
        self._room.set()

    @property
    def busy(self) -> bool:
        return not self._idle.is_set()

    def put(self, send: TopicSend, frames: list[Frame]) -> None:
        """Queue ``send`` (the messages of ``frames``) behind the jobs before it;
        waits while the outbox is full."""
        while self._held >= self.most_held and not self._broken:
            self._room.clear()
            self._room.wait()
        if self._broken:
            return
        self._held += len(send.bodies)
        if self._queue and self._queue[-1][0].take(send, self.max_bytes):
            self._queue[-1][1].extend(frames)
        else:
            self._queue.append((send, list(frames)))
        self._idle.clear()
        if not self._running:
            self._running = True
            self.spawn(self._run)

    def flush(self) -> None:
        """Return once every job is answered (or the outbox failed)."""
        self._idle.wait()

    def _run(self) -> None:
        try:
            while self._queue and not self._broken:
                send, frames = self._queue.popleft()
                try:
                    result = (self.publisher.start(self.client(), send).wait()
                              if send.needs_job else {})
                except Exception as exc:  # noqa: BLE001 - told to the session, whatever it is
                    self._fail(frames[0], exc)
                    return
                self._held -= len(send.bodies)
                self._room.set()
                self.answered(frames, result)
        finally:
            self._running = False
            self._idle.set()

    def _fail(self, frame: Frame, exc: Exception) -> None:
        """A job failed: the connection ends there. The SENDs behind it are
        dropped unanswered (their producer gets no RECEIPT for them)."""
        self._broken = True
        self._queue.clear()
        self._room.set()
        self.failed(frame, exc)
