"""stomp.py clients through a real bridge, gearmand, Redis and worker pool."""

import pytest

from .helpers import unique_topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def stack(gearmand, start_pool, start_bridge):
    start_pool([gearmand])
    return start_bridge([gearmand])


def test_queue_send_and_subscribe(gearmand, stack, stomp_clients):
    queue = unique_topic("q")
    consumer = stomp_clients(stack.port)
    consumer.subscribe(f"/queue/{queue}", "1", ack="client-individual")
    producer = stomp_clients(stack.port)
    producer.send(f"/queue/{queue}", b"hello")
    (message,) = consumer.messages(1)
    assert message.body == b"hello"
    consumer.conn.ack(message.headers["ack"])


def test_topic_send_reaches_subscribers(stack, stomp_clients):
    topic = unique_topic()
    subs = [stomp_clients(stack.port) for _ in range(3)]
    for i, sub in enumerate(subs):
        sub.subscribe(f"/topic/{topic}", f"s{i}")
    producer = stomp_clients(stack.port)
    producer.send(f"/topic/{topic}", b"news")
    for sub in subs:
        assert [m.body for m in sub.messages(1)] == [b"news"]
