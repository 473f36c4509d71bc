"""Seconds without acknowledgements after the master's node is lost, two
ways: killed (-9: its sockets close at once) and silent (frozen, and every
packet to and from it dropped: a power loss or a pulled cable, as the
others see it). gearhorn on three nodes (``gearhorn node``: Sentinel,
min_replicas = 1) against RabbitMQ quorum queues on three nodes, in the
same run.

    python bench/failover.py              # 3 rounds of each (about 20 minutes)
    python bench/failover.py --rounds 1

gearhorn: the scenario of tests/integration/node_loss.py with one loss, run
as its own command (three nodes, a network namespace each, every server a
node runs; the master's node is lost while producers send foreground
fanouts and STOMP SENDs to every node). The figure is its
``answered_again_after_s``: from the loss to the first acknowledgement of
a message sent after it; beside it, when the Sentinels named a new master,
and the copies received twice.

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
import contextlib
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
TABLE = "gearhorn_bench_silent"


def gearhorn_round(seed: int, mode: str) -> dict:
    """One master's node lost (``mode``: kill or silent): its outage's
    figures and the copies received twice."""
    done = subprocess.run([sys.executable, "-m", "tests.integration.node_loss", "--modes", mode,
                           "--seed", str(seed), "--json"], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"node_loss failed: {done.stderr[-2000:]}")
    for line in done.stdout.splitlines():
        if line.startswith(mode):
            print(f"    node_loss --seed {seed}: {line}", flush=True)
    figures = json.loads(lines[-1])
    if any(figures["lost"].values()):
        raise SystemExit(f"gearhorn lost acknowledged copies: {figures['lost']}, among them "
                         f"{figures['missing']} (GEARHORN_NODE_LOSS_KEEP=1 keeps the nodes' "
                         f"logs)\n{done.stderr[-4000:]}")
    return {**figures["outages"][0], "twice": sum(figures["twice"].values())}


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


def silence(node: rabbit_cluster.Node) -> None:
    """Freeze ``node`` and drop every packet to and from its ports."""
    os.killpg(node.process.pid, signal.SIGSTOP)
    ports = ", ".join(str(p) for p in node.ports)
    subprocess.run(["nft", f"add table inet {TABLE}"], check=True)
    for hook in ("input", "output"):
        subprocess.run(["nft", f"add chain inet {TABLE} {hook} "
                               f"{{ type filter hook {hook} priority 0 ; }}"], check=True)
        for side in ("sport", "dport"):
            subprocess.run(["nft", f"add rule inet {TABLE} {hook} tcp {side} {{ {ports} }} "
                                   "drop"], check=True)


def heal() -> None:
    subprocess.run(["nft", "delete", "table", "inet", TABLE], capture_output=True)


def rabbitmq_round(kill_after: float, mode: str) -> float | None:
    """The quorum queue's leader node lost (``mode``: kill or silent):
    seconds until the next receipt."""
    with rabbit_cluster.Brokers(3) as cluster:
        leader, survivor = cluster.nodes[0], cluster.nodes[1]
        try:
            return _rabbitmq_loss(cluster, leader, survivor, kill_after, mode)
        finally:
            heal()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(leader.process.pid, signal.SIGCONT)


def _rabbitmq_loss(cluster, leader, survivor, kill_after: float, mode: str) -> float | None:
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
    deadline = started + kill_after + 180
    while time.monotonic() < deadline:
        count += 1
        receipt = f"m{count}"
        try:
            producer.send("/amq/queue/failover", b"x" * 100,
                          headers={"persistent": "true", "receipt": receipt})
        except stomp.exception.StompException as error:
            print(f"  RabbitMQ: the producer's SEND failed: {error!r}", flush=True)
            break
        answered = receipts.wait(receipt, 180)
        if killed_at is not None and answered:
            producer.disconnect()
            return receipts.times[receipt] - killed_at
        if killed_at is None and time.monotonic() - started > kill_after:
            if mode == "silent":
                silence(leader)
            else:
                os.killpg(leader.process.pid, signal.SIGKILL)
            killed_at = time.monotonic()
    print(f"  RabbitMQ: no receipt after the loss in {deadline - started:.0f} s "
          f"(errors: {receipts.errors or 'none'})", flush=True)
    producer.disconnect()
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="kill,silent")
    args = parser.parse_args()
    print(f"seconds without acknowledgements after the master's node is lost "
          f"({os.cpu_count()} cores, producers sending one message at a time)", flush=True)
    for mode in args.modes.split(","):
        ours, theirs = [], []
        for turn in range(args.rounds):  # alternating: noise shows in both
            ours.append(gearhorn_round(turn + 1, mode))
            o = ours[-1]
            print(f"  {mode}, round {turn + 1}: gearhorn (Sentinel, min_replicas = 1) "
                  f"{o['answered_again_after_s']} s (a replica promoted after "
                  f"{o['failover_after_s']} s; {o['twice']} copies twice)", flush=True)
            if rabbit_cluster.installed():
                theirs.append(rabbitmq_round(5.0, mode))
                print(f"  {mode}, round {turn + 1}: RabbitMQ quorum queue (3 nodes) "
                      f"{theirs[-1]} s", flush=True)
        known = [o["answered_again_after_s"] for o in ours
                 if o["answered_again_after_s"] is not None]
        line = (f"  {mode}: median gearhorn {statistics.median(known):.2f} s" if known
                else f"  {mode}: gearhorn none")
        if theirs and all(s is not None for s in theirs):
            line += f", RabbitMQ {statistics.median(theirs):.2f} s"
        elif not rabbit_cluster.installed():
            line += "; RabbitMQ: not installed (apt-get install rabbitmq-server)"
        print(line, flush=True)


if __name__ == "__main__":
    main()
