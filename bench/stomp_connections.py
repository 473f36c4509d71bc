"""Many STOMP connections on one bridge process: held, subscribed, receiving.

    python bench/stomp_connections.py                 # 5,000 connections
    python bench/stomp_connections.py --connections 500   # a smoke run

Starts Redis, gearmand, a worker pool and one bridge process on free
loopback ports (and, when rabbitmq-server is installed, a private RabbitMQ
node with its STOMP plugin as the peer, in the same run). One client
process holds every connection on non-blocking sockets: each connects,
subscribes to ``/topic/load`` (a non-durable subscription: in gearhorn its
own registry entry and Gearman queue) and must then receive each of 3
broadcast messages. Prints the server's memory (RSS; for RabbitMQ the whole
Erlang VM) before the connections, with all of them subscribed, and after
the messages, and the memory per connection.
"""

from __future__ import annotations

import argparse
import os
import resource
import selectors
import socket
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from fanout import start_pool  # noqa: E402  (bench/fanout.py)

from gearhorn.stomp.protocol.frames import FrameParser, encode  # noqa: E402
from gearhorn.supervision import servers

MESSAGES = 3


def raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(needed, hard), hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < needed:
        raise SystemExit(f"need {needed} file descriptors; `ulimit -n` allows {hard}")


def rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as fp:
                total += next(int(line.split()[1]) for line in fp if line.startswith("VmRSS:"))
        except (FileNotFoundError, StopIteration):
            pass
    return total / 1024


def group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fp:
                    fields = fp.read().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid:
                    pids.append(int(entry))
            except (FileNotFoundError, IndexError):
                pass
    return pids


class Client:
    __slots__ = ("sock", "parser", "state", "messages", "out")

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.parser, self.state, self.messages, self.out = \
            sock, FrameParser(), "connecting", 0, b""


def hold(port: int, count: int, login: dict, memory, deadline: float = 300) -> dict:
    """Open ``count`` subscribed connections, broadcast, count deliveries."""
    selector = selectors.DefaultSelector()
    clients: list[Client] = []
    end = time.monotonic() + deadline
    connect = encode("CONNECT", {"accept-version": "1.2", "host": login.get("vhost", "b"),
                                 "heart-beat": "0,0", **login.get("headers", {})})
    subscribe = encode("SUBSCRIBE", {"destination": "/topic/load", "id": "1", "receipt": "s"})

    def pump(until) -> None:
        while not until():
            if time.monotonic() > end:
                states = {}
                for c in clients:
                    states[c.state] = states.get(c.state, 0) + 1
                raise SystemExit(f"timed out; connection states: {states}")
            for key, _ in selector.select(1.0):
                client: Client = key.data
                data = client.sock.recv(65536)
                if not data:
                    raise SystemExit("the server closed a connection")
                for frame in client.parser.feed(data):
                    if frame.command == "CONNECTED":
                        client.parser.version = "1.2"
                        client.sock.sendall(subscribe)
                        client.state = "subscribing"
                    elif frame.command == "RECEIPT":
                        client.state = "subscribed"
                    elif frame.command == "MESSAGE":
                        client.messages += 1
                    elif frame.command == "ERROR":
                        raise SystemExit(f"ERROR: {frame.headers.get('message')}")

    started = time.monotonic()
    for start in range(0, count, 250):  # a burst at a time: the listen backlog is finite
        for _ in range(start, min(count, start + 250)):
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.setblocking(True)
            sock.sendall(connect)
            client = Client(sock)
            clients.append(client)
            selector.register(sock, selectors.EVENT_READ, client)
        pump(lambda: all(c.state == "subscribed" for c in clients))
    connected = time.monotonic() - started
    subscribed_mb = memory()
    sender = socket.create_connection(("127.0.0.1", port), timeout=30)
    sender.sendall(encode("CONNECT", {"accept-version": "1.2", "host": login.get("vhost", "b"),
                                      **login.get("headers", {})}))
    for i in range(MESSAGES):
        sender.sendall(encode("SEND", {"destination": "/topic/load"}, f"m{i}".encode()))
    started = time.monotonic()
    pump(lambda: all(c.messages >= MESSAGES for c in clients))
    delivered = time.monotonic() - started
    receiving_mb = memory()
    sender.close()
    for client in clients:
        client.sock.close()
    return {"connect_s": connected, "deliver_s": delivered, "subscribed_mb": subscribed_mb,
            "receiving_mb": receiving_mb}


def report(name: str, count: int, base_mb: float, result: dict) -> None:
    per = (result["receiving_mb"] - base_mb) * 1024 / count
    print(f"  {name:9} RSS {base_mb:7.1f} MB idle, {result['subscribed_mb']:7.1f} MB with "
          f"{count:,} subscribed, {result['receiving_mb']:7.1f} MB after "
          f"{count * MESSAGES:,} deliveries: {per:6.1f} KB per connection; connect+subscribe "
          f"{result['connect_s']:.1f} s, deliveries {result['deliver_s']:.1f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--connections", type=int, default=5000)
    args = parser.parse_args()
    raise_fd_limit(2 * args.connections + 1000)  # the bridge also holds a gearmand link each
    print(f"{args.connections:,} STOMP connections, each subscribed to /topic/load and "
          f"receiving {MESSAGES} messages", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        rd = servers.start_redis(data_dir=os.path.join(tmp, "redis"))
        gm = servers.start_gearmand(data_dir=os.path.join(tmp, "gearmand"))
        from gearhorn.config import Config, to_env
        port = servers.free_port()
        config = Config(gearman_servers=((gm.host, gm.port),), redis_url=rd.details["url"],
                        processes=2, log_level="WARNING", bridge_port=port, bridge_ws_port=0,
                        stomp_max_connections=args.connections + 100)
        env = {**os.environ, **to_env(config)}
        pool = start_pool(gm, rd.details["url"], 2)
        bridge = servers.start_bridge(env, "127.0.0.1", port)
        try:
            base = rss_mb([bridge.process.pid])
            result = hold(port, args.connections, {},
                          lambda: rss_mb([bridge.process.pid]))
            report("gearhorn", args.connections, base, result)
        finally:
            bridge.stop()
            pool.terminate()
            pool.wait()
            gm.stop()
            rd.stop()
    from stomp_bridge import RabbitMQ
    if not RabbitMQ.installed():
        print("  RabbitMQ: not installed (apt-get install rabbitmq-server); no comparison")
        return
    with RabbitMQ() as rabbit:
        pids = group_pids(rabbit.proc.pid)
        base = rss_mb(pids)
        login = {"vhost": "/", "headers": {"login": "guest", "passcode": "guest"}}
        result = hold(rabbit.port, args.connections, login, lambda: rss_mb(group_pids(
            rabbit.proc.pid)))
        report("RabbitMQ", args.connections, base, result)


if __name__ == "__main__":
    main()
