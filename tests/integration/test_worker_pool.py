"""The worker pool on real redis-server and real Gearman servers."""

import json
import os
import signal
import threading

import gear
import pytest

from gearhorn import gearman
from gearhorn.client import Consumer
from gearhorn.gearman import P
from gearhorn.rules.messages import Subscription
from gearhorn.store import redisconn
from gearhorn.store.keys import Keys
from gearhorn.store.registry import Registry

from .helpers import (
    GearClient,
    GearmanTap,
    PoolProcess,
    drain_queue,
    gearman_cli,
    queue_depth,
    unique_topic,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_broadcast_with_the_gear_client(gearman_server, start_pool):
    start_pool([gearman_server])
    client = GearClient(gearman_server)
    topic = unique_topic()
    try:
        for n, who in enumerate(["alice", "bob"], 1):
            assert client.call("subscribe_fanout", {"topic": topic, "client_id": who}) == {
                "topic": topic, "client_id": who, "subscribers": n}
        result = client.call("fanout", {"topic": topic, "payload": {"n": 1}, "background": True})
        assert result["copies"] == 2 and result["background"] is True
        assert drain_queue(gearman_server, f"{topic}_alice") == [b'{"n":1}']
        assert drain_queue(gearman_server, f"{topic}_bob") == [b'{"n":1}']
    finally:
        client.close()


def test_foreground_fanout_completes_when_every_receiver_answered(gearman_server, start_pool):
    start_pool([gearman_server])
    client = GearClient(gearman_server)
    topic = unique_topic()
    got = {}
    try:
        for who in ("alice", "bob"):
            client.call("subscribe_fanout", {"topic": topic, "client_id": who})
        consumers = [threading.Thread(target=lambda w=who: got.__setitem__(
            w, drain_queue(gearman_server, f"{topic}_{w}", count=1))) for who in ("alice", "bob")]
        for thread in consumers:
            thread.start()
        result = client.call("fanout", {"topic": topic, "payload": "hello"})
        for thread in consumers:
            thread.join()
        assert result["completed"] == 2 and result["failed"] == []
        assert got == {"alice": [b"hello"], "bob": [b"hello"]}
    finally:
        client.close()


def test_foreground_fanout_reports_a_receiver_that_never_answers(gearmand, start_pool):
    start_pool([gearmand], env={"GEARHORN_FANOUT_TIMEOUT": "3"})
    client = GearClient(gearmand)
    topic = unique_topic()
    try:
        client.call("subscribe_fanout", {"topic": topic, "client_id": "ghost"})
        result = client.call("fanout", {"topic": topic, "payload": "x"})
        assert result["completed"] == 0
        assert result["failed"] == [{"client_id": "ghost", "queue": f"{topic}_ghost",
                                     "status": "timeout", "reason": "no answer within 3s",
                                     "attempts": 1, "queued": True}]
    finally:
        client.close()


def test_a_failing_foreground_receiver_is_retried_when_the_fanout_asks(gearmand, start_pool):
    start_pool([gearmand])
    client = GearClient(gearmand)
    topic = unique_topic()
    seen = []

    def flaky(data):
        seen.append(data)
        if len(seen) < 3:
            raise RuntimeError(f"attempt {len(seen)} fails")

    try:
        client.call("subscribe_fanout", {"topic": topic, "client_id": "flaky"})
        with Consumer([(gearmand.host, gearmand.port)], topic, "flaky") as receiver:
            serving = threading.Thread(target=receiver.serve, args=(flaky, 3), daemon=True)
            serving.start()
            result = client.call("fanout", {"topic": topic, "payload": "x", "attempts": 5})
            serving.join(10)
        assert result["completed"] == 1 and result["failed"] == []
        assert seen == [b"x", b"x", b"x"]
    finally:
        client.close()


def test_broadcast_with_the_gearman_command_line_tool(gearmand, gearman_cli_tool, start_pool):
    # C gearmand only: libgearman's worker (gearman -w) hangs on gear.Server,
    # which does not implement every grab packet libgearman sends.
    gearman_server = gearmand
    start_pool([gearman_server])
    topic = unique_topic()
    for who in ("alice", "bob"):
        out = gearman_cli(gearman_server, "-f", "subscribe_fanout",
                          json.dumps({"topic": topic, "client_id": who}))
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["client_id"] == who
    out = gearman_cli(gearman_server, "-f", "fanout",
                      json.dumps({"topic": topic, "payload": "first", "background": True}))
    assert json.loads(out.stdout)["copies"] == 2
    for who in ("alice", "bob"):
        copy = gearman_cli(gearman_server, "-w", "-c", "1", "-f", f"{topic}_{who}")
        assert copy.returncode == 0 and copy.stdout == b"first"

    out = gearman_cli(gearman_server, "-f", "unsubscribe_fanout",
                      json.dumps({"topic": topic, "client_id": "alice"}))
    assert json.loads(out.stdout)["subscribers"] == 1
    out = gearman_cli(gearman_server, "-f", "fanout",
                      json.dumps({"topic": topic, "payload": "second", "background": True}))
    assert json.loads(out.stdout)["copies"] == 1
    copy = gearman_cli(gearman_server, "-w", "-c", "1", "-f", f"{topic}_bob")
    assert copy.stdout == b"second"
    assert queue_depth(gearman_server, f"{topic}_alice") == 0


BAD_JOBS = [
    ("fanout", b"not json", "job is not JSON"),
    ("fanout", b"[1]", "job must be a JSON object, not an array"),
    ("fanout", b'{"payload": 1}', "missing key 'topic'"),
    ("fanout", b'{"topic": 1, "payload": 1}', "topic must be a string, not a number"),
    ("fanout", b'{"topic": "bad topic", "payload": 1}', "invalid topic 'bad topic'"),
    ("subscribe_fanout", b'{"topic": "t", "client_id": "a_b"}', "'_' is not allowed"),
    ("subscribe_fanout", b'{"topic": "t"}', "missing key 'client_id'"),
    ("fanout", b'{"topic": "t", "payload": "' + b"x" * (1024 * 1024 + 1) + b'"}',
     "payload is 1048577 bytes, over max_payload_bytes (1048576 bytes)"),
]


@pytest.mark.cluster_too
def test_bad_input_fails_with_its_reason_and_nothing_accepted_is_lost(
        gearman_server, gearman_cli_tool, start_pool):
    start_pool([gearman_server])
    client = GearClient(gearman_server)
    topic = unique_topic()
    try:
        client.call("subscribe_fanout", {"topic": topic, "client_id": "alice"})
        client.call("fanout", {"topic": topic, "payload": "kept", "background": True})
        for function, data, reason in BAD_JOBS:
            job = client.submit(function, data)
            assert job.failure, (function, data[:50])
            assert reason in b"".join(job.data).decode()
            if len(data) < 4096:  # the CLI takes the job as an argument
                out = gearman_cli(gearman_server, "-f", function, data.decode())
                assert out.returncode == 1
                assert reason in (out.stdout + out.stderr).decode()
        # The workers still serve, and what was accepted before is intact.
        assert client.call("subscribe_fanout", {"topic": topic, "client_id": "bob"}
                           )["subscribers"] == 2
        assert drain_queue(gearman_server, f"{topic}_alice") == [b"kept"]
    finally:
        client.close()


@pytest.mark.cluster_too
def test_fanout_right_after_a_subscribe_always_includes_it(gearmand, start_pool):
    """The consistency promise, many times over, with two worker processes
    running: gearmand gives each job to whichever asks first, so a subscribe
    and the next fanout may run in different processes (each checks its
    cache against the topic's version: docs/design/index.rst)."""
    pool = start_pool([gearmand], processes=2)
    client = GearClient(gearmand)
    topic = unique_topic()
    try:
        for i in range(1, 151):
            client.call("subscribe_fanout", {"topic": topic, "client_id": f"c{i}"})
            result = client.call("fanout", {"topic": topic, "payload": i, "background": True})
            assert result["copies"] == i, f"fanout after subscribe #{i} missed a subscriber"
        for i in range(150, 100, -1):
            client.call("unsubscribe_fanout", {"topic": topic, "client_id": f"c{i}"})
            result = client.call("fanout", {"topic": topic, "payload": i, "background": True})
            assert result["copies"] == i - 1
        jobs = {info["pid"]: int(info["jobs"]) for info in pool.live().values()}
        assert len(jobs) == 2
    finally:
        client.close()


def test_a_killed_worker_leaves_the_live_set_and_is_restarted(gearmand, start_pool):
    pool = start_pool([gearmand], processes=2)
    before = pool.live()
    victim_id, victim = next(iter(before.items()))
    os.kill(int(victim["pid"]), signal.SIGKILL)
    wait_for(lambda: victim_id not in pool.live(), timeout=60, message="dead worker to expire")
    after = wait_for(lambda: len(pool.live()) == 2 and pool.live(), timeout=60,
                     message="pool to restart the worker")
    assert victim_id not in after
    assert victim["pid"] not in {info["pid"] for info in after.values()}
    client = GearClient(gearmand)
    try:
        topic = unique_topic()
        assert client.call("subscribe_fanout", {"topic": topic, "client_id": "a"})[
            "subscribers"] == 1
    finally:
        client.close()


def fanout_status(gearmand):
    """(running, workers, anything queued) of gearmand's ``fanout`` function."""
    (fanout,) = [f for f in gearman.status(gearmand.host, gearmand.port) if f.name == "fanout"]
    return fanout.running, fanout.workers, fanout.queued > 0


def busy_worker(gearmand, client):
    """A foreground fanout the only worker is busy with: nobody consumes its
    copy, so the worker waits out its fanout timeout."""
    topic = unique_topic()
    client.call("subscribe_fanout", {"topic": topic, "client_id": "slow"})
    job = gear.Job("fanout", json.dumps({"topic": topic, "payload": "x"}).encode())
    client.client.submitJob(job)
    wait_for(lambda: queue_depth(gearmand, f"{topic}_slow") == 1, message="copy queued")
    return job


def test_sigterm_drains_the_job_in_hand(gearmand, start_pool):
    pool = start_pool([gearmand], processes=1, env={"GEARHORN_FANOUT_TIMEOUT": "3"})
    client = GearClient(gearmand)
    try:
        job = busy_worker(gearmand, client)
        pool.process.send_signal(signal.SIGTERM)
        wait_for(lambda: job.complete, timeout=60, message="drained job to complete")
        assert not job.failure
        assert json.loads(b"".join(job.data))["failed"][0]["status"] == "timeout"
        assert pool.process.wait(15) == 0
        assert pool.live() == {}
    finally:
        client.close()


def test_several_gearmand_servers_share_the_work_and_survive_losing_one(
        gearmand, tmp_path, start_pool):
    from gearhorn.supervision import servers

    second = servers.start_gearmand(data_dir=str(tmp_path / "second"))
    try:
        # copies = gearmand: a copy goes to another gearmand when its own is
        # away (held ones wait for theirs: homed by queue, test_held_copies.py)
        start_pool([gearmand, second], processes=2, env={"GEARHORN_COPIES": "gearmand"})
        client = GearClient(second)
        topic = unique_topic()
        client.call("subscribe_fanout", {"topic": topic, "client_id": "a"})
        for i in range(6):
            assert client.call("fanout", {"topic": topic, "payload": i, "background": True}
                               )["copies"] == 1
        copies = drain_queue(gearmand, f"{topic}_a") + drain_queue(second, f"{topic}_a")
        assert sorted(copies) == [str(i).encode() for i in range(6)]
        client.close()

        second.kill()  # copies must now all go to the first server
        client = GearClient(gearmand)
        for i in range(4):
            assert client.call("fanout", {"topic": topic, "payload": i, "background": True}
                               )["copies"] == 1
        assert len(drain_queue(gearmand, f"{topic}_a")) == 4
        client.close()
    finally:
        second.stop()


def test_a_second_sigterm_stops_at_once(gearmand, start_pool):
    pool = start_pool([gearmand], processes=1)
    client = GearClient(gearmand)
    try:
        job = busy_worker(gearmand, client)
        pool.process.send_signal(signal.SIGTERM)
        # Two signals sent at once may merge into one: wait for the first.
        wait_for(lambda: "stopping:" in pool.log(full=True), message="first SIGTERM")
        pool.process.send_signal(signal.SIGTERM)
        pool.process.wait(10)
        # Stopped, not drained: the job in hand was never answered (a drain
        # answers it once its 20 s fanout timeout ends), and gearmand, which
        # saw its worker go, queues it again for the client still waiting.
        assert "stopping now" in pool.log(full=True)
        wait_for(lambda: fanout_status(gearmand) == (0, 0, True), message="the job queued again")
        assert not job.complete
    finally:
        client.close()


@pytest.mark.parametrize("client_id_length", [30, 31, 32])
def test_copies_whose_unique_keys_border_gearmands_limit_arrive_intact(
        gearmand, start_pool, client_id_length):
    # <message id (32)>:<client id> is 63, 64 or 65 bytes: gearmand 1.1.20 cuts
    # a 64-byte key and a NUL lands in the data, so gearhorn hashes it.
    start_pool([gearmand])
    client = GearClient(gearmand)
    topic, who = unique_topic(), "c" * client_id_length
    try:
        client.call("subscribe_fanout", {"topic": topic, "client_id": who})
        client.call("fanout", {"topic": topic, "payload": "intact", "background": True})
        assert drain_queue(gearmand, f"{topic}_{who}") == [b"intact"]
    finally:
        client.close()


def test_a_backlog_is_taken_in_batches_and_every_job_answered_in_order(
        gearmand, redis_url, tmp_path):
    """Fanouts queued before the worker came: it takes them many per round
    trip (gear's worker took one), copies them in order and gives each job
    its own answer, a refusal included."""
    topic = unique_topic()

    def fanout(unique, body):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return gearman.Copy("fanout", f"{topic}-{unique}", data)

    jobs = [fanout(f"m{i}", {"topic": topic, "payload": f"m{i}", "background": True})
            for i in range(120)]
    jobs[60] = fanout("bad", b"{not json")
    jobs[90] = fanout("m90", {"topic": topic, "payload": "m90", "background": True,
                              "headers": {"k": "v"}})  # a job of its own among the others
    registry = Registry(redisconn.connect(redis_url), Keys())
    for who in ("alice", "bob"):
        registry.subscribe(Subscription(topic, who))
    client = gearman.Client([(gearmand.host, gearmand.port)])
    placed = client.start_foreground(jobs)  # all queued before the worker starts
    tap = GearmanTap(gearmand)
    pool = PoolProcess([tap], redis_url, processes=1, log_dir=str(tmp_path))
    try:
        pool.wait_ready()
        outcomes = placed.wait(60)
        refused = outcomes.pop(60)
        assert refused.status == "failed" and "JSON" in refused.reason
        assert all(o.ok for o in outcomes), [o for o in outcomes if not o.ok][:3]
        assert {json.loads(o.data)["copies"] for o in outcomes} == {2}
        expected = [f"m{i}".encode() for i in range(120) if i != 60]
        for who in ("alice", "bob"):
            assert drain_queue(gearmand, f"{topic}_{who}", count=len(expected)) == expected
        assert tap.most_in_one_read[P.GRAB_JOB_UNIQ] >= 8
    finally:
        client.close()
        pool.stop()
        tap.close()
