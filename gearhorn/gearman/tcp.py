"""Noticing a silent peer: every TCP connection gearhorn holds (to gearmand,
to Redis) gives up on a peer that stops answering within seconds.

Why it is shaped so: docs/design/notes.rst, "gearhorn/gearman/tcp.py".
"""

from __future__ import annotations

import socket

# Seconds of silence after which a connection counts as dead: data
# unacknowledged, a peer that stops reading (a zero window), or keepalive
# probes unanswered that long. Not less: on a loaded machine a busy peer
# may read nothing for seconds, and its connection must not be cut for it.
SILENT_AFTER = 10.0
# Seconds an attempt to connect again waits for the peer: one SYN (the
# kernel's first retransmission comes after 1 s), then the caller's loop
# tries again (gearhorn/runtime/background.py's RECONNECT_CAP between tries).
CONNECT_TIMEOUT = 0.5


def keepalive_options(silent_after: float = SILENT_AFTER) -> dict[int, int]:
    """TCP options (level IPPROTO_TCP) that drop a silent peer's connection
    after ``silent_after`` seconds, as redis-py's ``socket_keepalive_options``
    takes them.

    >>> keepalive_options(10.0)[socket.TCP_USER_TIMEOUT]
    10000
    """
    # Probes from 1 s idle on; the user timeout decides when unanswered
    # ones (or unacknowledged data) end the connection.
    return {socket.TCP_KEEPIDLE: 1, socket.TCP_KEEPINTVL: 1,
            socket.TCP_KEEPCNT: max(1, int(silent_after)),
            socket.TCP_USER_TIMEOUT: int(silent_after * 1000)}


def watch_for_silence(sock: socket.socket, silent_after: float = SILENT_AFTER) -> None:
    """Keepalive probes and a user timeout on ``sock`` (see the module)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in keepalive_options(silent_after).items():
        sock.setsockopt(socket.IPPROTO_TCP, option, value)
