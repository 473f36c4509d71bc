"""Durable by default: gearmand's redis queue, its replay mended, kill -9 of everything.

Real redis-server, real gearmand 1.1.20 ``-q redis``, a real ``gearhorn up``.
"""

import json
import os
import signal
import subprocess
import sys
from collections import Counter

import pytest
import redis

from gearhorn import gearman, servers
from gearhorn.client import JobFailed, Producer
from gearhorn.store.keys import Keys
from gearhorn.worker import replay
from tests.needs import require_binary

from .helpers import drain_jobs, nothing_held, queue_depth, wait_for
from .stomp_helpers import StompClient

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture
def queue_redis(tmp_path):
    require_binary("redis-server", "redis-server")
    server = servers.start_redis(data_dir=str(tmp_path / "queue-redis"), appendonly=True)
    yield server
    server.stop()


def start_gearmand(queue_redis, port=None):
    require_binary("gearmand", "gearman-job-server")
    return servers.start_gearmand(port, queue="redis", queue_server=(queue_redis.host,
                                                                    queue_redis.port))


# (function, unique, data, precedence): every shape gearmand 1.1.20 replays wrong, and
# the ones it gets right, side by side.
JOBS = [
    ("news_alice", "m1:alice", b"plain", "normal"),
    ("price-feed_alice", "m1:al-ice", b"dashed function and unique", "normal"),
    ("news_bob", "u*x:bob", b"star in the unique", "normal"),
    ("news_carol", "m2:carol", b"a\0b\0", "normal"),
    ("news_dave", "d" * 63, b"longest unique", "normal"),
    ("news_erin", "big:erin", os.urandom(1024 * 1024).replace(b"\0", b"\1"), "normal"),
    ("prio-q", "low", b"low", "low"),
    ("prio-q", "normal", b"normal", "normal"),
    ("prio-q", "high", b"high", "high"),
]


def test_every_queued_job_comes_back_exactly_after_kill_9_of_gearmand_and_its_redis(
        queue_redis, redis_url):
    keys = Keys()
    dashed = replay.DashedFunctions(redis.Redis.from_url(redis_url), keys)
    gm = start_gearmand(queue_redis)
    client = gearman.Client([(gm.host, gm.port)], before_background=dashed.record)
    try:
        for function, unique, data, precedence in JOBS:
            client.submit_background([gearman.Copy(function, unique, data)], precedence)
    finally:
        client.close()
    gm.kill()
    queue_redis.kill()  # AOF: what Redis answered is in the file

    restarted = servers.start_redis(queue_redis.port, data_dir=os.path.dirname(
        queue_redis.log_path), appendonly=True)
    queue = redis.Redis.from_url(restarted.details["url"])
    names = dashed.load()
    assert replay.hold(queue, names, keys) == 6  # the dashed (4), starred and NUL ones
    gm = start_gearmand(restarted, gm.port)
    client = gearman.Client([(gm.host, gm.port)])
    try:
        assert replay.resubmit(queue, names, keys, client) == 6
        functions = {name for name, _, _, _ in JOBS}
        assert {f.name for f in gearman.status(gm.host, gm.port) if f.queued} == functions
        got = [(j.function, j.unique, j.data) for f in sorted(functions)
               for j in drain_jobs(gm, f)]
        assert Counter(got) == Counter((f, u, d) for f, u, d, _ in JOBS)
        order = [j for j in got if j[0] == "prio-q"]
        assert [data for _, _, data in order] == [b"high", b"normal", b"low"]
    finally:
        client.close()
        gm.stop()
        restarted.stop()


SUBSCRIBERS = [f"s{i}" for i in range(10)]
TOPICS = ("news", "price-feed")  # a "-" in the queue name, as gearmand misreads it


def test_gearhorn_up_keeps_every_copy_exactly_once_through_kill_9_of_everything(
        tmp_path, ups):
    first = ups(tmp_path)
    # Held copies: gearmand keeps only what is submitted straight to it (the
    # background fanouts below), in sqlite.
    assert "durable: gearmand's sqlite queue" in first.text()
    gm = [("127.0.0.1", first.ports["gearman"])]
    expected = {topic: Counter() for topic in TOPICS}
    with Producer(gm) as producer:
        for topic in TOPICS:
            for who in SUBSCRIBERS:
                producer.subscribe(topic, who)
            for i in range(150):  # completes once gearmand holds every copy
                producer.publish(topic, f"{topic}-{i}\0", background=True)
                expected[topic][f"{topic}-{i}\0".encode()] += 1
    # Background fanouts: JOB_CREATED is all they had; a worker may not have run them yet.
    client = gearman.Client(gm)
    client.submit_background([gearman.Copy("fanout", f"bg{i}", json.dumps(
        {"topic": "news", "payload": f"bg{i}", "background": True}).encode())
        for i in range(100)])
    client.close()
    expected["news"].update(f"bg{i}".encode() for i in range(100))
    stomp = StompClient(first.ports["stomp"])
    stomp.send("/queue/orders-eu", b"receipted")  # waits for its RECEIPT
    for i in range(20):  # as RabbitMQ clients send: persistent, in one go (one batch)
        stomp.conn.send(destination="/topic/news", body=f"persistent-{i}".encode(),
                        headers={"persistent": "true"})
    stomp.send("/topic/news", b"from stomp", persistent="true")  # its RECEIPT: all before too
    expected["news"].update(f"persistent-{i}".encode() for i in range(20))
    expected["news"][b"from stomp"] += 1
    first.kill_everything()

    second = ups(tmp_path, ports=first.ports)
    wait_for(lambda: queue_depth(second.gearmand, "fanout") == 0, 60,
             message="the replayed fanouts to run")
    assert [j.data for j in drain_jobs(second.gearmand, "orders-eu", until=nothing_held(
        second.redis_url, "orders-eu"))] == [b"receipted"]
    for topic in TOPICS:
        for who in SUBSCRIBERS:
            queue = f"{topic}_{who}"  # held copies come once another worker took them over
            got = Counter(j.data for j in drain_jobs(
                second.gearmand, queue, until=nothing_held(second.redis_url, queue)))
            assert got == expected[topic], f"{queue}: {len(got)} distinct copies"
    status = {f.name for f in gearman.status("127.0.0.1", first.ports["gearman"]) if f.queued}
    assert status == set(), f"jobs in queues nobody expected: {status}"


def test_the_redis_servers_up_starts_write_each_command_before_answering(tmp_path, ups):
    """appendfsync everysec answers before writing while a sync is slow (a
    busy disk), and a kill -9 then loses what it acknowledged; gearhorn up
    syncs the files itself (gearhorn/aofsync.py)."""
    up = ups(tmp_path)
    client = redis.Redis(port=up.ports["redis"])
    settings = client.config_get("append*")
    assert (settings["appendonly"], settings["appendfsync"]) == ("yes", "no")
    client.close()
    # Held copies: gearmand has no Redis of its own any more.
    assert not servers.is_listening("127.0.0.1", up.ports["queue"])


def test_no_persistence_is_said_in_the_banner_and_loses_gearmands_own_jobs(tmp_path, ups):
    """--no-persistence: gearmand keeps its jobs in memory. With held copies
    (the default) that is only the jobs submitted straight to it: the
    pool's copies and the bridge's SENDs are in the registry's Redis and
    come back after a kill -9 of everything."""
    first = ups(tmp_path, extra=["--no-persistence"])
    assert "NONE: queued copies are lost" in first.text()
    assert "every copy gearhorn makes, and every SEND, is held in the registry's Redis" \
        in first.text()
    gm = [("127.0.0.1", first.ports["gearman"])]
    with Producer(gm) as producer:
        producer.subscribe("news", "alice")
        producer.publish("news", "kept", background=True)
    stomp = StompClient(first.ports["stomp"])
    stomp.send("/queue/orders", b"held too")  # waits for its RECEIPT
    stomp.close()
    subprocess.run(["gearman", "-h", "127.0.0.1", "-p", str(first.ports["gearman"]), "-b",
                    "-f", "orders", "gone"], check=True, capture_output=True, timeout=30)
    wait_for(lambda: queue_depth(first.gearmand, "orders") == 2,
             message="both jobs queued: there is one to lose")
    first.kill_everything()
    second = ups(tmp_path, ports=first.ports, extra=["--no-persistence"])
    got = drain_jobs(second.gearmand, "news_alice",
                     until=nothing_held(second.redis_url, "news_alice"))
    assert [j.data for j in got] == [b"kept"]
    got = drain_jobs(second.gearmand, "orders", until=nothing_held(second.redis_url, "orders"))
    assert [j.data for j in got] == [b"held too"]


def test_copies_queued_in_gearmand_before_the_upgrade_to_held_are_all_delivered(
        tmp_path, ups):
    """A data directory of the version before held copies: its copies, and
    the bridge's SENDs, are in gearmand's redis queue. Started again on
    every default, gearhorn moves them into held copies (a dashed function
    and a unique gearmand would replay wrong among them), runs gearmand on
    sqlite with no Redis of its own, and delivers old and new alike."""
    first = ups(tmp_path, env={"GEARHORN_COPIES": "gearmand"})
    assert "copies = held" not in first.text()
    gm = [("127.0.0.1", first.ports["gearman"])]
    with Producer(gm) as producer:
        for who in ("alice", "bob"):
            producer.subscribe("news", who)
            producer.subscribe("price-feed", who)
        for i in range(100):
            producer.publish("news", f"old{i}", background=True)
        producer.publish("price-feed", "dashed", background=True)
    stomp = StompClient(first.ports["stomp"])
    stomp.send("/queue/orders", b"old order", **{"correlation-id": "c1"})
    stomp.close()
    first.kill_everything()

    second = ups(tmp_path, ports=first.ports)
    assert "copies = held" in second.text()
    assert "gearmand's sqlite queue" in second.text()
    assert "moved 203 jobs from gearmand's redis queue" in second.text()
    assert os.path.isdir(tmp_path / "data" / "gearmand-queue.upgraded")
    assert not os.path.exists(tmp_path / "data" / "gearmand-queue")
    with Producer(gm) as producer:
        for i in range(50):
            producer.publish("news", f"new{i}", background=True)
    expected = Counter([f"old{i}".encode() for i in range(100)]
                       + [f"new{i}".encode() for i in range(50)])
    for who in ("alice", "bob"):
        queue = f"news_{who}"
        got = Counter(j.data for j in drain_jobs(second.gearmand, queue,
                                                 until=nothing_held(second.redis_url, queue)))
        assert got == expected, f"{queue}: {sorted(set(expected) - set(got))[:5]} missing"
        queue = f"price-feed_{who}"
        got = drain_jobs(second.gearmand, queue, until=nothing_held(second.redis_url, queue))
        assert [j.data for j in got] == [b"dashed"]
    consumer = StompClient(second.ports["stomp"])
    consumer.subscribe("/queue/orders", "1")
    (message,) = consumer.messages(1, timeout=60)
    consumer.close()
    assert (message.body, message.headers.get("correlation-id")) == (b"old order", "c1")


def test_up_starts_gearmand_and_its_redis_again_when_that_redis_is_killed(tmp_path, ups):
    # gearmand 1.1.20 never reconnects to its queue's Redis: without a restart
    # it answers QUEUE_ERROR to every background job from then on.
    up = ups(tmp_path, env={"GEARHORN_PERSISTENCE": "redis"})
    gm = [("127.0.0.1", up.ports["gearman"])]
    with Producer(gm) as producer:
        producer.subscribe("news", "alice")
        producer.publish("news", "before", background=True)
    queue = redis.Redis(port=up.ports["queue"])
    os.kill(queue.info("server")["process_id"], signal.SIGKILL)
    wait_for(lambda: "gearmand's queue Redis crashed: starting it again" in up.text(), 30,
             message="up to notice")
    # Held copies need no queue Redis: a publish before gearmand's restart
    # would get through, then meet the restart. After it, then.
    wait_for(lambda: "gearmand started again on port" in up.text(), 60,
             message="gearmand started again")

    def publish_after():
        try:
            with Producer(gm, timeout=10) as producer:
                # the unique key coalesces a retry with an attempt that got through
                return producer.publish("news", "after", background=True,
                                        unique="after")["copies"] == 1
        except (gearman.GearmanError, JobFailed, OSError):
            return False  # gearmand is starting again
    wait_for(publish_after, 60, interval=0.2, message="a publish after the restart")
    # "before" is a held copy: handed again once its holder sees gearmand back
    got = drain_jobs(up.gearmand, "news_alice", until=nothing_held(up.redis_url, "news_alice"))
    assert sorted(j.data for j in got) == [b"after", b"before"]


def test_the_replay_commands_mend_a_gearmand_started_by_hand(queue_redis, redis_url):
    """The production steps of docs/reliability.rst, as commands."""
    dashed = replay.DashedFunctions(redis.Redis.from_url(redis_url), Keys())
    gm = start_gearmand(queue_redis)
    client = gearman.Client([(gm.host, gm.port)], before_background=dashed.record)
    client.submit_background([gearman.Copy("orders-eu_bob", "m9:bob", b"x\0y")])
    client.close()
    gm.kill()
    common = ["--redis-url", redis_url, "--queue-redis-url", queue_redis.details["url"]]

    def gearhorn(*args):
        out = subprocess.run([sys.executable, "-m", "gearhorn", "replay", *args, *common,
                              "--gearman", f"127.0.0.1:{gm.port}"],
                             capture_output=True, timeout=60)
        assert out.returncode == 0, out.stderr.decode()
        return out.stdout.decode().strip()

    assert gearhorn("hold") == "held 1 jobs"
    gm = start_gearmand(queue_redis, gm.port)
    try:
        assert gearhorn("resubmit") == "resubmitted 1 jobs"
        jobs = drain_jobs(gm, "orders-eu_bob")
        assert [(j.unique, j.data) for j in jobs] == [("m9:bob", b"x\0y")]
    finally:
        gm.stop()
