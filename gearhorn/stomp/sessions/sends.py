"""A session's SENDs: to a queue (background jobs), a topic (through the
outbox), a ``/control/`` destination, or a request with ``reply-to``; and
when their RECEIPTs may go (after an fsync that covers them,
docs/reliability.rst)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from gearhorn import gearman
from gearhorn.errors import BadRequest
from gearhorn.rules.auth import Principal
from gearhorn.rules.messages import DEDUP_HEADER
from gearhorn.rules.naming import TEMP_FUNCTION_PREFIX
from gearhorn.stomp.protocol.frames import Frame
from gearhorn.stomp.protocol.rules import (
    Destination,
    ProtocolError,
    SessionSettings,
    Transactions,
    options_of,
    parse_destination,
    refuse_broker_headers,
    require,
    sendable,
)
from gearhorn.stomp.protocol.sendheaders import SendOptions
from gearhorn.stomp.queues.bounds import QueueFull
from gearhorn.stomp.queues.publisher import FanoutFailed
from gearhorn.stomp.sessions.backend import Backend
from gearhorn.stomp.sessions.outbox import Outbox
from gearhorn.store.fsync import BarrierUnavailable, FsyncFailed
from gearhorn.store.redisconn import REDIS_ERRORS


class SendingSession(Protocol):
    """What :class:`Sends` uses of its session (gearhorn/stomp/sessions/session.py)."""

    backend: Backend
    settings: SessionSettings
    principal: Principal
    transactions: Transactions

    @property
    def gearman(self) -> gearman.Client: ...

    def flushed(self) -> bool: ...

    def check(self, allowed: Callable[[str], bool], destination: str, what: str) -> None: ...

    def receipt(self, frame: Frame, extra: dict[str, str] | None = None) -> None: ...

    def refused(self, frame: Frame, exc: Exception) -> None: ...

    def temp_queue(self, name: str) -> str: ...


# What a frame may fail with; each ends the connection with an ERROR (Session.refused).
REFUSALS = (ProtocolError, BadRequest, FanoutFailed, QueueFull, FsyncFailed,
             BarrierUnavailable, gearman.GearmanError, *REDIS_ERRORS)


class Sends:
    """The SEND half of one session (which keeps the connection's state):
    queue SENDs go to Gearman here, topic SENDs through the outbox, which
    answers them here (:meth:`answered`) in the order they were read."""

    def __init__(self, session: SendingSession) -> None:
        self.session = session
        self.pending_requests = 0
        self.outbox = Outbox(session.backend.publisher, self._client, self.answered,
                             session.refused, session.settings.max_payload_bytes)

    def _client(self) -> gearman.Client:
        return self.session.gearman

    def batch(self, batch: list[Frame]) -> None:
        """Consecutive SENDs to one destination, as one batch."""
        s = self.session
        try:
            for frame in batch:
                refuse_broker_headers(frame)
            dest = parse_destination(batch[0].headers["destination"])
            self.check(dest)
            bodies = [f.body for f in batch]
            if dest.kind == "topic":
                self.outbox.put(s.backend.publisher.prepare(dest.name, bodies), batch)
                return
            if not s.flushed():
                return
            s.backend.publisher.send_to_queue(s.gearman, dest.name, bodies)
            self.on_disk(batch)
        except REFUSALS as exc:
            s.refused(batch[0], exc)
            return
        for frame in batch:
            s.receipt(frame)

    def on_send(self, frame: Frame) -> None:
        refuse_broker_headers(frame)
        require(frame, "destination")
        if self.session.transactions.hold(frame):
            return
        extra = self.send(frame, in_outbox=True)
        if extra is not None:
            self.session.receipt(frame, extra)

    def send(self, frame: Frame, in_outbox: bool = False,
             on_disk: bool = True) -> dict[str, str] | None:
        """Send ``frame``; None when the outbox answers it later (a topic
        SEND but a deduplicated one, whose RECEIPT says if it was a duplicate).
        ``on_disk``: wait for the disk here (else the caller does, once for many)."""
        s = self.session
        dest = sendable(frame, s.settings.max_payload_bytes)
        if dest.kind == "control":
            if not s.flushed():
                return {}
            s.check(s.principal.may_read, f"/{dest.target}/{dest.name}", "read")
            return s.backend.counts.answer(dest)
        self.check(dest)
        options, reply_queue = self._replied_to(options_of(frame))
        publisher = s.backend.publisher
        if in_outbox and dest.kind == "topic" and DEDUP_HEADER not in options.headers:
            self.outbox.put(publisher.prepare(dest.name, [frame.body], options), [frame])
            return None
        if not s.flushed():
            return {}
        if dest.kind == "topic":
            result = publisher.publish(s.gearman, dest.name, [frame.body], options)
            return {"x-duplicate": "true"} if result.get("duplicate") else {}
        if reply_queue is not None and options.delay is None:
            self._request(dest, frame, options, reply_queue)
        else:
            publisher.send_to_queue(s.gearman, dest.name, [frame.body], options)
        if on_disk:
            self.on_disk([frame])
        return {}

    def _request(self, dest: Destination, frame: Frame, options: SendOptions,
                 reply_queue: str) -> None:
        limit = self.session.settings.max_pending_requests
        if self.pending_requests >= limit:
            raise ProtocolError(f"more than {limit} requests waiting for their reply on "
                                "one connection")
        self.pending_requests += 1
        self.session.backend.requests.request(dest.name, frame.body, options, reply_queue,
                                              self._request_done)

    def _request_done(self) -> None:
        self.pending_requests -= 1

    def _replied_to(self, options: SendOptions) -> tuple[SendOptions, str | None]:
        """``options`` with a ``reply-to: /temp-queue/NAME`` made this
        connection's queue, and that queue's function."""
        if options.temp_reply is None:
            return options, None
        function = self.session.temp_queue(options.temp_reply)
        return SendOptions(options.priority, options.delay,
                           {**options.headers, "reply-to": f"/queue/{function}"}), function

    def answered(self, frames: list[Frame], result: dict | None) -> None:
        """The outbox's topic SENDs are done: the worker that ran their
        fanout job answered after an fsync covering them and what this
        bridge wrote before (``result``); ``None``: no job was needed (every
        subscriber reads the history), so the bridge waits for the disk."""
        s = self.session
        if result is None:
            try:
                self.on_disk(frames)
            except REFUSALS as exc:
                s.refused(frames[0], exc)
                return
        for frame in frames:
            s.receipt(frame)

    def on_disk(self, frames: list[Frame]) -> None:
        """Before the RECEIPTs of ``frames``: wait until an fsync covers what
        they changed (docs/reliability.rst). Frames without a receipt are
        promised nothing, so they do not wait."""
        if any("receipt" in frame.headers for frame in frames):
            self.session.backend.durability.wait()

    def check(self, dest: Destination) -> None:
        """May this connection SEND to ``dest`` (a queue or topic)?"""
        s = self.session
        if dest.kind == "queue" and dest.name.startswith(TEMP_FUNCTION_PREFIX):
            # A reply needs no right (only its reply-to names the queue), but the
            # queue must be live: no one makes queues of their own this way.
            if not s.backend.registrations.temp_queue_exists(dest.name):
                raise ProtocolError(f"no temporary queue {dest.name[:80]!r} (its connection "
                                    "is gone, or it never existed)")
        else:
            s.check(s.principal.may_write, f"/{dest.kind}/{dest.name}", "send to")
