"""A loopback TCP proxy in front of gearmand that holds back one job
submission: the instant between a taker's last look at a job and its
attach, made as long as a test needs (the window docs/design/held-copies.rst
bounds in "The bounds")."""

from __future__ import annotations

import contextlib
import socket
import threading

from gearhorn.gearman import P

from .helpers import LoopbackProxy

SUBMITS = {P.SUBMIT_JOB, P.SUBMIT_JOB_HIGH, P.SUBMIT_JOB_LOW, P.SUBMIT_JOB_BG,
           P.SUBMIT_JOB_HIGH_BG, P.SUBMIT_JOB_LOW_BG}
HEADER = 12  # \0REQ, type, size


class SubmitGate(LoopbackProxy):
    """Passes everything from a process pointed at ``address`` to gearmand,
    but the first submission of a job to ``function``: that one, and what
    follows it on its connection, waits until :meth:`release` (``held`` is
    set meanwhile). Admin text connections pass as they are."""

    def __init__(self, server, function: str) -> None:
        self.function = function.encode()
        self.held = threading.Event()
        self._open = threading.Event()
        super().__init__(server)

    def release(self) -> None:
        self._open.set()

    def close(self) -> None:
        self.release()
        super().close()

    def _forward(self, source: socket.socket, sink: socket.socket, requests: bool) -> None:
        with contextlib.suppress(OSError):
            if requests:
                self._requests(source, sink)
            else:
                while data := source.recv(65536):
                    sink.sendall(data)
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _requests(self, source: socket.socket, sink: socket.socket) -> None:
        """Packet by packet (a held one waits with what follows it)."""
        buffered, binary = b"", None
        while data := source.recv(65536):
            binary = data[:1] == b"\0" if binary is None else binary
            if not binary:
                sink.sendall(data)
                continue
            buffered += data
            while len(buffered) >= HEADER:
                end = HEADER + int.from_bytes(buffered[8:12], "big")
                if len(buffered) < end:
                    break
                packet, buffered = buffered[:end], buffered[end:]
                if self._holds(packet):
                    self.held.set()
                    self._open.wait(120)
                sink.sendall(packet)

    def _holds(self, packet: bytes) -> bool:
        kind = int.from_bytes(packet[4:8], "big")
        return (not self._open.is_set() and kind in SUBMITS
                and packet[HEADER:].split(b"\0", 1)[0] == self.function)
