"""The listening sockets of gearhorn's servers, the one-line error a port
that is taken becomes, and what ``gearhorn up`` asks a port it finds taken.

``gearhorn bridge`` next to a running bridge used to die with a traceback
(``OSError: [Errno 98] Address already in use``) on the default WebSocket
port. Every server command binds through :func:`listen`, so a taken port
says which setting and flag choose another, and the command exits 1.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gearhorn.config import ENV_PREFIX
from gearhorn.errors import GearhornError

if TYPE_CHECKING:
    from gearhorn.gearman import TlsFiles


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


# -- what listens there --------------------------------------------------------------


def _ask(sock: socket.socket, request: bytes, done: Callable[[bytes], bool]) -> bytes:
    """Send ``request`` and read until ``done`` says the answer is whole, or
    the peer closes; one try, the socket's timeout bounds each read."""
    sock.sendall(request)
    answer = b""
    while not done(answer):
        chunk = sock.recv(65536)
        if not chunk:
            break
        answer += chunk
    return answer


def _answer(host: str, port: int, request: bytes, done: Callable[[bytes], bool]) -> bytes:
    """What a plain TCP server answers ``request`` within 5 s; b"" if nothing.
    (A client library would retry a silent port: redis-py did for a minute.)"""
    try:
        with socket.create_connection((host, port), timeout=5) as sock:
            return _ask(sock, request, done)
    except OSError:
        return b""


def answers_as_redis(host: str, port: int) -> bool:
    """Redis answers PING with ``+PONG`` (or an error such as ``-NOAUTH``)."""
    reply = _answer(host, port, b"PING\r\n", lambda a: b"\r\n" in a)
    return reply.startswith((b"+PONG", b"-NOAUTH", b"-ERR", b"-WRONGPASS"))


def answers_as_gearmand(host: str, port: int, tls: TlsFiles | None = None) -> bool:
    """gearmand (or gear.Server) answers the admin ``status`` with lines
    ending in a line of ``.`` (just ``.`` when no function is known)."""
    from gearhorn import gearman  # gear is slow to import; only up needs this

    def whole(answer: bytes) -> bool:
        return answer == b".\n" or answer.endswith(b"\n.\n")

    try:
        with gearman.connect(host, port, 5, tls) as sock:
            sock.settimeout(5)
            return whole(_ask(sock, b"status\n", whole))
    except (gearman.GearmanError, OSError):
        return False


def answers_as_bridge(host: str, port: int) -> bool:
    """A gearhorn bridge answers CONNECT with CONNECTED and ``server:gearhorn/...``."""
    reply = _answer(host, port, b"CONNECT\naccept-version:1.2\nhost:probe\n\n\0",
                    lambda a: b"\0" in a)
    return reply.startswith(b"CONNECTED") and b"\nserver:gearhorn/" in reply
