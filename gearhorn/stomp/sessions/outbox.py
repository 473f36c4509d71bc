"""A connection's topic SENDs in flight, in order (runs under gevent).

Waiting for each fanout job's answer before reading the next SEND held a
producer to one message per gearmand and worker round trip (about 1.6 ms
on the benchmark machine): at 1,000 msg/s its messages queued behind each
other in the session. Here the session reads on while a job runs. Jobs
still go one at a time, in order, so every subscriber gets a producer's
messages in the order sent; the SENDs that arrived during a job leave
together as the next one (one job of up to ``MAX_BATCH`` messages).

On a topic with a history the bridge appends each SEND itself before its
job (if one is needed at all), so stream subscribers do not wait for any
job (docs/design/index.rst). The session has already handed the SEND to this
bridge's live subscribers (gearhorn/stomp/topics/streams.py). Mostly the append
is made at once, in the session, as the SEND is read. One case waits: a
SEND that was read alone, or with at most ``LINGER_MOST`` messages in all,
and that live subscribers here took early is appended by the outbox when
the connection's next SEND is read, or ``APPEND_LINGER`` later. The
bridge's bookkeeping (the append, the history read that follows, the
ledger) then runs after those subscribers
read their MESSAGEs, not beside them on the same two cores (issue 27:
0.1-0.9 ms off their p99 at 100 msg/s, docs/benchmarks.rst), and the next
SEND shares the append. Ending the linger there, rather than at a time
that falls anywhere between two SENDs, keeps the bookkeeping out of the
way of the SEND after (p99 at 1,000 msg/s 0.8 -> 0.6 ms). A few SENDs
read together (a producer at 2,350 msg/s writes two a millisecond) were
appended at once, in the session, and its next SENDs waited in the
socket for that round trip: lingering, p99 1.24 -> 0.77 ms. SENDs read
in larger batches (a busy producer) are appended at once: appending all
in the outbox measured 3-15% less topic x100 throughput. Appends keep the
order read: while the outbox holds a SEND not yet appended, those behind
it wait too.

RECEIPTs of these SENDs follow their append and job. Every other frame but
ACK and NACK waits for the outbox to empty first (:meth:`Outbox.flush`),
so a connection's frames still take effect in the order sent. A SEND whose
subscribers all read the history needs no job (``TopicSend.needs_job``):
it is answered once appended.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import gevent
import gevent.event

from gearhorn import gearman
from gearhorn.stomp.protocol.frames import Frame
from gearhorn.stomp.protocol.sendheaders import TopicSend
from gearhorn.stomp.sessions.backend import Publishes

# Messages an outbox holds before the session stops reading (TCP then
# holds the producer back).
MOST_HELD = 4000
# How long the append of a lone SEND waits when live subscribers here took it.
APPEND_LINGER = 0.002
# SENDs read together, up to this many, linger as a lone one does: a
# producer at a few thousand msg/s writes a few at a time, and appending
# them at once held its next SENDs back for the round trip.
LINGER_MOST = 4


class Outbox:
    """Topic SENDs of one connection whose fanout jobs are queued or running."""

    spawn = staticmethod(gevent.spawn)  # tests run it inline
    pause = staticmethod(gevent.event.Event.wait)  # (event, seconds); tests record it

    def __init__(self, publisher: Publishes, client: Callable[[], gearman.Client],
                 answered: Callable[[list[Frame], dict | None], None],
                 failed: Callable[[Frame, Exception], None], max_bytes: int,
                 most_held: int = MOST_HELD, linger: float = APPEND_LINGER) -> None:
        self.publisher, self.client = publisher, client
        self.answered, self.failed = answered, failed
        self.max_bytes, self.most_held, self.linger = max_bytes, most_held, linger
        self._queue: deque[tuple[TopicSend, list[Frame]]] = deque()
        self._held = 0  # messages queued or in the running job
        self._unappended = 0  # of those, messages the outbox is to append
        self._append_waits = False  # the next append waits for the next SEND, or APPEND_LINGER
        self._running = False
        self._broken = False
        self._next = gevent.event.Event()  # set by the SEND after a lingering one
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
            self.publisher.abandon(send)
            return
        self._next.set()  # a SEND behind a lingering one ends its linger
        if send.to_append:
            lingers = send.taken_early and len(send.bodies) <= LINGER_MOST and self.linger > 0
            if self._unappended or lingers:
                if not self._unappended:
                    self._next.clear()  # this one lingers, until the next
                self._unappended += len(send.bodies)
                self._append_waits = self._append_waits or lingers
            else:
                self.publisher.append(send)  # raises to the session, as a refused SEND
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
                if self._append_waits:  # a lone SEND's live readers are reading it
                    self._append_waits = False
                    self.pause(self._next, self.linger)  # the next SEND joins its append
                send, frames = self._queue.popleft()
                try:
                    if send.to_append:
                        self.publisher.append(send)
                        self._unappended -= len(send.bodies)
                    result = (self.publisher.start(self.client(), send).wait()
                              if send.needs_job else None)
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
        self._unappended = 0
        for send, _ in self._queue:
            self.publisher.abandon(send)
        self._queue.clear()
        self._room.set()
        self.failed(frame, exc)
