"""``gearhorn worker`` and ``gearhorn bridge`` beside the gearmand and Redis
a team already runs, with no settings but where they are (README's "Running
it for real"): a gearmand with no queue options, a Redis with no AOF.

Every answer comes: the stock ``gearman`` CLI subscribes, fans out in the
background and in the foreground with a receiver running, and consumes;
stomp.py SENDs with a receipt to a topic with a STOMP subscriber. The start
says in one line what an acknowledgement covers there, and ``gearhorn
status`` says the same. A barrier that goes away mid-run fails the waiting
fanouts with the reason within ``barrier_timeout``, and the pool serves
again once it is back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from gearhorn.runtime.children import die_with_parent
from gearhorn.supervision import servers

from .helpers import ChildProcess, GearClient, gearman_cli, unique_topic, wait_for
from .stomp_helpers import StompClient

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

# The documented default (config's barrier_timeout).
BARRIER_TIMEOUT = 5.0


def gearhorn_env(gearmand, redis_url, **more):
    """Only where the servers are, as a user sets it (nothing inherited)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GEARHORN_")}
    return {**env, "GEARHORN_GEARMAN": gearmand.address, "GEARHORN_REDIS_URL": redis_url,
            **more}


class Started(ChildProcess):
    """A ``gearhorn`` command with exactly the environment given."""

    def __init__(self, argv, log_path, env):
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "gearhorn", *argv],
                                            stdout=log, stderr=subprocess.STDOUT, env=env,
                                            preexec_fn=die_with_parent)


@pytest.fixture
def plain_servers(tmp_path):
    """gearmand with no queue options and a Redis with no AOF."""
    gearmand = servers.start_gearmand(data_dir=str(tmp_path / "gearmand"))
    plain_redis = servers.start_redis()
    yield gearmand, plain_redis.details["url"]
    gearmand.stop()
    plain_redis.stop()


def start_worker(tmp_path, env, processes=2):
    worker = Started(["worker", "--processes", str(processes)], str(tmp_path / "worker.log"),
                     env)
    gearmand = env["GEARHORN_GEARMAN"]
    host, port = gearmand.rsplit(":", 1)

    def ready():
        assert worker.process.poll() is None, f"worker exited:\n{worker.log()}"
        from gearhorn import gearman
        table = {f.name: f for f in gearman.status(host, int(port))}
        return "fanout" in table and table["fanout"].workers >= processes
    wait_for(ready, 60, message="the worker pool on gearmand")
    return worker


def cli_json(gearmand, function, payload, timeout=30.0):
    done = gearman_cli(gearmand, "-f", function, json.dumps(payload), timeout=timeout)
    assert done.returncode == 0, (done.stdout, done.stderr)
    return json.loads(done.stdout)


def test_the_worker_and_bridge_answer_beside_a_plain_gearmand(plain_servers, tmp_path,
                                                              gearman_cli_tool):
    gearmand, redis_url = plain_servers
    env = gearhorn_env(gearmand, redis_url)
    worker = start_worker(tmp_path, env)
    bridge_port = servers.free_port()
    bridge = Started(["bridge", "--port", str(bridge_port), "--ws-port", "0"],
                     str(tmp_path / "bridge.log"), env)
    try:
        topic = unique_topic("fg")
        for client_id in ("alice", "bob"):
            answer = cli_json(gearmand, "subscribe_fanout", {"topic": topic,
                                                             "client_id": client_id})
            assert answer["client_id"] == client_id
        # Read your writes, 25 times: each new subscriber gets the fanout after it.
        for n in range(25):
            cli_json(gearmand, "subscribe_fanout", {"topic": topic, "client_id": f"r{n}"})
            assert cli_json(gearmand, "fanout", {"topic": topic, "payload": n,
                                                 "background": True})["copies"] == 3 + n
        background = cli_json(gearmand, "fanout", {"topic": topic, "payload": "bg",
                                                   "background": True})
        assert background["copies"] == 27
        # A foreground fanout with a receiver running: completes when it answered.
        lone = unique_topic("fg")
        cli_json(gearmand, "subscribe_fanout", {"topic": lone, "client_id": "carol"})
        receiver = subprocess.Popen(["gearman", "-h", gearmand.host, "-p", str(gearmand.port),
                                     "-w", "-c", "1", "-f", f"{lone}_carol"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            wait_for(lambda: _workers_of(gearmand, f"{lone}_carol"), 30,
                     message="the receiver to register")
            foreground = cli_json(gearmand, "fanout", {"topic": lone, "payload": "fg"})
            assert foreground["copies"] == 1 and foreground["completed"] == 1, foreground
            out, _ = receiver.communicate(timeout=30)
            assert out == b"fg"
        finally:
            receiver.kill()
        # Consume alice's copies with the stock CLI: every one, in order.
        consumed = gearman_cli(gearmand, "-w", "-c", "26", "-f", f"{topic}_alice",
                               timeout=60)
        assert consumed.returncode == 0
        assert consumed.stdout == b"".join(str(n).encode() for n in range(25)) + b"bg"

        # STOMP: a SEND with a receipt to a topic a STOMP client subscribes to.
        bridge.wait_listening(bridge_port)
        subscriber, sender = StompClient(bridge_port), StompClient(bridge_port)
        try:
            subscriber.subscribe("/topic/" + topic, "1")
            receipt = sender.send("/topic/" + topic, b"over stomp")
            assert receipt.headers["receipt-id"]
            [message] = subscriber.messages(1)
            assert message.body == b"over stomp"
            assert not sender.listener.errors and not subscriber.listener.errors
        finally:
            subscriber.close()
            sender.close()
        # The Gearman subscribers got it too.
        assert gearman_cli(gearmand, "-w", "-c", "1", "-f", f"{topic}_bob",
                           timeout=30).stdout == b"0"

        # The start said what an acknowledgement covers, in one line.
        said = wait_for(lambda: [line for line in worker.log(full=True).splitlines()
                                 if "acknowledgements:" in line], 30, message="the start line")
        assert len(said) == 1, said
        assert "in memory only" in said[0] and "memory queue" in said[0], said[0]
        status = subprocess.run([sys.executable, "-m", "gearhorn", "status"], env=env,
                                capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stderr
        assert "in memory only" in status.stdout and "memory queue" in status.stdout
    finally:
        bridge.stop()
        worker.stop()


def _workers_of(gearmand, function):
    from gearhorn import gearman
    return any(f.name == function and f.workers for f in gearman.status(gearmand.host,
                                                                        gearmand.port))


def test_a_setting_that_cannot_be_kept_stops_the_start_with_one_line(plain_servers, tmp_path):
    gearmand, redis_url = plain_servers
    unreachable = f"redis://127.0.0.1:{servers.free_port()}/0"
    for argv, settings, says in (
            (["worker", "--processes", "1"], {"GEARHORN_REDIS_URL": unreachable},
             "cannot reach the registry's Redis"),
            (["bridge", "--port", str(servers.free_port()), "--ws-port", "0"],
             {"GEARHORN_REDIS_URL": unreachable}, "cannot reach the registry's Redis"),
            (["worker", "--processes", "1"], {"GEARHORN_DURABILITY": "fsync"},
             "durability = fsync, but the registry's Redis")):
        done = subprocess.run([sys.executable, "-m", "gearhorn", *argv], timeout=60,
                              env=gearhorn_env(gearmand, redis_url, **settings),
                              capture_output=True, text=True)
        assert done.returncode == 2, (argv, done.stdout, done.stderr)
        # One line says why (log lines of the start may come before it).
        said = [line for line in done.stderr.splitlines() if line.startswith("gearhorn ")]
        assert len(said) == 1 and says in said[0], done.stderr
        assert done.stderr.strip().splitlines()[-1] == said[0]


def fails_after_the_bound(client, topic):
    """A fanout submitted during the outage: it fails, and only once the
    bound was waited out; returns the reason its client saw."""
    started = time.monotonic()
    job = client.submit("fanout", {"topic": topic, "payload": "x"}, timeout=120)
    waited = time.monotonic() - started
    reason = b"".join(job.data).decode()
    assert job.failure, reason
    assert waited >= BARRIER_TIMEOUT * 0.9, (waited, reason)
    return reason


def serves_again(client, topic, client_id):
    """Subscribe ``client_id`` until the pool answers it as done."""
    def served():
        job = client.submit("subscribe_fanout", {"topic": topic, "client_id": client_id},
                            timeout=60)
        return not job.failure
    wait_for(served, 120, interval=0.5, message="the pool to serve again")


@pytest.fixture
def served_redis(tmp_path):
    """A Redis with an AOF whose fsync barrier ``gearhorn fsyncd`` serves, as
    an operator runs it beside a Redis of theirs (stop() and start() it)."""
    server = servers.start_redis(data_dir=str(tmp_path / "redis"), appendonly=True,
                                 barrier=False)
    url = server.details["url"]

    class Syncer:
        process = None

        def start(self):
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gearhorn", "fsyncd", "--url", url],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent)
            assert self.process.stdout.readline().startswith(b"serving the fsync barrier")

        def stop(self):
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(30)

    syncer = Syncer()
    syncer.start()
    yield url, syncer
    if syncer.process.poll() is None:
        syncer.process.kill()
    server.stop()


def test_a_barrier_that_goes_away_fails_the_waiting_fanouts_then_serves_again(
        served_redis, tmp_path):
    url, syncer = served_redis
    gearmand = servers.start_gearmand(data_dir=str(tmp_path / "gearmand"))
    worker = start_worker(tmp_path, gearhorn_env(gearmand, url), processes=1)
    client = GearClient(gearmand)
    try:
        topic = unique_topic("gone")
        client.call("subscribe_fanout", {"topic": topic, "client_id": "alice"})
        syncer.stop()
        reason = fails_after_the_bound(client, topic)
        assert "fsync barrier" in reason and "waited 5s" in reason, reason
        # The stock CLI sees the reason too (WORK_WARNING, then WORK_FAIL).
        failed = gearman_cli(gearmand, "-f", "subscribe_fanout",
                             json.dumps({"topic": topic, "client_id": "bob"}), timeout=60)
        assert failed.returncode != 0 and b"fsync barrier" in failed.stdout + failed.stderr
        syncer.start()
        serves_again(client, topic, "carol")
        assert client.call("fanout", {"topic": topic, "payload": "y",
                                      "background": True})["copies"] >= 2
        said = [line for line in worker.log(full=True).splitlines()
                if "acknowledgements:" in line]
        assert "on disk: after an fsync by its syncer" in said[0], said
    finally:
        client.close()
        worker.stop()
        gearmand.stop()
