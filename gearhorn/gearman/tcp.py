"""Noticing a silent peer: every TCP connection gearhorn holds (to gearmand,
to Redis) gives up on a peer that stops answering within seconds.

Without this, a partition that heals leaves each connection waiting out
TCP's retransmission backoff: measured under ``gearhorn up`` with packets
to Redis or gearmand dropped for 20 s, the first fanout was answered 6.4 to
6.7 s after the heal. Here a connection with data unacknowledged for
``SILENT_AFTER`` seconds (``TCP_USER_TIMEOUT``), or idle and unanswered
for as long (keepalive probes), is dropped by the kernel; its owner opens
another, with a short connect timeout, and service resumes within a
second of the network (bench/partition.py measures it). The peer's kernel
acknowledges, not its process, so a busy gearmand or Redis never looks
silent.
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
