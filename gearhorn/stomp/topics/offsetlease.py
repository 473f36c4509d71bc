"""A topic's pen on this bridge (runs under gevent): while the bridge holds
it, it gives its SENDs their offsets itself, so its stream readers have
each message, offset and all, before the append's round trip to Redis
(docs/design/realtime.rst, "Offsets given by the bridge"). Redis grants the pen
(lua/history_append.lua) to one caller at a time; the others' appends wait
until it is given back.

Why it is shaped so: docs/design/notes.rst, "gearhorn/stomp/topics/offsetlease.py".
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable

import gevent
import gevent.event

from gearhorn.store.history import LOST, Entry, History, PenArgs
from gearhorn.store.redisconn import REDIS_ERRORS

log = logging.getLogger(__name__)

# How long Redis grants a pen for (renewed by every write with it); the
# bridge stops giving offsets MARGIN before that, by its own clock.
PEN_MS = 5000
MARGIN = 1.0
# A pen nobody here wrote with for this long is given back: another
# caller (a worker's fanout, another bridge) waits at most about this long
# for it when this bridge has nothing more to write.
IDLE = 0.25
# After another caller waited for the pen, none is granted for this long.
CALM_MS = 5000
MOST_AT_ONCE = 1000  # messages a write carries
# What the pen gave is written this much later, or when the next SEND is
# given its offsets: the write and the Redis work it starts then run after
# the readers here read their MESSAGEs, not beside them on the same cores,
# and the next SEND shares the round trip (the outbox lingers as long:
# gearhorn/stomp/sessions/outbox.py).
LINGER = 0.002


class Ticket:
    """One SEND's part of a pen's writes: done once written (or failed)."""

    __slots__ = ("entries", "given", "event", "error", "needs_job")

    def __init__(self, entries: list[Entry], given: int) -> None:
        self.entries = entries
        self.given = given  # the first offset the pen gave them; 0: none
        self.event = gevent.event.Event()
        self.error: BaseException | None = None
        self.needs_job = True

    def wait(self) -> bool:
        """Whether a fanout job is needed; raises what the write raised."""
        self.event.wait()
        if self.error is not None:
            raise self.error
        return self.needs_job


# A write's look-up and append: (history plan's calls) -> (whether the topic
# has Gearman recipients, the replies of the calls).
LookUp = Callable[[list], tuple[bool, list]]
# Told of what a write appended: (topic, where, entries) for those the pen
# did not give (its readers got those already).
Appended = Callable[[str, tuple[str, int, int], list[Entry]], None]


class OffsetLease:
    """The pen of one topic, held by this bridge: its offsets, and the
    greenlet that writes what it gave."""

    def __init__(self, history: History, topic: str, caller: str, epoch: str, last: int,
                 look_up: LookUp, appended: Appended, ended: Callable[[OffsetLease], None],
                 granted_at: float) -> None:
        self.history, self.topic, self.caller = history, topic, caller
        self.epoch, self.last = epoch, last  # the last offset given (or written)
        self.look_up, self.appended, self.ended = look_up, appended, ended
        self.until = granted_at + PEN_MS / 1000 - MARGIN
        self.wanted = False  # another caller waits: give no more, give it back
        self.broken = False  # a write failed or lapsed: give no more
        self.reset_due = False  # a write failed: the next starts a new epoch
        self.closing = False  # given back (or broken): what is queued goes plainly
        self.unnumbered = 0  # SENDs queued or being written without offsets
        # Set once other callers may append again (given back, broken, ended):
        # this bridge's feed of the topic reads again (gearhorn/stomp/topics/feeds.py).
        self.released = gevent.event.Event()
        self.queue: collections.deque[Ticket] = collections.deque()
        self._more = gevent.event.Event()
        self.greenlet = gevent.spawn(self._run)

    def can_give(self) -> bool:
        """Whether the next offsets are this bridge's to give now: held,
        not wanted, and every SEND queued has its offset already."""
        return (not (self.wanted or self.broken or self.closing)
                and time.monotonic() < self.until and not self.unnumbered)

    def writes_alone(self) -> bool:
        """Whether no other caller can append to the topic now: held, within
        Redis's grant by this bridge's clock, neither given back nor broken."""
        return (not (self.broken or self.closing or self.released.is_set())
                and time.monotonic() < self.until)

    def give(self, count: int) -> tuple[str, int, int]:
        """Offsets for ``count`` messages, (epoch, first, last), to hand them
        to the readers with, then to :meth:`write` them with."""
        first = self.last + 1
        self.last += count
        return self.epoch, first, self.last

    def write(self, entries: list[Entry], given: int = 0) -> Ticket:
        """``entries`` written after every SEND queued before them."""
        ticket = Ticket(entries, given)
        if not given:
            self.unnumbered += 1  # until written, the next offset is Redis's to say
        self.queue.append(ticket)
        self._more.set()
        return ticket

    def finish(self) -> None:
        """Give no more offsets; write what was given, and give the pen back."""
        self.wanted = True
        self._more.set()

    def _run(self) -> None:
        try:
            while self.queue or not self.closing:
                if self.queue:
                    if self.queue[-1].given and not self.closing:
                        self._more.clear()
                        self._more.wait(LINGER)  # returns at the next SEND's offsets
                    self._write(self._batch())
                elif self.wanted or self.broken:
                    self._close()
                else:
                    self._more.clear()
                    if not self._more.wait(IDLE) and not self.queue:
                        self._close()
        except BaseException as exc:  # noqa: BLE001 - every waiting SEND is told
            self.broken = self.closing = True
            self._fail_all(exc)
            raise
        finally:
            self.released.set()
            self.ended(self)

    def _close(self) -> None:
        """Give no more offsets, and the pen back: what arrives meanwhile is
        written after, with offsets from Redis. A broken pen is not given
        back: the next append from here starts a new epoch (``reset_due``)."""
        self.closing = True
        self.released.set()
        if self.broken:
            return
        try:
            self.history.give_back(self.topic, self.caller, CALM_MS)
        except REDIS_ERRORS as exc:  # it lapses by itself; the next taker sees a new epoch
            log.warning("topic %s: giving the pen back failed: %s", self.topic, exc)

    def _batch(self) -> list[Ticket]:
        """The next tickets to write together: all given, in a row, or one not."""
        batch = [self.queue.popleft()]
        count = len(batch[0].entries)
        while (self.queue and batch[0].given and self.queue[0].given
               and count + len(self.queue[0].entries) <= MOST_AT_ONCE):
            count += len(self.queue[0].entries)
            batch.append(self.queue.popleft())
        return batch

    def _write(self, batch: list[Ticket]) -> None:
        entries = [entry for ticket in batch for entry in ticket.entries]
        given = -1 if self.reset_due else batch[0].given
        sent_at = time.monotonic()
        asked = 0 if self.wanted or self.broken or self.closing else PEN_MS
        try:
            plan = self.history.plan([(self.topic, entries)],
                                     pen=PenArgs(self.caller, given, asked))
            needs_job, replies = self.look_up(plan.calls)
            (where,) = plan.settle(replies)
            if where[1] == LOST:  # it lapsed, and another took it: a new epoch
                log.warning("topic %s: the bridge's pen lapsed; what it gave last is "
                            "written in a new epoch", self.topic)
                self.broken = True
                self.released.set()
                where = self.history.append([(self.topic, entries)])[0]
        except Exception as exc:  # noqa: BLE001 - told to every SEND waiting for it
            if not isinstance(exc, REDIS_ERRORS):
                log.exception("topic %s: writing what the pen gave failed", self.topic)
            # Its readers may have offsets Redis never got: a new epoch next.
            self.broken = self.reset_due = True
            self.released.set()
            for ticket in batch:
                self._done(ticket, exc)
            self._fail_all(exc)
            return
        self.reset_due = False
        state = plan.pens.get(self.topic, "")
        if state == "held":
            self.until = sent_at + PEN_MS / 1000 - MARGIN
        elif state == "wanted":
            self.wanted = True
        if given <= 0 or self.broken:  # its readers have not had these
            self.appended(self.topic, where, entries)
            if state and where[0] == self.epoch and where[2]:
                self.last = max(self.last, where[2])
        for ticket in batch:
            ticket.needs_job = needs_job
            self._done(ticket)

    def _fail_all(self, exc: BaseException) -> None:
        while self.queue:
            self._done(self.queue.popleft(), exc)

    def _done(self, ticket: Ticket, error: BaseException | None = None) -> None:
        if not ticket.given:
            self.unnumbered -= 1
        ticket.error = error
        ticket.event.set()
