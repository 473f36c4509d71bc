"""Two gearmand, two worker pools and two bridges: copies spread over both
servers by queue, every subscriber gets every copy in order, bridges serve each other's
clients, and a gearmand killed mid-broadcast loses nothing acknowledged."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from gearhorn import gearman
from gearhorn.client import Consumer, Producer
from gearhorn.supervision import servers
from tests.needs import require_binary

from .helpers import queue_depth, unique_topic, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def gearmand_b(tmp_path_factory):
    require_binary("gearmand", "gearman-job-server")
    server = servers.start_gearmand(data_dir=str(tmp_path_factory.mktemp("gearmand-b")))
    yield server
    server.stop()


@pytest.fixture
def two(gearmand, gearmand_b, start_pool):
    """Both servers, and a pool of one worker per server order."""
    start_pool([gearmand, gearmand_b], processes=1)
    start_pool([gearmand_b, gearmand], processes=1)
    return gearmand, gearmand_b


def addresses(*servers_):
    return [(s.host, s.port) for s in servers_]


def consume_all(servers_, topic, client_id, count):
    with Consumer(addresses(*servers_), topic, client_id) as inbox:
        got = []
        while len(got) < count:
            body = inbox.get(timeout=30)
            assert body is not None, f"{client_id} got {len(got)} of {count}"
            got.append(body)
        return got


def status(redis_url, *servers_):
    argv = [sys.executable, "-m", "gearhorn", "status", "--json", "--redis-url", redis_url]
    for server in servers_:
        argv += ["--gearman", server.address]
    out = subprocess.run(argv, capture_output=True, timeout=60, check=True)
    return json.loads(out.stdout)


def one_homed_on_each(servers_, topic):
    """A client id whose queue's home is each of ``servers_``, in order."""
    client = gearman.Client(addresses(*servers_))
    found: dict[int, str] = {}
    for n in range(100):
        found.setdefault(client.home(f"{topic}_s{n}"), f"s{n}")
    return [found[index] for index in range(len(servers_))]


def test_each_queue_stays_on_its_home_server_in_order_and_both_serve(two, redis_url):
    """Copies spread over both servers by queue: one subscriber's copies on
    one server, whichever pool (listing the servers in either order) made
    them, so each subscriber gets them in the order they were published."""
    topic = unique_topic()
    subscribers = [*one_homed_on_each(two, topic), "third"]  # the third: either home
    producer = Producer(addresses(*two))
    for who in subscribers:
        producer.subscribe(topic, who)
    for i in range(60):
        assert producer.publish(topic, f"m{i}", background=True)["copies"] == 3
    producer.close()

    report = status(redis_url, *two)
    per_server = {s["server"]: {f["queue"]: f["queued"] for f in s["functions"]}
                  for s in report["gearmand"]}
    assert len(per_server) == 2
    holding = {who: {key: depths[f"{topic}_{who}"] for key, depths in per_server.items()
                     if depths.get(f"{topic}_{who}")} for who in subscribers}
    assert all(list(held.values()) == [60] for held in holding.values()), holding
    assert len({key for held in holding.values() for key in held}) == 2  # both serve
    summed = {q["queue"]: q for q in report["queues"]}
    assert all(summed[f"{topic}_{who}"]["queued"] == 60 for who in subscribers)
    for who in subscribers:
        assert consume_all(two, topic, who, 60) == [f"m{i}".encode() for i in range(60)]


def test_bridges_on_both_servers_serve_each_other(two, start_bridge, stomp_clients):
    bridge_a, bridge_b = start_bridge(list(two)), start_bridge(list(two))
    topic, queue = unique_topic(), unique_topic("q")
    listener = stomp_clients(bridge_b.port)
    listener.subscribe(f"/topic/{topic}", "t")
    listener.subscribe(f"/queue/{queue}", "q")
    sender = stomp_clients(bridge_a.port)
    for i in range(10):
        sender.send(f"/topic/{topic}", f"t{i}".encode())
        sender.send(f"/queue/{queue}", f"q{i}".encode())
    bodies = sorted(m.body for m in listener.messages(20))
    assert bodies == sorted([f"t{i}".encode() for i in range(10)]
                            + [f"q{i}".encode() for i in range(10)])


def test_a_durable_subscription_moves_to_the_other_bridge(two, start_bridge, stomp_clients):
    bridge_a, bridge_b = start_bridge(list(two)), start_bridge(list(two))
    topic = unique_topic()
    first = stomp_clients(bridge_a.port, **{"client-id": "keeper"})
    first.subscribe(f"/topic/{topic}", "d", durable="true")
    first.close()
    bridge_a.stop()  # its bridge is gone; the subscription is not
    sender = stomp_clients(bridge_b.port)
    for i in range(20):
        sender.send(f"/topic/{topic}", f"d{i}".encode())
    again = stomp_clients(bridge_b.port, **{"client-id": "keeper"})
    again.subscribe(f"/topic/{topic}", "d", durable="true")
    assert sorted(m.body for m in again.messages(20)) == sorted(
        f"d{i}".encode() for i in range(20))


@pytest.mark.faults
def test_a_gearmand_killed_mid_broadcast_loses_nothing_acknowledged(
        tmp_path, redis_url, start_pool, report):
    """Both gearmand keep their queue in sqlite; one is killed with -9 while a
    producer publishes, then started again on the same file."""
    dirs = [str(tmp_path / "g1"), str(tmp_path / "g2")]
    g1 = servers.start_gearmand(data_dir=dirs[0], queue="sqlite")
    g2 = servers.start_gearmand(data_dir=dirs[1], queue="sqlite")
    try:
        # copies = gearmand: this is gearmand's sqlite queue replaying them
        # (held copies across a killed gearmand: tests/integration/test_held_copies.py)
        in_gearmand = {"GEARHORN_COPIES": "gearmand"}
        start_pool([g1, g2], processes=1, env=in_gearmand)
        start_pool([g2, g1], processes=1, env=in_gearmand)
        topic = unique_topic()
        x, y = one_homed_on_each((g1, g2), topic)  # x's copies on g1, y's on g2
        producer = Producer(addresses(g1, g2), timeout=60)
        for who in (x, y):
            producer.subscribe(topic, who)
        acknowledged, resubmitted = [], 0
        halfway = threading.Event()

        def publish():
            nonlocal resubmitted
            for i in range(300):
                while True:
                    try:
                        producer.publish(topic, f"p{i}", background=True, unique=f"p{i}")
                        break
                    except Exception:  # the server died under the call: again, same unique
                        resubmitted += 1
                acknowledged.append(f"p{i}".encode())
                if i == 100:
                    halfway.set()

        thread = threading.Thread(target=publish)
        thread.start()
        assert halfway.wait(120)
        held = queue_depth(g1, f"{topic}_{x}")
        assert held > 0  # copies only g1's queue holds when it dies
        g1_port = g1.port
        os.kill(g1.process.pid, signal.SIGKILL)
        g1.process.wait()
        thread.join(180)
        assert not thread.is_alive() and len(acknowledged) == 300
        g1 = servers.start_gearmand(g1_port, dirs[0], queue="sqlite")
        assert queue_depth(g1, f"{topic}_{x}") >= held  # replayed from its sqlite file
        for who in (x, y):
            got = wait_for(lambda who=who: _drain_until(g1, g2, topic, who, acknowledged),
                           timeout=120, message=f"{who}'s copies")
            assert set(got) >= set(acknowledged)
            report(f"{who}: {len(acknowledged)} acknowledged, all received; duplicates: "
                   f"{len(got) - len(set(got))}; producer retried {resubmitted} calls")
        producer.close()
    finally:
        g1.stop()
        g2.stop()


_received: dict[tuple[str, str], list[bytes]] = {}


def _drain_until(g1, g2, topic, who, wanted):
    """Everything queued for ``who`` so far (kept across calls); True-ish once
    every wanted body came."""
    got = _received.setdefault((topic, who), [])
    with Consumer(addresses(g1, g2), topic, who) as inbox:
        while (body := inbox.get(timeout=2)) is not None:
            got.append(body)
    return got if set(got) >= set(wanted) else None
