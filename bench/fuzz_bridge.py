"""Fuzz the running STOMP bridge: 100,000 generated frames, no crash, no hang,
no memory growth.

    python bench/fuzz_bridge.py                 # 100,000 frames (about 3 minutes)
    python bench/fuzz_bridge.py --frames 5000   # a smoke run

Starts its own Redis, gearmand, a one-process worker pool and a bridge on
free loopback ports (they stop with this process). Hypothesis generates
connections: a CONNECT (usually valid, sometimes not) and then frames built
from STOMP's commands and headers, valid and broken (wrong headers, bad
escapes, bad UTF-8, NUL, huge or negative lengths, random bytes, truncation).
Each connection sends its frames at once and hangs up. Every 250
connections a canary client must connect, subscribe, send and receive within
5 s (a hang fails the run), and the bridge's RSS is sampled. The run fails
if the bridge exits, the canary fails, or RSS at the end is more than 20 MB
above RSS after the first tenth (memory growth).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
import tempfile
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from gearhorn.stomp.protocol.frames import Frame, FrameParser, encode  # noqa: E402
from gearhorn.supervision import servers

FRAMES_PER_CONNECTION = 20
COMMANDS = ["SEND", "SUBSCRIBE", "UNSUBSCRIBE", "ACK", "NACK", "BEGIN", "COMMIT", "ABORT",
            "DISCONNECT", "CONNECT", "STOMP", "MESSAGE", "BOGUS"]
HEADERS = ["destination", "id", "ack", "receipt", "transaction", "content-length",
           "content-type", "prefetch-count", "ack-timeout", "durable", "priority", "x-delay",
           "AMQ_SCHEDULED_DELAY", "reply-to", "correlation-id", "heart-beat", "accept-version",
           "login", "passcode", "message-id", "subscription", "activemq.subscriptionName"]
VALUES = st.one_of(
    st.sampled_from(["/queue/fz", "/topic/fz", "/topic/fz.*", "/temp-queue/r", "/queue/",
                     "/control/count-msgs/queue/fz", "client", "auto", "client-individual",
                     "true", "0", "1", "9", "10", "-1", "99999999999", "1.2", "1.0,1.1",
                     "10,10", "x", "\\c", "\\t", ""]),
    st.text(max_size=40), st.integers(-5, 2**40).map(str))


@st.composite
def frame_bytes(draw) -> bytes:
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.binary(max_size=300))  # noise
    command = draw(st.sampled_from(COMMANDS))
    headers = draw(st.dictionaries(st.sampled_from(HEADERS) | st.text(max_size=12), VALUES,
                                   max_size=8))
    body = draw(st.binary(max_size=200))
    wire = encode(command, {k: v for k, v in headers.items()}, body,
                  draw(st.sampled_from(["1.0", "1.1", "1.2"])))
    if kind == 1:  # truncated
        wire = wire[:draw(st.integers(0, len(wire)))]
    elif kind == 2:  # a byte flipped
        i = draw(st.integers(0, len(wire) - 1))
        wire = wire[:i] + bytes([draw(st.integers(0, 255))]) + wire[i + 1:]
    return wire


connections = st.tuples(
    st.sampled_from([b"CONNECT\naccept-version:1.2\nhost:fz\n\n\0",
                     b"STOMP\naccept-version:1.0,1.1\nheart-beat:0,0\n\n\0",
                     b"CONNECT\n\n\0", b"CONNECT\naccept-version:9.9\n\n\0", b""]),
    st.lists(frame_bytes(), min_size=FRAMES_PER_CONNECTION, max_size=FRAMES_PER_CONNECTION))


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fp:
        return next(int(line.split()[1]) for line in fp if line.startswith("VmRSS:"))


def canary(port: int) -> None:
    """Connect, subscribe, send and receive one message within 5 s, or raise."""
    deadline = time.monotonic() + 5
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    parser = FrameParser()
    parser.version = "1.2"
    frames: list[Frame] = []

    def until(command: str) -> Frame:
        while True:
            for f in frames:
                if f.command == command:
                    frames.remove(f)
                    return f
            if time.monotonic() > deadline:
                raise SystemExit(f"bridge hung: no {command} within 5 s")
            data = sock.recv(65536)
            if not data:
                raise SystemExit(f"bridge closed the canary before {command}")
            frames.extend(parser.feed(data))

    try:
        sock.sendall(encode("CONNECT", {"accept-version": "1.2", "host": "c"}))
        until("CONNECTED")
        sock.sendall(encode("SUBSCRIBE", {"destination": "/queue/canary", "id": "c",
                                          "receipt": "s"}))
        until("RECEIPT")
        sock.sendall(encode("SEND", {"destination": "/queue/canary"}, b"alive"))
        message = until("MESSAGE")
        assert message.body == b"alive", message
    finally:
        sock.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--frames", type=int, default=100_000)
    args = parser.parse_args()
    stats = {"frames": 0, "connections": 0, "rss": []}
    with tempfile.TemporaryDirectory() as tmp:
        rd = servers.start_redis(data_dir=os.path.join(tmp, "redis"))
        gm = servers.start_gearmand(data_dir=os.path.join(tmp, "gearmand"))
        from gearhorn.config import Config, to_env
        port = servers.free_port()
        config = Config(gearman_servers=((gm.host, gm.port),), redis_url=rd.details["url"],
                        processes=1, log_level="ERROR", bridge_port=port, bridge_ws_port=0)
        bridge = servers.start_bridge(to_env(config), "127.0.0.1", port)
        pid = bridge.process.pid
        started = time.monotonic()
        try:
            canary(port)

            @settings(max_examples=args.frames // FRAMES_PER_CONNECTION, deadline=None,
                      database=None, suppress_health_check=list(HealthCheck))
            @given(connections)
            def attack(connection):
                hello, frames = connection
                # (the bridge may hang up after an early frame: fine)
                with socket.create_connection(("127.0.0.1", port), timeout=5) as sock, \
                        contextlib.suppress(OSError):
                    sock.sendall(hello + b"".join(frames))
                stats["frames"] += len(frames)
                stats["connections"] += 1
                if stats["connections"] % 250 == 0:
                    if bridge.process.poll() is not None:
                        raise SystemExit(f"bridge exited:\n{bridge.log_tail()}")
                    canary(port)
                    stats["rss"].append((stats["frames"], rss_kb(pid)))
                    print(f"{stats['frames']:>8,} frames  {stats['connections']:>6,} "
                          f"connections  bridge RSS {stats['rss'][-1][1] / 1024:6.1f} MB",
                          flush=True)

            attack()
            canary(port)
            stats["rss"].append((stats["frames"], rss_kb(pid)))
        finally:
            bridge.stop()
            gm.stop()
            rd.stop()
    elapsed = time.monotonic() - started
    warm = stats["rss"][max(0, len(stats["rss"]) // 10 - 1)][1]
    end = stats["rss"][-1][1]
    print(f"\n{stats['frames']:,} frames on {stats['connections']:,} connections in "
          f"{elapsed:.0f} s: no crash, no hang; bridge RSS {warm / 1024:.1f} MB after the "
          f"first tenth, {end / 1024:.1f} MB at the end")
    if end - warm > 20 * 1024:
        raise SystemExit("memory grew by more than 20 MB")


if __name__ == "__main__":
    main()
