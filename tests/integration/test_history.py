"""Topic history on real servers: what topic_history and gearhorn history say
is what a subscriber received, in order, with offsets; a wiped Redis gives a
new epoch, and a caller with the old one is told nothing was recovered."""

import json
import subprocess
import sys

import pytest
import redis

from gearhorn.client import Consumer, Producer
from gearhorn.store.keys import Keys

from .helpers import unique_topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

COUNT = 40


@pytest.mark.cluster_too
def test_history_agrees_with_what_a_subscriber_received(gearmand, start_pool, redis_url):
    start_pool([gearmand], processes=2, env={"GEARHORN_HISTORY_SIZE": "1000"})
    servers = [(gearmand.host, gearmand.port)]
    topic = unique_topic()
    with Producer(servers) as producer:
        producer.subscribe(topic, "alice")
        for i in range(COUNT):
            # Some with headers: those run alone, not in a group of plain fanouts.
            producer.publish(topic, f"m{i}", background=True,
                             headers={"x-n": str(i)} if i % 5 == 0 else None)
        with Consumer(servers, topic, "alice") as inbox:
            received = [inbox.get(timeout=30) for _ in range(COUNT)]
        found = producer.history(topic, limit=1000)
        assert [m["payload"].encode() for m in found["messages"]] == received
        assert [m["offset"] for m in found["messages"]] == list(range(1, COUNT + 1))
        assert found["recovered"] and found["epoch"]
        tail = producer.history(topic, since=COUNT - 3, epoch=found["epoch"])
        assert [m["payload"] for m in tail["messages"]] == [f"m{i}" for i in range(37, 40)]
        assert tail["recovered"]

    out = subprocess.run([sys.executable, "-m", "gearhorn", "history", topic, "--json",
                          "--since", "10", "--limit", "5", "--gearman", gearmand.address,
                          "--redis-url", redis_url], capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert [m["offset"] for m in json.loads(out.stdout)["messages"]] == [11, 12, 13, 14, 15]


def test_a_wiped_redis_is_a_new_epoch(gearmand, start_pool, redis_url):
    start_pool([gearmand], processes=1, env={"GEARHORN_HISTORY_SIZE": "100"})
    topic = unique_topic()
    with Producer([(gearmand.host, gearmand.port)]) as producer:
        producer.publish(topic, "before", background=True)
        before = producer.history(topic)
        keys = Keys()
        assert redis.Redis.from_url(redis_url).delete(keys.history_meta(topic),
                                                      keys.history(topic)) == 2
        producer.publish(topic, "after", background=True)
        after = producer.history(topic, since=1, epoch=before["epoch"])
        assert after["epoch"] != before["epoch"] and not after["recovered"]
        assert [m["payload"] for m in producer.history(topic)["messages"]] == ["after"]
