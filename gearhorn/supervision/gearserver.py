"""``python -m gearhorn.supervision.gearserver``: gear's pure-Python Gearman server.

For tests and ``gearhorn up`` where C gearmand is not installed. It cannot
run in a gevent-patched process, so it always gets a process of its own.
Not for production: no persistence, no unique coalescing (docs/design/index.rst).
"""

from __future__ import annotations

import argparse
import signal
import socket
import threading

import gear


class NoDelayServer(gear.Server):
    """gear.Server answering without Nagle's 40 ms delay."""

    def _registerConnection(self, conn) -> None:
        conn.conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super()._registerConnection(conn)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="gearhorn.supervision.gearserver")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=4730)
    parser.add_argument("--ssl-ca", help="TLS: CA of the client certificates (PEM)")
    parser.add_argument("--ssl-cert", help="TLS: this server's certificate (PEM)")
    parser.add_argument("--ssl-key", help="TLS: this server's key (PEM)")
    args = parser.parse_args(argv)
    server = NoDelayServer(port=args.port, host=args.host, ssl_key=args.ssl_key,
                           ssl_cert=args.ssl_cert, ssl_ca=args.ssl_ca)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    server.shutdown()


if __name__ == "__main__":
    main()
