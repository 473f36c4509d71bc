"""A turn's writes to the bridge's connections, together (runs under gevent).

The first frame a greenlet sends a connection in a turn of the event loop
goes out at once (gearhorn/stomp/transport/server.py); the ones sent after it wait
for one callback of the loop, once the greenlet gives way, and go in one
write per connection.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Protocol

import gevent

log = logging.getLogger(__name__)


class TurnWritable(Protocol):
    """A connection the loop writes (gearhorn/stomp/transport/server.py ClientConnection)."""

    address: tuple

    def write_turn(self) -> None:
        """Write what was sent to it this turn, what the socket takes now."""

    def wake_writer(self) -> None:
        """Its writer greenlet writes the rest."""


class LoopWrites:
    """The connections sent to since the running greenlet last gave way,
    written by one callback of the event loop (``ClientConnection.write_turn``)
    with what was sent after a turn's first frame.

    While frames read together are handled (:meth:`held`), not even the
    first is written at once: a bridge that fell behind reads several SENDs
    at a time, and one write per subscriber for all of them, instead of two,
    is the send(2) a delivery saves when the bridge can least spare it
    (issue 27: send was a third of its time at topic x100)."""

    def __init__(self) -> None:
        self._due: list[TurnWritable] = []
        # The greenlet in held(): its sends wait. Others' do not, should it
        # block (on Redis, say) in the middle.
        self.holder: gevent.Greenlet | None = None

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """The running greenlet's writes wait until the block ends, then go
        out together."""
        if self.holder is not None:  # nested, or another greenlet's: as it was
            yield
            return
        self.holder = gevent.getcurrent()
        try:
            yield
        finally:
            self.holder = None
            self._write()

    def due(self, connection: TurnWritable) -> None:
        if not self._due:
            gevent.get_hub().loop.run_callback(self._write)
        self._due.append(connection)

    def _write(self) -> None:
        due, self._due = self._due, []
        for connection in due:
            try:
                connection.write_turn()
            except Exception:  # noqa: BLE001 - never the others' writes
                log.exception("%s: write", connection.address)
                connection.wake_writer()  # its writer has the queue
