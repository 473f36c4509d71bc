"""Publisher deduplication on real servers: the same dedup_id from two
producers at once, through two worker processes, is one broadcast; a STOMP
SEND with x-deduplication-header is told it was a duplicate; the window ends."""

import threading

import pytest

from gearhorn import gearman
from gearhorn.client import Producer

from .helpers import unique_topic, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

PAIRS = 20


def queued(gearmand, queue):
    found = gearman.totals([(gearmand.host, gearmand.port)]).get(queue)
    return found.queued if found else 0


@pytest.mark.cluster_too
def test_the_same_id_from_two_producers_at_once_is_one_broadcast(gearmand, start_pool):
    start_pool([gearmand], processes=2)
    servers = [(gearmand.host, gearmand.port)]
    topic = unique_topic()
    with Producer(servers) as setup:
        setup.subscribe(topic, "alice")
    producers = [Producer(servers) for _ in range(2)]
    answers = [[] for _ in producers]
    start = threading.Barrier(len(producers))

    def publish(n):
        for i in range(PAIRS):
            start.wait(timeout=60)  # both submit order-i together
            answers[n].append(producers[n].publish(topic, f"m{i}", background=True,
                                                   dedup_id=f"order-{i}"))

    threads = [threading.Thread(target=publish, args=(n,)) for n in range(len(producers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for p in producers:
        p.close()
    assert [len(a) for a in answers] == [PAIRS, PAIRS]
    for i, pair in enumerate(zip(*answers, strict=True)):
        made = [a for a in pair if not a.get("duplicate")]
        told = [a for a in pair if a.get("duplicate")]
        assert len(made) == 1 and len(told) == 1, (i, pair)
        assert made[0]["copies"] == 1 and told[0]["copies"] == 0
        assert told[0]["message_id"] == made[0]["message_id"]
    assert queued(gearmand, f"{topic}_alice") == PAIRS


def test_a_stomp_send_with_the_header_is_delivered_once(gearmand, start_pool, start_bridge,
                                                         stomp_clients):
    start_pool([gearmand], processes=1)
    bridge = start_bridge([gearmand])
    topic = unique_topic()
    listener = stomp_clients(bridge.port)
    listener.subscribe(f"/topic/{topic}", "s1")
    sender = stomp_clients(bridge.port)
    first = sender.send(f"/topic/{topic}", b"hello", **{"x-deduplication-header": "abc"})
    again = sender.send(f"/topic/{topic}", b"hello", **{"x-deduplication-header": "abc"})
    sender.send(f"/topic/{topic}", b"marker")
    assert "x-duplicate" not in first.headers and again.headers["x-duplicate"] == "true"
    got = listener.until(b"marker")
    assert [m.body for m in got] == [b"hello"]
    assert got[0].headers["x-deduplication-header"] == "abc"


def test_after_the_window_the_same_id_broadcasts_again(gearmand, start_pool):
    start_pool([gearmand], processes=1, env={"GEARHORN_DEDUP_WINDOW": "1"})
    topic = unique_topic()
    with Producer([(gearmand.host, gearmand.port)]) as producer:
        producer.subscribe(topic, "alice")
        assert producer.publish(topic, "a", background=True, dedup_id="d")["copies"] == 1
        assert producer.publish(topic, "a", background=True, dedup_id="d")["duplicate"]
        wait_for(lambda: producer.publish(topic, "a", background=True,
                                          dedup_id="d")["copies"] == 1,
                 timeout=30, interval=0.2, message="the window to end")
    assert queued(gearmand, f"{topic}_alice") == 2


def test_deduplicated_sends_among_plain_ones_keep_their_order_for_live_readers(
        gearmand, start_pool, start_bridge, stomp_clients):
    """On a topic with history a plain SEND is appended by the bridge and
    reaches its live readers before the append, but a deduplicated one is
    appended by a worker (which decides on it). A plain SEND right after a
    deduplicated one must wait for the feed to pass it (``TopicFeed.hold_until``)
    or it overtakes it. One producer, no receipts: each plain SEND is read
    while the feed is still on its way to the deduplicated one before it."""
    history = {"GEARHORN_HISTORY_TOPICS": "dd*=100000"}
    start_pool([gearmand], processes=2, env=history)
    bridge = start_bridge([gearmand], env=history)
    topic = unique_topic("dd")
    live = stomp_clients(bridge.port)
    live.subscribe(f"/topic/{topic}", "live")
    sender = stomp_clients(bridge.port)
    expected = []
    for i in range(300):
        headers = {"x-deduplication-header": f"d{i}"} if i % 3 == 1 else {}
        sender.conn.send(destination=f"/topic/{topic}", body=f"m{i}", headers=headers)
        expected.append(f"m{i}")
        if i % 30 == 4:  # an id seen 3 SENDs ago: a duplicate, never delivered
            sender.conn.send(destination=f"/topic/{topic}", body=f"again{i}",
                             headers={"x-deduplication-header": f"d{i - 3}"})
    sender.send(f"/topic/{topic}", b"marker")
    got = [m.body.decode() for m in live.until(b"marker", timeout=120)]
    wrong = next((n for n, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
                 min(len(got), len(expected)))
    assert got == expected, (f"{len(got)} of {len(expected)} delivered; from place {wrong} "
                             f"got {got[wrong:wrong + 4]}, not {expected[wrong:wrong + 4]}")
