"""Seconds without acknowledgements after the master's node is killed -9:
gearhorn on three nodes (min_replicas = 1, Sentinel) against RabbitMQ
quorum queues on three nodes, in the same run.

    python bench/failover.py              # 3 rounds of each (about 10 minutes)
    python bench/failover.py --rounds 1

gearhorn: the scenario of tests/integration/node_loss.py with one kill, run
as its own command (three nodes on 127.0.0.2-4 in a network namespace of
its own, every server a node runs; the master's node is killed -9 and its
data deleted while producers send foreground fanouts and STOMP SENDs). The
figure is its ``answered_again_after_s``: from the kill to the first
acknowledgement after it.

RabbitMQ: bench/rabbit_cluster.py's three nodes on this machine; one quorum
queue led by the first node (declared there); a producer on the second node
sends ``persistent:true`` with a receipt, one at a time (a receipt comes once
a majority confirmed the message), and the first node, the queue's leader,
is killed -9. The figure is the time from the kill to the first receipt
after it. Both are the same measure: how long one producer waits, one
message at a time, when the node that held the writes is lost.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time

import stomp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import rabbit_cluster  # noqa: E402
import stomp_bridge  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gearhorn_round(seed: int) -> float | None:
    """One master's node lost: seconds until the next acknowledgement."""
    done = subprocess.run([sys.executable, "-m", "tests.integration.node_loss", "--kills", "1",
                           "--seed", str(seed), "--json"], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"node_loss failed: {done.stderr[-2000:]}")
    for line in done.stdout.splitlines():
        if line.startswith("killed"):
            print(f"    node_loss --seed {seed}: {line}", flush=True)
    figures = json.loads(lines[-1])
    if any(figures["lost"].values()):
        raise SystemExit(f"gearhorn lost acknowledged copies: {figures['lost']}")
    return figures["outages"][0]["answered_again_after_s"]


class Receipts(stomp.ConnectionListener):
    """The time of every receipt."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}
        self.errors: list[str] = []
        self.changed = threading.Condition()

    def on_error(self, frame) -> None:
        self.errors.append(frame.headers.get("message", "ERROR"))

    def on_receipt(self, frame) -> None:
        with self.changed:
            self.times[frame.headers["receipt-id"]] = time.monotonic()
            self.changed.notify_all()

    def wait(self, receipt: str, timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: receipt in self.times, timeout)


def connect(port: int, listener: stomp.ConnectionListener | None = None) -> stomp.Connection12:
    connection = stomp_bridge.connect(port, rabbit_cluster.Brokers.login)
    if listener is not None:
        connection.set_listener("r", listener)
    return connection


def rabbitmq_round(kill_after: float) -> float | None:
    """The quorum queue's leader node lost: seconds until the next receipt."""
    with rabbit_cluster.Brokers(3) as cluster:
        leader, survivor = cluster.nodes[0], cluster.nodes[1]
        setup = connect(leader.port)  # declared on the first node: it leads the queue
        setup.subscribe("/queue/failover", id="declare", ack="client",
                        headers={"durable": "true", "auto-delete": "false",
                                 "x-queue-type": "quorum"})
        setup.disconnect()
        receipts = Receipts()
        producer = connect(survivor.port, receipts)
        killed_at: float | None = None
        started = time.monotonic()
        count = 0
        deadline = started + kill_after + 120
        while time.monotonic() < deadline:
            count += 1
            receipt = f"m{count}"
            try:
                producer.send("/amq/queue/failover", b"x" * 100,
                              headers={"persistent": "true", "receipt": receipt})
            except stomp.exception.StompException as error:
                print(f"  RabbitMQ: the producer's SEND failed: {error!r}", flush=True)
                break
            answered = receipts.wait(receipt, 60)
            if killed_at is not None and answered:
                producer.disconnect()
                return receipts.times[receipt] - killed_at
            if killed_at is None and time.monotonic() - started > kill_after:
                os.killpg(leader.process.pid, signal.SIGKILL)
                killed_at = time.monotonic()
        print(f"  RabbitMQ: no receipt after the kill in {deadline - started:.0f} s "
              f"(errors: {receipts.errors or 'none'})", flush=True)
        producer.disconnect()
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"seconds without acknowledgements after the master's node is killed -9 "
          f"({os.cpu_count()} cores, one producer, one message at a time)", flush=True)
    ours, theirs = [], []
    for turn in range(args.rounds):  # alternating: noise shows in both
        ours.append(gearhorn_round(seed=turn + 1))
        print(f"  round {turn + 1}: gearhorn (Sentinel, min_replicas = 1) {ours[-1]} s",
              flush=True)
        if rabbit_cluster.installed():
            theirs.append(rabbitmq_round(kill_after=5.0))
            print(f"  round {turn + 1}: RabbitMQ quorum queue (3 nodes) {theirs[-1]} s",
                  flush=True)
    known = [s for s in ours if s is not None]
    line = f"  median: gearhorn {statistics.median(known):.2f} s" if known else "  gearhorn: none"
    if theirs and all(s is not None for s in theirs):
        line += f", RabbitMQ {statistics.median(theirs):.2f} s"
    elif not rabbit_cluster.installed():
        line += "; RabbitMQ: not installed (apt-get install rabbitmq-server), no comparison"
    print(line)


if __name__ == "__main__":
    main()
