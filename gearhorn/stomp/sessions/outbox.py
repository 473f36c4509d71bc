"""A connection's topic SENDs in flight, in order (runs under gevent).

Why it is shaped so: docs/design/notes.rst, "gearhorn/stomp/sessions/outbox.py".
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
