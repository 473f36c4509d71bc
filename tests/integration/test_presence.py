"""topic_presence on real servers: Gearman and STOMP subscribers with where
each is, from the worker and the command line, after unsubscribes and after
a bridge killed without a word (the janitor)."""

import json
import subprocess
import sys

import pytest

from gearhorn.client import Producer

from .helpers import unique_topic, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def clients(found):
    return {c["client_id"]: c for c in found["clients"]}


@pytest.mark.cluster_too
def test_presence_follows_subscribes_unsubscribes_and_a_dead_bridge(
        gearmand, start_pool, start_bridge, stomp_clients, redis_url):
    start_pool([gearmand])
    # The bridge's heart-beats expire after 5 x worker_ttl: 10 s here.
    bridge = start_bridge([gearmand], env={"GEARHORN_HEARTBEAT_INTERVAL": "0.5",
                                           "GEARHORN_WORKER_TTL": "2",
                                           "GEARHORN_HISTORY_SIZE": "10"})
    topic = unique_topic("news")
    producer = Producer([(gearmand.host, gearmand.port)])
    for who in ("alice", "bob"):
        producer.subscribe(topic, who)
    producer.subscribe(f"{topic[:6]}*", "carol")
    stomp = stomp_clients(bridge.port, **{"client-id": "tab"})
    stomp.subscribe(f"/topic/{topic}", "live")
    stomp.subscribe(f"/topic/{topic}", "kept", durable="true")
    # A stream subscription (docs/stomp.rst) has no queue, but is present.
    stomp.subscribe(f"/topic/{topic}", "resumable", **{"x-stream-offset": "next"})

    found = producer.presence(topic)
    assert (found["subscribers"], found["direct"]) == (6, 5)
    assert found["patterns"] == [{"pattern": f"{topic[:6]}*", "subscribers": 1}]
    by_id = clients(found)
    assert {by_id["alice"]["via"], by_id["bob"]["via"]} == {"gearman"}
    stomp_ones = [c for c in by_id.values() if c["via"] == "stomp"]
    assert len(stomp_ones) == 3 and len({c["bridge"] for c in stomp_ones}) == 1
    assert sorted(c["durable"] for c in stomp_ones) == [False, False, True]

    out = subprocess.run([sys.executable, "-m", "gearhorn", "presence", topic, "--json",
                          "--gearman", gearmand.address, "--redis-url", redis_url],
                         capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert clients(json.loads(out.stdout)).keys() == by_id.keys()

    producer.unsubscribe(topic, "bob")
    assert "bob" not in clients(producer.presence(topic))
    bridge.process.kill()
    bridge.process.wait()
    wait_for(lambda: producer.presence(topic)["direct"] == 2, 120, interval=0.5,
             message="the janitor to remove the dead bridge's non-durable subscription")
    left = clients(producer.presence(topic))
    assert "alice" in left and [c["durable"] for c in left.values() if c["via"] == "stomp"] \
        == [True]
    producer.close()


def test_presence_events_tell_joins_and_leaves_on_their_own_topic(
        gearmand, start_pool, start_bridge, stomp_clients):
    on = {"GEARHORN_PRESENCE_EVENTS": "true"}
    start_pool([gearmand], processes=1, env=on)
    bridge = start_bridge([gearmand], env=on)
    topic = unique_topic("room")
    watcher = stomp_clients(bridge.port)
    watcher.subscribe(f"/topic/gearhorn.presence.{topic}", "events")
    producer = Producer([(gearmand.host, gearmand.port)])
    producer.subscribe(topic, "alice")
    tab = stomp_clients(bridge.port)
    tab.subscribe(f"/topic/{topic}", "live")
    producer.unsubscribe(topic, "alice")
    tab.close()  # its non-durable subscription ends with the connection
    events = [json.loads(m.body) for m in watcher.messages(4, timeout=60)]
    assert [(e["event"], e["via"]) for e in events] == [
        ("join", "gearman"), ("join", "stomp"), ("leave", "gearman"), ("leave", "stomp")]
    assert events[0]["client_id"] == events[2]["client_id"] == "alice"
    assert events[1]["client_id"] == events[3]["client_id"] and events[1]["bridge"]
    assert all(e["topic"] == topic and not e["durable"] for e in events)
    producer.close()
