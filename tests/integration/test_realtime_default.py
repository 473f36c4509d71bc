"""Real-time topics with no settings (issue 51): on the default
configuration a plain STOMP SUBSCRIBE to ``/topic/T`` is served by the
bridge from T's short history, with an ``x-stream-offset`` on every
MESSAGE and no gearmand queue of its own; it resumes after a cut
connection with nothing missing or twice, is told ``x-recovered:false``
when it comes back after the history went, and the reconciliation checks
its offsets like any stream subscriber's."""

import socket

import pytest
import redis

from gearhorn import gearman
from gearhorn.config import Config
from gearhorn.store import fsync, redisconn
from gearhorn.store.keys import Keys
from gearhorn.store.ledger import Ledger

from .helpers import bodies, offsets, publish, unique_topic, wait_for
from .spark_helpers import reconcile

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture
def stack(gearmand, start_pool, start_bridge):
    start_pool([gearmand], processes=2)  # the defaults: no history setting anywhere
    return gearmand, start_bridge([gearmand])


def queues_of(gearmand, topic):
    return [f.name for f in gearman.status(gearmand.host, gearmand.port)
            if f.name.startswith(f"{topic}_")]


def cut(client):
    """The connection dropped, no DISCONNECT (a network cut, a closed laptop)."""
    client.conn.transport.socket.shutdown(socket.SHUT_RDWR)
    # Polled: no listener callback announces it (a wait on the listener's
    # lock slept its whole deadline, 20 s a test).
    wait_for(lambda: not client.conn.is_connected(), 20, message="the cut seen by the client")


@pytest.mark.cluster_too
def test_a_plain_subscriber_gets_offsets_no_queue_and_resumes_after_a_cut(
        stack, stomp_clients, redis_url):
    gearmand, bridge = stack
    topic = unique_topic("plain.")
    reader = stomp_clients(bridge.port)
    receipt = reader.subscribe(f"/topic/{topic}", "s")  # no header of gearhorn's own
    assert receipt.headers["x-stream-offset"] == "1"
    producer = stomp_clients(bridge.port)
    for i in range(30):
        producer.send(f"/topic/{topic}", f"a{i}")
    publish(gearmand, topic, [f"g{i}" for i in range(10)])  # Gearman producers too
    got = reader.messages(40, timeout=60)
    assert bodies(got) == [f"a{i}" for i in range(30)] + [f"g{i}" for i in range(10)]
    assert offsets(got) == list(range(1, 41))
    epoch = got[0].headers["x-stream-epoch"]
    assert epoch and {m.headers["x-stream-epoch"] for m in got} == {epoch}
    assert queues_of(gearmand, topic) == []  # no gearmand queue was made for it

    cut(reader)
    # Its bridge saw the cut when its registration is gone: then it is away.
    client = redisconn.connect(redis_url)
    wait_for(lambda: not {m for m in client.smembers(Keys().topic(topic))}, 60,
             message="the cut subscription removed")
    for i in range(20):  # while it is away: the history keeps them
        producer.send(f"/topic/{topic}", f"b{i}")
    publish(gearmand, topic, [f"h{i}" for i in range(5)])

    again = stomp_clients(bridge.port)
    receipt = again.subscribe(f"/topic/{topic}", "s", **{
        "x-stream-offset": str(offsets(got)[-1] + 1), "x-stream-epoch": epoch})
    assert receipt.headers["x-recovered"] == "true"
    for i in range(5):
        producer.send(f"/topic/{topic}", f"c{i}")
    producer.send(f"/topic/{topic}", "end")
    resumed = again.until(b"end", timeout=60)
    assert bodies(resumed) == ([f"b{i}" for i in range(20)] + [f"h{i}" for i in range(5)]
                               + [f"c{i}" for i in range(5)])
    assert offsets(resumed) == list(range(41, 71))  # no gap, none twice at the seam
    assert all("x-recovered" not in m.headers for m in resumed)
    assert queues_of(gearmand, topic) == []


def test_a_reader_back_after_the_history_went_is_told_not_recovered(
        gearmand, start_pool, start_bridge, stomp_clients, redis_url):
    """The history of a topic nobody reads goes ``realtime_history_ttl``
    after the last reader left; one that comes back later gets what is
    there from then on, and its first MESSAGE says x-recovered:false."""
    short = {"GEARHORN_REALTIME_HISTORY_TTL": "1"}
    start_pool([gearmand], processes=1, env=short)
    bridge = start_bridge([gearmand], env=short)
    topic = unique_topic("gone.")
    reader = stomp_clients(bridge.port)
    reader.subscribe(f"/topic/{topic}", "s")
    publish(gearmand, topic, ["a0", "a1"])
    got = reader.messages(2, timeout=30)
    epoch = got[0].headers["x-stream-epoch"]
    reader.close()
    client = redisconn.connect(redis_url)
    wait_for(lambda: not client.exists(Keys().history_meta(topic)), 60,
             message="the topic's history gone, a second after its last reader left")
    publish(gearmand, topic, ["lost"])  # nobody reads it: kept nowhere
    again = stomp_clients(bridge.port)
    receipt = again.subscribe(f"/topic/{topic}", "s", **{
        "x-stream-offset": "3", "x-stream-epoch": epoch})
    assert receipt.headers["x-recovered"] == "false"
    assert receipt.headers["x-stream-epoch"] != epoch
    publish(gearmand, topic, ["b0"])
    (first,) = again.messages(1, timeout=30)
    assert first.body == b"b0" and first.headers["x-recovered"] == "false"


def ledger_mentions(client, text):
    """Whether some ledger stream has an entry naming ``text`` (flushed)."""
    keys, needle = Keys(), text.encode()
    return any(needle in value for shard in range(Config().ledger_shards)
               for _, fields in client.xrange(keys.ledger(shard)) for value in fields.values())


def test_the_reconciliation_checks_a_default_subscribers_offsets(
        stack, stomp_clients, redis_url, tmp_path):
    gearmand, bridge = stack
    topic = unique_topic("ledger.")
    reader = stomp_clients(bridge.port)
    reader.subscribe(f"/topic/{topic}", "s")
    client = redisconn.connect(redis_url)
    (member,) = {m.decode() for m in client.smembers(Keys().topic(topic))}
    queue = f"{topic}_{member}"  # as the ledger names the subscription
    producer = stomp_clients(bridge.port)
    for i in range(25):
        producer.send(f"/topic/{topic}", f"m{i}")
    got = reader.messages(25, timeout=60)
    epoch = got[0].headers["x-stream-epoch"]
    reader.close()  # an ended subscription records its last run of offsets
    wait_for(lambda: ledger_mentions(client, f"{queue}\t{epoch}:1-25"), timeout=60,
             interval=0.2, message="the reader's run of offsets in the ledger")
    # The run as it was is clean (test_realtime.py's default order test
    # reconciles a run of default subscribers); planted: the reader given
    # 27-28, so 26 was skipped, and the reconciliation says so.
    planted = Ledger(client, Keys(), source="planted")
    planted.record("streamed", queue, f"{epoch}:27-28")
    planted.flush()
    problems, _ = reconcile(redis_url, tmp_path / "planted", gearmand)
    assert [kind for kind, subscriber in problems if subscriber == queue] == ["stream_gap"]


def test_gearhorn_up_serves_a_plain_subscriber_in_real_time_with_receipts_after_the_disk(
        ups, tmp_path, stomp_clients):
    """What a new user runs (README): ``gearhorn up`` with every default,
    the fsync barrier included. A plain subscriber gets offsets and no
    queue; the producer's receipted SENDs (no job: the reader alone reads
    the topic) are answered, and a Gearman fanout reaches it too.

    "After the disk": up says its acknowledgements wait for the syncer, and
    each receipted SEND took a ticket of the registry's barrier (no ticket:
    no wait). That a RECEIPT never comes before the fsync covering it, a
    stalled disk shows in test_fsync_barrier.py (the receipt test)."""
    up = ups(tmp_path)
    assert "on disk: after an fsync by its syncer" in up.text()
    registry = redis.Redis(port=up.ports["redis"])
    topic = unique_topic("up.")
    reader = stomp_clients(up.ports["stomp"])
    assert reader.subscribe(f"/topic/{topic}", "s").headers["x-stream-offset"] == "1"
    producer = stomp_clients(up.ports["stomp"])
    for i in range(5):
        before = int(registry.get(fsync.TICKET) or 0)
        producer.send(f"/topic/{topic}", f"m{i}")  # each waits for its RECEIPT
        assert int(registry.get(fsync.TICKET) or 0) > before, f"m{i}: answered without a wait"
    publish(up.gearmand, topic, ["g0"])
    got = reader.messages(6, timeout=60)
    assert bodies(got) == ["m0", "m1", "m2", "m3", "m4", "g0"]
    assert offsets(got) == list(range(1, 7))
    assert queues_of(up.gearmand, topic) == []
    registry.close()


def test_a_gearman_producer_beside_a_stomp_one_waits_for_the_pen_and_no_offset_lies(
        stack, stomp_clients, redis_url):
    """The bridge gives its STOMP producer's messages their offsets itself
    while it holds the topic's pen (docs/design/index.rst); a Gearman producer's
    fanouts to the same topic wait until it is given back. The subscriber
    gets every message of both once, each producer's in order, offsets
    without a gap, and the history holds each message at the very offset
    the subscriber was given."""
    import threading

    from gearhorn.rules.historypolicy import HistoryPolicy
    from gearhorn.store.history import History

    gearmand, bridge = stack
    topic, count = unique_topic("mix."), 200
    reader = stomp_clients(bridge.port)
    reader.subscribe(f"/topic/{topic}", "s")
    producer = stomp_clients(bridge.port)
    producer.send(f"/topic/{topic}", "warm")  # the pen comes with an append
    sending = threading.Thread(target=lambda: [
        producer.conn.send(destination=f"/topic/{topic}", body=f"stomp:{i}")
        for i in range(count)])
    sending.start()
    publish(gearmand, topic, [f"gear:{i}" for i in range(count)])
    sending.join(120)
    assert not sending.is_alive()
    producer.send(f"/topic/{topic}", "end")
    got = reader.until(b"end", timeout=120)  # without the marker
    names = bodies(got)
    assert offsets(got) == list(range(1, len(got) + 1))
    for kind in ("stomp", "gear"):
        assert [n for n in names if n.startswith(f"{kind}:")] == [
            f"{kind}:{i}" for i in range(count)]
    assert len(names) == 2 * count + 1  # and "warm"
    kept = History(redisconn.connect(redis_url), Keys.for_config(Config()),
                   HistoryPolicy(1000, 3600)).read(topic, limit=1000)
    stored = {m["offset"]: m["payload"] for m in kept["messages"]}
    assert stored.pop(len(got) + 1) == "end"
    assert stored == dict(zip(offsets(got), names, strict=True))
    # The workers waited for the bridge's pen at least once: given back
    # when wanted, it leaves the topic a calm spell without pens.
    meta = redisconn.connect(redis_url).hgetall(Keys.for_config(Config()).history_meta(topic))
    assert b"calm_until" in meta, meta


def test_while_its_bridge_alone_writes_a_topic_the_feed_does_not_read_it(
        stack, stomp_clients, redis_url):
    """With the topic's pen the bridge hands each message to its readers
    itself, and no one else can append: its feed's blocking XREAD would only
    wake for what the readers have, a round trip per write. Each SEND here
    is its own write (the producer waits for every RECEIPT)."""
    gearmand, bridge = stack
    topic, count = unique_topic("alone."), 100
    reader = stomp_clients(bridge.port)
    reader.subscribe(f"/topic/{topic}", "s")
    producer = stomp_clients(bridge.port)
    redis = redisconn.connect(redis_url)

    def xreads():
        return redis.info("commandstats").get("cmdstat_xread", {}).get("calls", 0)

    before = xreads()
    for i in range(count):
        producer.send(f"/topic/{topic}", f"m{i}")
    got = reader.messages(count, timeout=60)
    assert bodies(got) == [f"m{i}" for i in range(count)]
    assert offsets(got) == list(range(1, count + 1))
    # A read when the pen comes (the XREAD in flight then) and after each
    # time it is given back and taken again (a quiet 0.25 s on a busy
    # machine): far fewer than a read per write.
    assert xreads() - before <= count // 4
