"""Durable by default: held copies in the registry's Redis, gearmand on
sqlite for its own jobs, kill -9 of everything; and the upgrade of a data
directory whose copies wait in gearmand's redis queue (the version before).

Real redis-server, real gearmand 1.1.20, a real ``gearhorn up``.
"""

import json
import os
import signal
import subprocess
import sys
from collections import Counter

import pytest
import redis

from gearhorn import gearman
from gearhorn.client import JobFailed, Producer
from gearhorn.store.keys import Keys
from gearhorn.supervision import servers

from .helpers import drain_jobs, nothing_held, queue_depth, wait_for
from .stomp_helpers import StompClient

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


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
    syncs the files itself (gearhorn/supervision/aofsync.py)."""
    up = ups(tmp_path)
    client = redis.Redis(port=up.ports["redis"])
    settings = client.config_get("append*")
    assert (settings["appendonly"], settings["appendfsync"]) == ("yes", "no")
    # One machine: the banner says what it survives (a power cut) and what not.
    assert "a power cut loses nothing acknowledged" in up.text()
    assert "what that Redis holds is lost with its disk" in up.text()
    # No maxmemory on it (a full Redis would refuse heartbeats too): the
    # warden's guard bounds the held copies at up's 1 GiB instead.
    assert client.config_get("maxmemory")["maxmemory"] == "0"
    wait_for(lambda: client.hget(Keys().store, "max") == str(2**30).encode(), 60,
             message="the warden's store guard at 1 GiB")
    client.close()


def test_no_persistence_is_said_in_the_banner_and_loses_gearmands_own_jobs(tmp_path, ups):
    """--no-persistence: gearmand keeps its jobs in memory. With held copies
    (the default) that is only the jobs submitted straight to it: the
    pool's copies and the bridge's SENDs are in the registry's Redis and
    come back after a kill -9 of everything."""
    first = ups(tmp_path, extra=["--no-persistence"])
    assert "NONE: jobs queued in gearmand are lost" in first.text()
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


def older_versions_gearmand(data_dir):
    """gearmand on its redis queue in ``<data_dir>/gearmand-queue``, as
    gearhorn up ran it before held copies: (that Redis, gearmand)."""
    queue = servers.start_redis(data_dir=str(data_dir / "gearmand-queue"), appendonly=True)
    gearmand = servers.start_gearmand(queue="redis", queue_server=(queue.host, queue.port))
    return queue, gearmand


def test_copies_queued_in_gearmand_before_the_upgrade_to_held_are_all_delivered(
        tmp_path, ups):
    """A data directory of the version before held copies: its copies, and
    the bridge's SENDs, are in gearmand's redis queue. Started again on
    every default, gearhorn moves them into held copies (a dashed function
    and a unique gearmand would replay wrong among them), runs gearmand on
    sqlite with no Redis of its own, and delivers old and new alike."""
    old_queue, old_gearmand = older_versions_gearmand(tmp_path / "data")
    ports = {"redis": servers.free_port(), "gearman": old_gearmand.port,
             "stomp": servers.free_port()}
    first = ups(tmp_path, ports=ports, env={"GEARHORN_COPIES": "gearmand"})
    assert "copies = held" not in first.text()
    registry = redis.Redis(port=ports["redis"])
    # What the older version recorded before it submitted to such a function.
    registry.sadd(Keys().dashed_functions, "price-feed_alice", "price-feed_bob")
    registry.close()
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
    old_gearmand.kill()
    old_queue.kill()  # its AOF: what it answered is in the file
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


def test_up_starts_gearmand_again_when_it_crashes_and_its_held_copies_go_to_it(
        tmp_path, ups):
    up = ups(tmp_path)
    gm = [("127.0.0.1", up.ports["gearman"])]
    with Producer(gm) as producer:
        producer.subscribe("news", "alice")
        producer.publish("news", "before", background=True)
    (said,) = gearman.admin("127.0.0.1", up.ports["gearman"], "getpid")  # "OK <pid>"
    os.kill(int(said.split()[-1]), signal.SIGKILL)
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


def test_up_refuses_the_redis_queue_of_the_version_before_and_says_why(tmp_path):
    """``persistence = redis`` was up's gearmand on its redis queue plugin:
    gone (docs/design/gearmand.rst, "What went"). A worker beside a gearmand of yours
    run with -q redis still accepts it, as a description of that gearmand."""
    out = subprocess.run(
        [sys.executable, "-m", "gearhorn", "up", "--data-dir", str(tmp_path / "data"),
         "--redis-url", f"redis://127.0.0.1:{servers.free_port()}/0",
         "--gearman", f"127.0.0.1:{servers.free_port()}"],
        env=dict(os.environ, GEARHORN_PERSISTENCE="redis", GEARHORN_BRIDGE_PORT=str(
            servers.free_port()), GEARHORN_WEB_PORT="0"),
        capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "no longer runs gearmand on its redis queue" in out.stderr + out.stdout
