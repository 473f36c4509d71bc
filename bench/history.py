"""What topic history costs: fanout throughput with it on and off, the
Redis memory of one retained message, and how fast a STOMP client replays
it against RabbitMQ streams.

    python bench/history.py            # about 3 minutes on 2 cores
    python bench/history.py --quick
    python bench/history.py --replay-only

Fresh servers for each mode, in 5 turns (off, on, off, on...): a pool of 2
worker processes, one gearmand (no persistence) and one Redis; background
fanouts of 100-byte payloads, all in flight at once, to 1 topic with 10
and with 100 subscribers; the figure is copies accepted by gearmand per
second, and the peer is the same run with history off. Then 100 topics
get 1,000 messages each with history_size 1,000: Redis's used_memory
before and after, per retained message.

Replay: 100,000 messages of 100 bytes are published to a topic that keeps
them all, then one raw-STOMP client subscribes from the first
(``x-stream-offset: first``, ``ack: client``, ``prefetch-count`` 1,000,
one cumulative ACK per read) and the figure is messages/s from SUBSCRIBE
to the last one. The peer, when Debian's rabbitmq-server is installed, is
the same client on a RabbitMQ stream (``x-queue-type: stream``) read the
same way through RabbitMQ's STOMP plugin, in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import redis

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from fanout import start_pool, subscribe_many  # noqa: E402
from stomp_bridge import Gearhorn, RabbitMQ  # noqa: E402
from stomp_load import connect, frame, with_receipt  # noqa: E402

from gearhorn import gearman  # noqa: E402
from gearhorn.store import redisconn  # noqa: E402
from gearhorn.store.keys import Keys  # noqa: E402
from gearhorn.store.registry import Registry  # noqa: E402
from gearhorn.supervision import servers

PAYLOAD = "x" * 100


def rate(gm: servers.Managed, topic: str, fanouts: int, width: int) -> float:
    client = gearman.Client([(gm.host, gm.port)])
    run = os.urandom(4).hex()
    jobs = [gearman.Copy("fanout", f"h:{run}:{i}", json.dumps(
        {"topic": topic, "payload": PAYLOAD, "background": True}).encode())
        for i in range(fanouts)]
    start = time.perf_counter()
    outcomes = client.submit_foreground(jobs, timeout=600)
    elapsed = time.perf_counter() - start
    client.close()
    if any(not o.ok or json.loads(o.data)["copies"] != width for o in outcomes):
        raise SystemExit(f"fanout failed: {next(o for o in outcomes if not o.ok)}")
    return fanouts * width / elapsed


def one_mode(history_size: int, widths: tuple[int, ...], budget: int) -> dict[int, float]:
    red, gm = servers.start_redis(), servers.start_gearmand()
    url = red.details["url"]
    pool = start_pool(gm, url, 2, ledger=False, env={
        "GEARHORN_HISTORY_SIZE": str(history_size), "GEARHORN_QUEUE_MAX_LENGTH": "0",
        "GEARHORN_QUEUE_MAX_BYTES": "0"})
    registry = Registry(redisconn.connect(url), Keys())
    try:
        found = {}
        for width in widths:
            topic = f"hist{width}"
            subscribe_many(registry, topic, width)
            fanouts = max(1, budget // width)
            rate(gm, topic, max(1, fanouts // 10), width)  # warm up
            found[width] = rate(gm, topic, fanouts, width)
        return found
    finally:
        pool.terminate()
        pool.wait()
        gm.stop()
        red.stop()


def memory_per_message(messages: int = 1000, topics: int = 100) -> float:
    red, gm = servers.start_redis(), servers.start_gearmand()
    url = red.details["url"]
    pool = start_pool(gm, url, 2, ledger=False, env={"GEARHORN_HISTORY_SIZE": str(messages)})
    client = redis.Redis.from_url(url)
    try:
        before = client.info("memory")["used_memory"]
        for t in range(topics):
            rate(gm, f"mem{t}", messages, 0)
        retained = sum(client.xlen(Keys().history(f"mem{t}")) for t in range(topics))
        return (client.info("memory")["used_memory"] - before) / retained
    finally:
        pool.terminate()
        pool.wait()
        gm.stop()
        red.stop()


REPLAYED = 100_000
TURNS = 5  # off and on in turns: the figure is the median of the ratios


def replay(port: int, login: dict, destination: str, headers: dict, messages: int) -> float:
    """Messages/s of one subscriber reading ``messages`` from the first."""
    sock = connect(port, login)
    start = time.perf_counter()
    sock.sendall(frame("SUBSCRIBE", {"destination": destination, "id": "r", "ack": "client",
                                     "prefetch-count": "1000", **headers}))
    got, tail = 0, b""
    while got < messages:
        data = sock.recv(1 << 20)
        if not data:
            raise SystemExit(f"replay: disconnected after {got} messages")
        frames = (tail + data).split(b"\0")
        tail = frames.pop()
        complete = [f for f in frames if f.strip()]
        if complete and complete[0].lstrip().startswith(b"ERROR"):
            raise SystemExit(f"replay: {complete[0][:300]!r}")
        got += len(complete)
        if complete:  # one cumulative ACK per read, for the last message in it
            head = complete[-1].split(b"\n\n", 1)[0]
            ack = next(line[4:] for line in head.split(b"\n") if line.startswith(b"ack:"))
            sock.sendall(b"ACK\nid:" + ack + b"\n\n\0")
    elapsed = time.perf_counter() - start
    sock.close()
    return messages / elapsed


def replay_gearhorn(messages: int) -> float:
    os.environ["GEARHORN_HISTORY_TOPICS"] = f"replay.*={messages * 2}"
    with Gearhorn() as broker:
        client = gearman.Client([(broker.gearmand.host, broker.gearmand.port)])
        batch = 1000
        jobs = [gearman.Copy("fanout", f"replay{i}", json.dumps(
            {"topic": "replay.bench", "payloads": [PAYLOAD] * batch}).encode())
            for i in range(messages // batch)]
        for i in range(0, len(jobs), 10):  # in order: one job after the other
            for job in jobs[i:i + 10]:
                outcome, = client.submit_foreground([job], timeout=600)
                if not outcome.ok:
                    raise SystemExit(f"fanout failed: {outcome}")
        client.close()
        return replay(broker.port, broker.login, "/topic/replay.bench",
                      {"x-stream-offset": "first"}, messages)


def replay_rabbitmq(messages: int) -> float:
    with RabbitMQ() as broker:
        producer = connect(broker.port, broker.login)
        # A SUBSCRIBE to /queue/ declares the stream (RabbitMQ's STOMP queue
        # arguments); /amq/queue/ then names it as it is.
        with_receipt(producer, "SUBSCRIBE", {
            "destination": "/queue/replay", "id": "declare", "ack": "client",
            "prefetch-count": "1", "x-queue-type": "stream", "durable": "true",
            "auto-delete": "false"})
        with_receipt(producer, "UNSUBSCRIBE", {"id": "declare"})
        body = PAYLOAD.encode()
        sends = frame("SEND", {"destination": "/amq/queue/replay"}, body) * 1000
        for _ in range(messages // 1000):
            producer.sendall(sends)
        with_receipt(producer, "SEND", {"destination": "/amq/queue/replay"})
        producer.close()
        return replay(broker.port, broker.login, "/amq/queue/replay",
                      {"x-stream-offset": "first"}, messages + 1)


def replay_run() -> None:
    ours = replay_gearhorn(REPLAYED)
    line = f"replay of {REPLAYED:,} messages to one STOMP client: gearhorn {ours:,.0f} msg/s"
    if RabbitMQ.installed():
        theirs = replay_rabbitmq(REPLAYED)
        line += f", RabbitMQ stream {theirs:,.0f} msg/s, ratio {ours / theirs:.2f}"
    else:
        line += "; RabbitMQ: not installed (apt-get install rabbitmq-server), no comparison"
    print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--replay-only", action="store_true")
    args = parser.parse_args()
    if args.replay_only:
        replay_run()
        return
    budget = 20_000 if args.quick else 100_000
    widths = (10, 100)
    runs: dict[str, list[dict[int, float]]] = {"off": [], "on": []}
    for turn in range(1 if args.quick else TURNS):
        for mode, size in (("off", 0), ("on", 1000)):
            runs[mode].append(one_mode(size, widths, budget))
            print(f"turn {turn + 1}, history {mode}: " + "  ".join(
                f"x{w} {r:,.0f} copies/s" for w, r in runs[mode][-1].items()), flush=True)
    for width in widths:
        ratios = [on[width] / off[width] for on, off in zip(runs["on"], runs["off"],
                                                              strict=True)]
        print(f"x{width}: history on / off = " + ", ".join(f"{r:.3f}" for r in ratios)
              + f"; median {statistics.median(ratios):.3f}")
    print(f"Redis memory per retained {len(PAYLOAD)}-byte message: "
          f"{memory_per_message(200 if args.quick else 1000):,.0f} bytes")
    replay_run()


if __name__ == "__main__":
    main()
