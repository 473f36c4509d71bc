"""gearmand's text admin protocol: ``status``, ``version``, ``drop function``."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from gearhorn.gearman.connection import TlsFiles, connect
from gearhorn.gearman.packets import GearmanError

log = logging.getLogger(__name__)


# Admin commands answered with several lines ending in ".\n"; the others answer one line.
_MULTI_LINE_ADMIN = {"status", "workers", "show", "prioritystatus"}


def admin(host: str, port: int, command: str, timeout: float = 5.0,
          tls: TlsFiles | None = None) -> list[str]:
    """Run a text admin command (``status``, ``workers``, ``version``)."""
    with connect(host, port, timeout, tls) as sock:
        sock.settimeout(timeout)
        sock.sendall(command.encode() + b"\n")
        data = bytearray()
        single = command.split(" ", 1)[0] not in _MULTI_LINE_ADMIN
        while not (data.endswith(b"\n.\n") or data == b".\n" or (single and b"\n" in data)):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    lines = data.decode("utf-8", "replace").splitlines()
    return [line for line in lines if line != "."]


def drop_function(servers: Sequence[tuple[str, int]], function: str,
                  tls: TlsFiles | None = None) -> None:
    """Delete a queue nobody will read again, on every server (admin ``drop
    function``); a failure is logged, not raised."""
    for host, port in servers:
        try:
            admin(host, port, f"drop function {function}", tls=tls)
        except (OSError, GearmanError) as exc:
            log.warning("could not drop %s on %s:%s: %s", function, host, port, exc)


def client_ids(host: str, port: int, timeout: float = 5.0,
               tls: TlsFiles | None = None) -> set[str]:
    """The ids of every connection open to gearmand (admin ``workers``:
    ``fd address id : functions``), clients' as workers'."""
    return {parts[2] for line in admin(host, port, "workers", timeout, tls)
            if len(parts := line.split()) >= 3}


@dataclass(frozen=True, slots=True)
class FunctionStatus:
    name: str
    queued: int
    running: int
    workers: int


def status(host: str, port: int, timeout: float = 5.0,
           tls: TlsFiles | None = None) -> list[FunctionStatus]:
    """gearmand's ``status``: jobs queued (total), running, and capable workers."""
    return [FunctionStatus(*row) for row in status_rows(host, port, timeout, tls)]


def totals(servers: Sequence[tuple[str, int]],
           tls: TlsFiles | None = None) -> dict[str, FunctionStatus]:
    """``status`` of each function summed over every server (with several
    gearmand, a queue's jobs are spread over all of them); raises when one
    does not answer."""
    found: dict[str, FunctionStatus] = {}
    for host, port in servers:
        for f in status(host, port, tls=tls):
            seen = found.get(f.name)
            found[f.name] = f if seen is None else FunctionStatus(
                f.name, seen.queued + f.queued, seen.running + f.running,
                seen.workers + f.workers)
    return found


def status_rows(host: str, port: int, timeout: float = 5.0,
                tls: TlsFiles | None = None) -> list[tuple[str, int, int, int]]:
    """``status`` as plain tuples: with 100,000 functions, objects cost half
    a second more (gearhorn web's scrape; bench/metrics.py)."""
    rows = []
    for line in admin(host, port, "status", timeout, tls):
        parts = line.split("\t")
        if len(parts) == 4:
            try:
                rows.append((parts[0], int(parts[1]), int(parts[2]), int(parts[3])))
            except ValueError:
                continue  # not a status line
    return rows
