"""The listening sockets of gearhorn's servers, and the one-line error a
port that is taken becomes.

``gearhorn bridge`` next to a running bridge used to die with a traceback
(``OSError: [Errno 98] Address already in use``) on the default WebSocket
port. Every server command binds through :func:`listen`, so a taken port
says which setting and flag choose another, and the command exits 1.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass

from gearhorn.config import ENV_PREFIX
from gearhorn.errors import GearhornError


class PortTaken(GearhornError):
    """A port a server must listen on is in use (or may not be bound)."""


@dataclass(frozen=True)
class PortSetting:
    """What chooses a port: the config setting, its flag, and what else helps."""

    setting: str  # bridge_ws_port
    flag: str = ""  # --ws-port PORT; empty: a setting with no flag
    hint: str = ""  # --ws-port 0 turns WebSocket off

    def explain(self, host: str, port: int, why: str) -> str:
        env = f"{ENV_PREFIX}GEARMAN" if self.setting == "gearman_servers" \
            else f"{ENV_PREFIX}{self.setting.upper()}"
        how = f"with {self.flag} " if self.flag else ""
        hint = f"; {self.hint}" if self.hint else ""
        return (f"port {port} on {host} {why}: choose another {how}(setting "
                f"{self.setting}, env {env}){hint}")


BRIDGE_PORT = PortSetting("bridge_port", "--port PORT")
BRIDGE_WS_PORT = PortSetting("bridge_ws_port", "--ws-port PORT",
                             "--ws-port 0 turns WebSocket off")
WEB_PORT = PortSetting("web_port", "--port PORT")
# What gearhorn up finds already listening must be what it expects there.
REDIS_URL = PortSetting("redis_url", "--redis-url URL")
QUEUE_REDIS_URL = PortSetting("queue_redis_url")
GEARMAN_SERVERS = PortSetting("gearman_servers", "--gearman HOST:PORT")
UP_BRIDGE_PORT = PortSetting("bridge_port")


def not_what_was_expected(host: str, port: int, what: PortSetting, expected: str) -> PortTaken:
    """A port ``gearhorn up`` would use as is, held by something that does
    not answer as ``expected`` (another program, or a server still starting)."""
    return PortTaken(what.explain(host, port, f"is taken by a program that does not answer "
                                  f"as {expected}"))


def listen(host: str, port: int, what: PortSetting, reuse_port: bool = False,
           backlog: int = 1024) -> socket.socket:
    """A listening socket on ``host:port``; a taken port raises :class:`PortTaken`.
    With ``reuse_port`` several bridge processes bind the same port and the
    kernel spreads new connections over them."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortTaken(what.explain(host, port, "is taken (another program, or "
                                         "another gearhorn, listens there)")) from None
        if exc.errno in (errno.EACCES, errno.EADDRNOTAVAIL):
            raise PortTaken(what.explain(host, port, f"cannot be bound ({exc.strerror})")) \
                from None
        raise
    return sock
