"""The master's node cut off from the other two: the scenario of
tests/integration/test_node_loss.py's partition test
(``python -m tests.integration.minority --json``).

The three nodes of tests/integration/node_loss.py (``gearhorn node`` each,
in a network namespace of its own: tests/integration/netns.py), so that
nftables can drop what crosses between one node and the others. The
producer, here, reaches every node throughout. While the master's node is
cut off, the other two promote a replica; fanouts sent to the cut-off node
must not be acknowledged (its Redis has no replica to confirm them), and
after the heal every acknowledged id must reach both subscribers.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time

from tests.integration import netns
from tests.integration import node_loss as nl
from tests.integration.node_loss import NODES, Acknowledged

GIVE_UP_AFTER = 10.0  # s a producer waits for one fanout's answer (barrier_timeout is 5)
PROBE_EVERY = 0.25  # s between the probes of the majority after the cut


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


class Probes:
    """Fanouts to the majority's gearmand, a new one every PROBE_EVERY
    seconds from the cut on, each on a thread of its own: a producer whose
    fanout the cut-off node's worker had grabbed waits GIVE_UP_AFTER for it,
    and when every producer of the majority was caught so, the first answer
    measured the producers' patience instead of the majority's."""

    def __init__(self, majority: list[str], acked: Acknowledged) -> None:
        self.majority, self.acked = majority, acked
        self.answered: list[float] = []
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()

    def run(self, stop: threading.Event) -> None:
        count = 0
        while not stop.is_set() and not self.answered:
            count += 1
            node = self.majority[count % len(self.majority)]
            thread = threading.Thread(target=self._one, args=(node, f"p{count}"), daemon=True)
            thread.start()
            self.threads.append(thread)
            stop.wait(PROBE_EVERY)

    def join(self) -> None:
        for thread in self.threads:
            thread.join(GIVE_UP_AFTER + 5)

    def _one(self, node: str, message_id: str) -> None:
        if nl.fanout_once(node, message_id, wait=GIVE_UP_AFTER):
            self.acked.add(message_id)
            with self.lock:
                self.answered.append(time.monotonic())


def run(seconds: float, seed: int) -> dict:
    rng = random.Random(seed)
    with nl.three_nodes("minority-") as nodes:
        nl.start_three(nodes)
        nl.subscribe_all(NODES[0])
        acked, sent, stop = Acknowledged(), Sent(), threading.Event()
        threads = [threading.Thread(target=producer, args=(a, acked, sent, stop), daemon=True)
                   for a in NODES]
        for thread in threads:
            thread.start()
        nl.wait_until(lambda: len(acked.ids) >= 50, 120, "the first acknowledgements")
        time.sleep(rng.uniform(0.5, 3.0))
        minority = nl.current_master(NODES)
        majority = [a for a in NODES if a != minority]
        netns.cut_off(minority)
        cut_at = time.monotonic()  # once every rule is in
        probes, probing = Probes(majority, acked), threading.Event()
        prober = threading.Thread(target=probes.run, args=(probing,), daemon=True)
        prober.start()
        promoted = nl.wait_until(lambda: (m := nl.current_master(majority)) != minority and m,
                                 60, "the majority to promote a replica")
        time.sleep(seconds)
        probing.set()
        prober.join(10)
        healed_at = time.monotonic()
        netns.heal()
        nl.wait_until(lambda: nl.role(minority).get("role") == "slave", 90,
                      f"{minority} to become a replica of {promoted}")
        time.sleep(3)
        stop.set()
        for thread in threads:
            thread.join(60)
        probes.join()
        with sent.lock:
            fanouts = list(sent.fanouts)
        # Answered by the cut-off node from a second after the cut to the heal.
        minority_acks = [f for f in fanouts if f[0] == minority and f[2] is not None
                         and cut_at + 1 < f[2] < healed_at]
        with probes.lock:
            majority_after = [t - cut_at for t in probes.answered if t < healed_at]
        figures = nl.delivered(acked, [], seed, "cut off")
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
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    figures = run(args.seconds, seed)
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
