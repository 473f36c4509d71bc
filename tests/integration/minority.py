"""The master's node cut off from the other two: the scenario of
tests/integration/test_node_loss.py's partition test
(``python -m tests.integration.minority --json``).

The three nodes of tests/integration/node_loss.py, each in a network
namespace of its own (10.0.2.2, 10.0.3.2, 10.0.4.2, joined through the
namespace this script runs in, which forwards between them), so that
nftables can drop what crosses between one node and the others: on one
loopback every client connects from 127.0.0.1, and a node's traffic could
not be told from another's. The producer, here, reaches every node
throughout. While the master's node is cut off, the other two promote a
replica; fanouts sent to the cut-off node must not be acknowledged (its
Redis has no replica to confirm them), and after the heal every
acknowledged id must reach both subscribers.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from tests.integration import node_loss as nl
from tests.integration.node_loss import NODES_IN_NAMESPACES, Acknowledged, Node

TABLE = "gearhorn_minority"
GIVE_UP_AFTER = 10.0  # s a producer waits for one fanout's answer (barrier_timeout is 5)


def make_namespaces(tag: str) -> list[str]:
    """A namespace per node with a veth to this one; forwarding between them."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    subprocess.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"], check=True)
    names = []
    for address in NODES_IN_NAMESPACES:
        n = address.split(".")[2]
        name = f"gh{tag}-{n}"
        commands = [
            ["ip", "netns", "add", name],
            ["ip", "link", "add", f"gh{n}", "type", "veth", "peer", "name", "eth0", "netns", name],
            ["ip", "addr", "add", f"10.0.{n}.1/24", "dev", f"gh{n}"],
            ["ip", "link", "set", f"gh{n}", "up"],
            ["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"],
            ["ip", "netns", "exec", name, "ip", "addr", "add", f"{address}/24", "dev", "eth0"],
            ["ip", "netns", "exec", name, "ip", "link", "set", "eth0", "up"],
            ["ip", "netns", "exec", name, "ip", "route", "add", "default", "via", f"10.0.{n}.1"]]
        names.append(name)
        for command in commands:
            subprocess.run(command, check=True)
    return names


def remove_namespaces(names: list[str]) -> None:
    for name in names:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def cut_off(address: str) -> None:
    """Drop what crosses between ``address`` and the other nodes (not this
    namespace's own traffic to it: the producer still reaches it)."""
    others = "{ " + ", ".join(a for a in NODES_IN_NAMESPACES if a != address) + " }"
    rules = [f"add table inet {TABLE}",
             f"add chain inet {TABLE} relay {{ type filter hook forward priority 0 ; }}",
             f"add rule inet {TABLE} relay ip saddr {address} ip daddr {others} drop",
             f"add rule inet {TABLE} relay ip saddr {others} ip daddr {address} drop"]
    for rule in rules:
        subprocess.run(["nft", rule], check=True)


def heal() -> None:
    subprocess.run(["nft", "delete", "table", "inet", TABLE], check=True)


class Sent:
    """Each fanout: (node, sent, answered or None)."""

    def __init__(self) -> None:
        self.fanouts: list[tuple[str, float, float | None]] = []
        self.lock = threading.Lock()


def producer(node: str, acked: Acknowledged, sent: Sent, stop: threading.Event) -> None:
    """Foreground fanouts to ``node``, one at a time, a fresh connection each."""
    count = 0
    while not stop.is_set():
        count += 1
        message_id = f"g{node.split('.')[2]}-{count}"
        started = time.monotonic()
        # A fanout grabbed by the cut-off node's worker just before the cut
        # stays assigned to it in gearmand until the heal: a producer gives
        # up after a while and sends the next, as a user's would.
        ok = nl.fanout_once(node, message_id, wait=GIVE_UP_AFTER)
        if ok:
            acked.add(message_id)
        with sent.lock:
            sent.fanouts.append((node, started, time.monotonic() if ok else None))
        if not ok:
            time.sleep(0.02)


def run(seconds: float, seed: int) -> dict:
    rng = random.Random(seed)
    names = make_namespaces(str(os.getpid()))
    root = tempfile.mkdtemp(prefix="minority-")
    nodes = [Node(a, root, True, netns=n) for a, n in zip(nl.NODES, names, strict=True)]
    try:
        for node in nodes:
            node.start_redis(None if node is nodes[0] else nodes[0].address)
        for node in nodes:
            node.start_sentinel(nodes[0].address)
        nl.wait_until(lambda: nl.role(nl.NODES[0]).get("min_slaves_good_slaves") == 2, 60,
                      "both replicas to sync")
        for node in nodes:
            node.start_gearhorn(nl.sentinel_url())
        nl.subscribe_all()
        acked, sent, stop = Acknowledged(), Sent(), threading.Event()
        threads = [threading.Thread(target=producer, args=(a, acked, sent, stop), daemon=True)
                   for a in nl.NODES]
        for thread in threads:
            thread.start()
        nl.wait_until(lambda: len(acked.ids) >= 50, 120, "the first acknowledgements")
        time.sleep(rng.uniform(0.5, 3.0))
        minority = nl.current_master(nodes)
        majority = [n for n in nodes if n.address != minority]
        cut_off(minority)
        cut_at = time.monotonic()  # once every rule is in
        promoted = nl.wait_until(lambda: (m := nl.current_master(majority)) != minority and m,
                                 60, "the majority to promote a replica")
        time.sleep(seconds)
        healed_at = time.monotonic()
        heal()
        nl.wait_until(lambda: nl.role(minority).get("role") == "slave", 90,
                      f"{minority} to become a replica of {promoted}")
        time.sleep(3)
        stop.set()
        for thread in threads:
            thread.join(60)
        with sent.lock:
            fanouts = list(sent.fanouts)
        # Answered by the cut-off node from a second after the cut to the heal.
        minority_acks = [f for f in fanouts if f[0] == minority and f[2] is not None
                         and cut_at + 1 < f[2] < healed_at]
        majority_after = [f[2] - cut_at for f in fanouts if f[0] != minority
                          and f[2] is not None and f[1] > cut_at and f[2] < healed_at]
        figures = nl._delivered(acked, [], seed, [n.address for n in nodes])
        figures.update(minority=minority, promoted=promoted,
                       # fanouts to the cut-off node unanswered at the cut, or sent during it
                       minority_sent=sum(1 for f in fanouts if f[0] == minority and f[1] < healed_at
                                         and (f[2] is None or f[2] > cut_at)),
                       minority_acknowledged=len(minority_acks),
                       majority_answered_after_s=round(min(majority_after), 2)
                       if majority_after else None)
        print(f"cut off {minority} (the master) for {seconds:g}s; {promoted} promoted; "
              f"{figures['minority_sent']} fanouts sent to the cut-off node, "
              f"{len(minority_acks)} acknowledged; the majority answered again after "
              f"{figures['majority_answered_after_s']}s", flush=True)
        return figures
    finally:
        subprocess.run(["nft", "delete", "table", "inet", TABLE], capture_output=True)
        for node in nodes:
            node.kill(keep=bool(os.environ.get("GEARHORN_NODE_LOSS_KEEP")))
        remove_namespaces(names)
        if not os.environ.get("GEARHORN_NODE_LOSS_KEEP"):
            shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description="the master's node cut off from the others")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not os.environ.get("GEARHORN_MINORITY_NETNS"):
        # Its own network and mount namespaces: nothing it drops or names leaves them.
        unshare = ["unshare", "-nm", "--propagation", "private"]
        if os.geteuid() != 0:
            unshare.insert(1, "-r")
        done = subprocess.run([*unshare, sys.executable, "-m", "tests.integration.minority",
                               *sys.argv[1:]], cwd=nl.ROOT,
                              env={**os.environ, "GEARHORN_MINORITY_NETNS": "1"})
        raise SystemExit(done.returncode)
    nl.NODES = NODES_IN_NAMESPACES
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    figures = run(args.seconds, seed)
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
