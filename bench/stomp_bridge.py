"""STOMP throughput and latency: gearhorn's bridge and RabbitMQ, same client, same run.

    python bench/stomp_bridge.py              # 3,000 topic messages x 10 subscribers
    python bench/stomp_bridge.py --quick      # fewer messages

Starts redis-server, gearmand, a worker pool and the bridge on free loopback
ports, and, when Debian's rabbitmq-server is installed, a private RabbitMQ
node with the STOMP plugin on loopback (its own data folder, stopped at the
end); says so when it is not installed. Then, for each broker:

- topic: 1 producer, 10 subscribers (each its own process and connection,
  stomp.py, auto ack): deliveries per second and p50/p99 latency from SEND to
  receipt by the subscriber;
- queue: 1 producer and 1 consumer acking each message (client-individual,
  prefetch 100): messages sent and acked per second.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import redis
import stomp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import rabbit_cluster  # noqa: E402
from proctree import tree_cpu_seconds  # noqa: E402

from gearhorn.runtime.children import die_with_parent  # noqa: E402
from gearhorn.store.keys import Keys  # noqa: E402
from gearhorn.store.registry import Registry  # noqa: E402
from gearhorn.supervision import servers  # noqa: E402

SUBSCRIBERS = 10


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (``pgrep -P``)."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


class Counter(stomp.ConnectionListener):
    def __init__(self, expected: int, conn=None, ack: bool = False) -> None:
        self.expected, self.conn, self.ack = expected, conn, ack
        self.latencies: list[float] = []
        self.done = multiprocessing.Event()

    def on_message(self, frame) -> None:
        now = time.time()
        sent = float(frame.body.split(b" ", 1)[0])
        self.latencies.append(now - sent)
        if self.ack:
            self.conn.ack(frame.headers["ack"])
        if len(self.latencies) >= self.expected:
            self.done.set()


def connect(port: int, login: dict) -> stomp.Connection12:
    conn = stomp.Connection12([("127.0.0.1", port)], auto_decode=False, heartbeats=(0, 0),
                              vhost=login.get("vhost"))
    conn.connect(login.get("username"), login.get("passcode"), wait=True)
    return conn


def subscriber(port, login, destination, expected, ready, results) -> None:
    conn = connect(port, login)
    counter = Counter(expected)
    conn.set_listener("c", counter)
    conn.subscribe(destination=destination, id="1", ack="auto",
                   headers={"receipt": "sub", "prefetch-count": "1000"})
    time.sleep(0.5)  # let the subscription reach the broker before the producer starts
    ready.put(1)
    counter.done.wait(300)
    results.put((len(counter.latencies), counter.latencies[-1] if counter.latencies else 0,
                 counter.latencies))
    conn.disconnect()


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))] if ordered else float("nan")


def bench_topic(port: int, login: dict, topic: str, messages: int) -> dict:
    ctx = multiprocessing.get_context("spawn")
    ready, results = ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=subscriber, args=(port, login, f"/topic/{topic}", messages,
                                                   ready, results)) for _ in range(SUBSCRIBERS)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=60)
    producer = connect(port, login)
    start = time.time()
    for i in range(messages):
        producer.send(destination=f"/topic/{topic}", body=f"{time.time()!r} {i}".encode())
    got = [results.get(timeout=300) for _ in procs]
    end = time.time()
    producer.disconnect()
    for p in procs:
        p.join(10)
    delivered = sum(n for n, _, _ in got)
    latencies = [lat for _, _, lats in got for lat in lats]
    return {"deliveries": delivered, "rate": delivered / (end - start),
            "p50_ms": percentile(latencies, 0.5) * 1000,
            "p99_ms": percentile(latencies, 0.99) * 1000}


def bench_queue(port: int, login: dict, queue: str, messages: int) -> dict:
    consumer = connect(port, login)
    counter = Counter(messages, consumer, ack=True)
    consumer.set_listener("c", counter)
    consumer.subscribe(destination=f"/queue/{queue}", id="1", ack="client-individual",
                       headers={"prefetch-count": "100"})
    producer = connect(port, login)
    start = time.time()
    for i in range(messages):
        producer.send(destination=f"/queue/{queue}", body=f"{time.time()!r} {i}".encode())
    counter.done.wait(300)
    elapsed = time.time() - start
    producer.disconnect()
    consumer.disconnect()
    return {"messages": len(counter.latencies), "rate": len(counter.latencies) / elapsed}


class Gearhorn:
    name = "gearhorn"
    login: dict = {}

    def __init__(self, bridge_processes: int = 1) -> None:
        self.bridge_processes = bridge_processes

    def cpu_seconds(self) -> float:
        """The bridge's CPU time so far (its processes, not the workers')."""
        return tree_cpu_seconds(self.bridge.pid)

    def __enter__(self):
        self.tmp = tempfile.mkdtemp()
        self.redis = servers.start_redis()
        self.gearmand = servers.start_gearmand(data_dir=self.tmp)
        # Queues unbounded, as RabbitMQ's are by default: with its default
        # bound (10,000, drop-head) a producer that outruns its subscribers
        # loses the oldest copies, and a run would count them forever.
        # gearmand here keeps no queue: persistence none, so acknowledgements
        # wait for no queue Redis (gearhorn/store/fsync.py).
        env = {"GEARHORN_QUEUE_MAX_LENGTH": "0", "GEARHORN_PERSISTENCE": "none", **os.environ,
               "GEARHORN_LOG_LEVEL": os.environ.get("BENCH_LOG_LEVEL", "WARNING")}
        common = ["--gearman", self.gearmand.address, "--redis-url", self.redis.details["url"]]
        self.pool = subprocess.Popen([sys.executable, "-m", "gearhorn", "worker",
                                      "--processes", "2", *common], env=env,
                                     preexec_fn=die_with_parent)
        self.port, self.ws_port = servers.free_port(), servers.free_port()
        self.bridge = subprocess.Popen([sys.executable, "-m", "gearhorn", "bridge",
                                        "--port", str(self.port), "--ws-port", str(self.ws_port),
                                        "--processes", str(self.bridge_processes), *common],
                                       env=env,
                                       preexec_fn=die_with_parent)
        registry = Registry(redis.Redis.from_url(self.redis.details["url"]), Keys())
        deadline = time.monotonic() + 60
        while len(registry.live_workers()) < 2 or not all(
                servers.is_listening("127.0.0.1", port) for port in (self.port, self.ws_port)):
            if time.monotonic() > deadline:
                raise SystemExit("gearhorn did not start")
            time.sleep(0.1)
        return self

    def __exit__(self, *exc):
        for proc in (self.bridge, self.pool):
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        self.gearmand.stop()
        self.redis.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)


class RabbitMQ(rabbit_cluster.Brokers):
    """One private node (bench/rabbit_cluster.py)."""
    name = "RabbitMQ"
    # RabbitMQ takes the CONNECT host header as its virtual host.
    login = rabbit_cluster.Brokers.login

    def __init__(self) -> None:
        super().__init__(1)

    installed = staticmethod(rabbit_cluster.installed)


def run(broker_cls, topic_messages: int, queue_messages: int) -> dict:
    with broker_cls() as broker:
        tag = f"bench{os.getpid()}"
        bench_topic(broker.port, broker.login, f"{tag}warm", max(100, topic_messages // 10))
        topic = bench_topic(broker.port, broker.login, tag, topic_messages)
        queue = bench_queue(broker.port, broker.login, f"{tag}q", queue_messages)
    print(f"  {broker_cls.name:9} topic: {topic['rate']:>8,.0f} deliveries/s  "
          f"p50 {topic['p50_ms']:6.1f} ms  p99 {topic['p99_ms']:7.1f} ms  "
          f"({topic['deliveries']:,} deliveries)   queue send+ack: {queue['rate']:>7,.0f} msg/s",
          flush=True)
    return {"topic": topic, "queue": queue}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    topic_messages = 500 if args.quick else 3000
    queue_messages = 1000 if args.quick else 5000
    print(f"STOMP benchmark: 1 producer, {SUBSCRIBERS} subscribers x {topic_messages:,} topic "
          f"messages; {queue_messages:,} queue messages (stomp.py {stomp.__version__})",
          flush=True)
    ours = run(Gearhorn, topic_messages, queue_messages)
    if not RabbitMQ.installed():
        print("  RabbitMQ: not installed (apt-get install rabbitmq-server); no comparison")
        return
    theirs = run(RabbitMQ, topic_messages, queue_messages)
    topic_ratio = ours["topic"]["rate"] / theirs["topic"]["rate"]
    queue_ratio = ours["queue"]["rate"] / theirs["queue"]["rate"]
    print(f"  ratio gearhorn/RabbitMQ: topic deliveries {topic_ratio:.2f}, "
          f"queue send+ack {queue_ratio:.2f}")


if __name__ == "__main__":
    main()
