"""Seconds until fanouts are answered again after a partition heals.

    python bench/partition.py                   # Redis's port, then gearmand's, 20 s each
    python bench/partition.py --rounds 3 --seconds 20 --json

It runs inside a network namespace of its own (it starts itself again
under ``unshare -n`` when it is not in one), so nothing it drops leaves
that namespace: ``gearhorn up`` on loopback there, a producer that opens a
fresh Gearman connection for each foreground fanout (10 a second, each
waiting up to 30 s for its answer), and nftables rules that drop every
packet to and from one server's port for ``--seconds``. For each heal it
prints how long until the first fanout was answered after it, and at the
end whether every acknowledged fanout's copy was delivered (checked by id).
The suite runs it too (tests/integration/test_partitions.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import stomp

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, ROOT)

from gearhorn import gearman  # noqa: E402
from gearhorn.gearman import GearmanError, P  # noqa: E402
from gearhorn.runtime.children import die_with_parent  # noqa: E402
from gearhorn.supervision import servers  # noqa: E402

INSIDE = "GEARHORN_BENCH_IN_NETNS"
TABLE = "gearhorn_partition"


def in_own_namespace() -> None:
    """Run this script again inside a new network namespace (root, or an
    unprivileged user namespace), with loopback up; never returns."""
    if os.environ.get(INSIDE):
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
        return
    unshare = ["unshare", "-n"] if os.geteuid() == 0 else ["unshare", "-rn"]
    done = subprocess.run([*unshare, sys.executable, *sys.argv], env={**os.environ, INSIDE: "1"})
    raise SystemExit(done.returncode)


def drop(port: int) -> None:
    """Every packet to or from ``port`` dropped (loopback passes the output hook)."""
    rules = [f"add table inet {TABLE}",
             f"add chain inet {TABLE} out {{ type filter hook output priority 0 ; }}",
             f"add rule inet {TABLE} out tcp dport {port} drop",
             f"add rule inet {TABLE} out tcp sport {port} drop"]
    for rule in rules:
        subprocess.run(["nft", *rule.split()], check=True)


def heal() -> None:
    subprocess.run(["nft", "delete", "table", "inet", TABLE], check=True)


class Producer:
    """A foreground fanout every ``every`` seconds, each on a fresh
    connection: (sent, answered, ok, id) for each."""

    def __init__(self, port: int, topic: str, every: float = 0.1) -> None:
        self.port, self.topic, self.every = port, topic, every
        # (sent, answered, ok, id); ok None: dropped unanswered (STOMP only)
        self.results: list[tuple[float, float, bool | None, str]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._count = 0
        self._sent_times: list[float] = []

    def start(self) -> None:
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._count += 1
            thread = threading.Thread(target=self._one, args=(f"m{self._count}",), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _one(self, message_id: str) -> None:
        sent, ok = time.monotonic(), False
        with self._lock:
            self._sent_times.append(sent)
        body = json.dumps({"topic": self.topic, "payload": message_id, "background": True})
        connection = gearman.Connection("127.0.0.1", self.port, connect_timeout=0.5)
        try:
            connection.open()
            connection.send(gearman.encode(P.SUBMIT_JOB, b"fanout", message_id.encode(),
                                           body.encode()))
            deadline = sent + 30
            while time.monotonic() < deadline:
                packet = connection.read(deadline)
                if packet is None or packet.type in (P.WORK_FAIL, P.WORK_EXCEPTION):
                    break
                if packet.type == P.WORK_COMPLETE:
                    ok = json.loads(packet.args[-1]).get("copies") == 1
                    break
        except (GearmanError, OSError, ValueError):
            pass
        finally:
            connection.close()
        with self._lock:
            self.results.append((sent, time.monotonic(), ok, message_id))

    def first_answer_after(self, moment: float, timeout: float = 90.0) -> float | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                after = [answered for _, answered, ok, _ in self.results
                         if ok and answered > moment]
            if after:
                return min(after) - moment
            time.sleep(0.02)
        return None

    def all_answered_after(self, moment: float, window: float = 1.0,
                           timeout: float = 90.0) -> float | None:
        """Seconds from ``moment`` until every fanout sent in the ``window``
        after it was answered (a connection still waiting out a backoff
        delays some); None if one failed."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                sent_then = [(answered, ok) for sent, answered, ok, _ in self.results
                             if moment <= sent <= moment + window and ok is not None]
                due = sum(1 for t in self._sent_times if moment <= t <= moment + window) - sum(
                    1 for sent, _, ok, _ in self.results
                    if ok is None and moment <= sent <= moment + window)
            if sent_then and len(sent_then) >= due and time.monotonic() > moment + window:
                if not all(ok for _, ok in sent_then):
                    return None
                return max(answered for answered, _ in sent_then) - moment
            time.sleep(0.05)
        return None

    def stop(self) -> set[str]:
        """Stop sending, wait for the answers due; the ids acknowledged."""
        self._stop.set()
        for thread in self._threads:
            thread.join(40)
        return {message_id for _, _, ok, message_id in self.results if ok}


class StompProducer(Producer):
    """A SEND to ``/queue/<queue>`` with a receipt every ``every`` seconds,
    on one connection to the bridge (opened again after an ERROR)."""

    def __init__(self, port: int, queue: str, every: float = 0.1) -> None:
        super().__init__(port, queue, every)
        self._sent: dict[str, float] = {}
        self._connection: stomp.Connection12 | None = None

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self._count += 1
            message_id = f"s{self._count}"
            sent = time.monotonic()
            with self._lock:
                self._sent_times.append(sent)
                self._sent[message_id] = sent
            try:
                self._send(message_id)
            except (stomp.exception.StompException, OSError):
                self._answered(message_id, False)
                self._connection = None

    def _send(self, message_id: str) -> None:
        if self._connection is None or not self._connection.is_connected():
            self._connection = stomp.Connection12([("127.0.0.1", self.port)],
                                                  heartbeats=(0, 0), auto_decode=False)
            self._connection.set_listener("receipts", Receipts(self))
            self._connection.connect(wait=True)
        self._connection.send(destination=f"/queue/{self.topic}", body=message_id,
                              receipt=message_id)

    def _answered(self, message_id: str, ok: bool | None) -> None:
        with self._lock:
            sent = self._sent.pop(message_id, None)
            if sent is not None:
                self.results.append((sent, time.monotonic(), ok, message_id))

    def stop(self) -> set[str]:
        self._stop.set()
        deadline = time.monotonic() + 40
        while self._sent and time.monotonic() < deadline:
            time.sleep(0.05)
        if self._connection is not None:
            self._connection.disconnect()
        return {message_id for _, _, ok, message_id in self.results if ok}


class Receipts(stomp.ConnectionListener):
    def __init__(self, producer: StompProducer) -> None:
        self.producer = producer

    def on_receipt(self, frame: stomp.utils.Frame) -> None:
        self.producer._answered(frame.headers["receipt-id"], True)

    def on_error(self, frame: stomp.utils.Frame) -> None:
        receipt = frame.headers.get("receipt-id")
        if receipt:
            self.producer._answered(receipt, False)

    def on_disconnected(self) -> None:
        """What had no RECEIPT is not acknowledged. An ERROR closes the
        connection (STOMP), so the SENDs behind the one it answers are
        dropped unanswered (None): neither acknowledged nor refused."""
        with self.producer._lock:
            waiting = list(self.producer._sent)
        for message_id in waiting:
            self.producer._answered(message_id, None)


def delivered(port: int, queue: str, expected: int, timeout: float = 120.0) -> set[str]:
    """Take every copy in ``queue`` as a plain Gearman worker, answering each."""
    got: set[str] = set()
    worker = gearman.WorkerConnection("127.0.0.1", port, [queue], client_id="partition-check")
    worker.open()
    deadline = time.monotonic() + timeout
    try:
        while len(got) < expected and time.monotonic() < deadline:
            jobs = worker.grab(100)
            for job in jobs:
                got.add(job.data.decode())
                worker.complete(job.handle)
            if not jobs:
                time.sleep(0.05)
    finally:
        worker.close()
    return got


def text_of(path: str) -> str:
    with open(path, errors="replace") as fp:
        return fp.read()


def start_up(tmp: str) -> tuple[subprocess.Popen, dict[str, int]]:
    ports = {name: servers.free_port() for name in ("redis", "gearman", "stomp")}
    log_path = os.path.join(tmp, "up.log")
    with open(log_path, "ab") as log:
        up = subprocess.Popen(
            [sys.executable, "-m", "gearhorn", "up", "--processes", "2", "--data-dir",
             os.path.join(tmp, "data"), "--redis-url", f"redis://127.0.0.1:{ports['redis']}/0",
             "--gearman", f"127.0.0.1:{ports['gearman']}"],
            env={**os.environ, "PYTHONPATH": ROOT, "GEARHORN_BRIDGE_PORT": str(ports["stomp"]),
                 "GEARHORN_BRIDGE_WS_PORT": "0", "GEARHORN_WEB_PORT": "0"},
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=die_with_parent)
    deadline = time.monotonic() + 120
    while "gearhorn is up" not in text_of(log_path):
        if up.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"gearhorn up did not start: {text_of(log_path)[-3000:]}")
        time.sleep(0.1)
    return up, ports


def subscribe(port: int, topic: str, client_id: str) -> None:
    connection = gearman.Connection("127.0.0.1", port)
    connection.open()
    body = json.dumps({"topic": topic, "client_id": client_id}).encode()
    connection.send(gearman.encode(P.SUBMIT_JOB, b"subscribe_fanout", b"", body))
    deadline = time.monotonic() + 60
    while (packet := connection.read(deadline)) is not None:
        if packet.type == P.WORK_COMPLETE:
            break
        if packet.type in (P.WORK_FAIL, P.WORK_EXCEPTION):
            raise SystemExit(f"subscribe failed: {packet.args}")
    connection.close()


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 2)


def _said(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:.2f}s"


def run(rounds: int, seconds: float, targets: list[str]) -> dict:
    tmp = tempfile.mkdtemp(prefix="bench-partition-", dir=os.getcwd())
    up, ports = start_up(tmp)
    topic, heals = "partitioned", []
    try:
        subscribe(ports["gearman"], topic, "alice")  # away: every copy stays held
        producers = {"fanout": Producer(ports["gearman"], topic),
                     "STOMP": StompProducer(ports["stomp"], "partitioned-sends")}
        for producer in producers.values():
            producer.start()
        for _ in range(rounds):
            for target in targets:
                time.sleep(3)  # steady traffic before the cut
                drop(ports[target])
                time.sleep(seconds)  # the partition's length: the experiment itself
                healed = time.monotonic()
                heal()
                for name, producer in producers.items():
                    resumed = producer.first_answer_after(healed)
                    settled = producer.all_answered_after(healed)
                    heals.append({"target": target, "producer": name, "partition_s": seconds,
                                  "resumed_after_s": _rounded(resumed),
                                  "all_answered_after_s": _rounded(settled)})
                    print(f"{target:8} cut {seconds:g}s, {name:6}: first answer "
                          f"{_said(resumed)} after the heal; all sent in the second after it "
                          f"answered by {_said(settled)}", flush=True)
        missing = []
        for producer, queue in ((producers["fanout"], f"{topic}_alice"),
                                (producers["STOMP"], "partitioned-sends")):
            acknowledged = producer.stop()
            got = delivered(ports["gearman"], queue, len(acknowledged))
            missing += sorted(acknowledged - got)
            print(f"{queue}: acknowledged {len(acknowledged)}, delivered "
                  f"{len(got & acknowledged)}, missing {len(acknowledged - got)}", flush=True)
        return {"heals": heals, "missing": missing[:20],
                "acknowledged": sum(len(p.results) for p in producers.values())}
    finally:
        subprocess.run(["nft", "delete", "table", "inet", TABLE], capture_output=True)
        os.killpg(up.pid, signal.SIGINT)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--targets", default="redis,gearman")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON last")
    args = parser.parse_args()
    in_own_namespace()
    figures = run(args.rounds, args.seconds, args.targets.split(","))
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
