"""Real-time topics on real servers (issue 27): several producers on two
bridges, over TCP and WebSocket (stomp.py both ways), each sending 2,000
messages without waiting for receipts; 20 subscribers, half on each
bridge, half live (plain SUBSCRIBEs, given their bridge's SENDs before the
append) and half stream (x-stream-offset), get every message of every
producer in the order it was sent, and
the ledger of the run reconciles clean, stream subscribers included. A
killed bridge loses its stream subscribers only the gap their resume
covers, and a durable subscription on the same topic nothing. Each runs
twice: with the topics' history configured, and on the defaults (issue
51), where a plain SUBSCRIBE is a stream reader of the real-time topic."""

import collections
import itertools
import signal
import threading
import time

import pytest

from .helpers import unique_topic, wait_for
from .spark_helpers import export_ledger, reconcile

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

HISTORY = {"GEARHORN_HISTORY_TOPICS": "live.*=100000"}
MESSAGES = 2_000


def start_bridges(gearmand, start_pool, start_bridge, env):
    start_pool([gearmand], processes=2, env=env)
    return [start_bridge([gearmand], env=env, websocket=True) for _ in range(2)]


@pytest.fixture(params=["configured", "default"])
def setting(request):
    """``configured``: the topics keep a history of their own (history_topics),
    so a plain SUBSCRIBE is a live reader: no offsets, its bridge's SENDs
    before they are appended. ``default``: no history setting at all, so
    a plain SUBSCRIBE reads the real-time topic's short history, offsets
    and all (docs/design/index.rst "Real-time by default")."""
    return request.param


@pytest.fixture
def bridges(gearmand, start_pool, start_bridge, setting):
    return start_bridges(gearmand, start_pool, start_bridge,
                         HISTORY if setting == "configured" else {})


@pytest.fixture
def configured_bridges(gearmand, start_pool, start_bridge):
    return start_bridges(gearmand, start_pool, start_bridge, HISTORY)


def connect(stomp_clients, bridge, websocket, **headers):
    if websocket:
        return stomp_clients(bridge.ws_port, ws_path="/ws", **headers)
    return stomp_clients(bridge.port, **headers)


def produce(client, topic, name, count, first=0):
    """``count`` SENDs numbered from ``first``, no receipt but on the last:
    once it is back, the bridge fanned out every one (a connection's SENDs
    go in order)."""
    for i in range(first, first + count - 1):
        client.conn.send(destination=f"/topic/{topic}", body=f"{name}:{i}")
    client.send(f"/topic/{topic}", f"{name}:{first + count - 1}")


def per_producer(messages):
    """Producer name -> the sequence numbers it got, in arrival order."""
    got = collections.defaultdict(list)
    for message in messages:
        name, _, number = message.body.decode().partition(":")
        got[name].append(int(number))
    return got


def out_of_order(messages):
    """Producer name -> (count, duplicates, the first place its order broke)."""
    found = {}
    for name, seen in per_producer(messages).items():
        broke = next((i for i, (a, b) in enumerate(itertools.pairwise(seen)) if b != a + 1),
                     None)
        found[name] = (len(seen), len(seen) - len(set(seen)),
                       None if broke is None else seen[max(0, broke - 2):broke + 3])
    return found


def given_in_ledger(rows):
    """Subscriber -> how many messages the ledger says it was given: a
    stream subscriber's runs of offsets, a queue subscriber's deliveries."""
    given = collections.Counter()
    for row in rows:
        if row["event"] == "streamed":
            first, last = row["unique"].split(":")[1].split("-")
            given[row["subscriber"]] += int(last) - int(first) + 1
        elif row["event"] == "delivered":
            given[row["subscriber"]] += 1
    return given


def test_each_producers_order_holds_for_twenty_subscribers_on_two_bridges(
        gearmand, bridges, setting, stomp_clients, redis_url, tmp_path, report):
    topic = unique_topic("live.")
    subscribers = []
    # Subscribed with x-stream-offset; the others are plain: live readers
    # (configured), or stream readers from the next message (default).
    streams = []
    plain_offsets = setting == "default"
    for i in range(20):  # half on each bridge; TCP and WebSocket, live and stream on each
        client = connect(stomp_clients, bridges[i % 2], websocket=i % 4 >= 2)
        if (i // 4) % 2:
            receipt = client.subscribe(f"/topic/{topic}", "s", **{"x-stream-offset": "next"})
            assert receipt.headers["x-stream-offset"] == "1"  # from the next message
            streams.append(client)
        else:
            receipt = client.subscribe(f"/topic/{topic}", "s")
            assert ("x-stream-offset" in receipt.headers) == plain_offsets
        subscribers.append(client)
    durable = connect(stomp_clients, bridges[1], websocket=False, **{"client-id": "rt"})
    # Room for all: by default a queue keeps 10,000 (drop-head), and this one
    # may fall behind three producers.
    durable.subscribe(f"/topic/{topic}", "d", durable="true",
                      **{"x-max-length": str(4 * MESSAGES)})
    producers = {"tcp-a": connect(stomp_clients, bridges[0], websocket=False),
                 "ws-b": connect(stomp_clients, bridges[1], websocket=True),
                 "tcp-b": connect(stomp_clients, bridges[1], websocket=False)}
    threads = [threading.Thread(target=produce, args=(client, topic, name, MESSAGES))
               for name, client in producers.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
        assert not thread.is_alive()
    producers["tcp-a"].send(f"/topic/{topic}", "end:0")  # after every producer's last
    total, again = len(producers) * MESSAGES, 0
    for n, client in enumerate(subscribers):
        got = client.until(b"end:0", timeout=240)
        once = once_each(got)  # as got, unless a bridge stalled past its pen
        again += len(got) - len(once)
        assert len(once) == total, f"subscriber {n}: {len(once)} of {total}"
        assert {name: numbers == list(range(MESSAGES))
                for name, numbers in per_producer(once).items()} == dict.fromkeys(producers, True)
        if client in streams or plain_offsets:
            # From 1 without a gap; a bridge stalled past its pen (seen once,
            # three suites on two cores) costs the topic its epoch, told
            # (test_a_bridge_paused_past_its_pen_...): its offsets start again.
            assert [(told, offsets == list(range(1, len(offsets) + 1)))
                    for _, offsets, told in epochs_of(got)] == [
                        (i > 0, True) for i in range(len(epochs_of(got)))]
        else:
            assert not [m for m in got if "x-stream-offset" in m.headers]
    queued = durable.until(b"end:0", timeout=240)
    assert {name: numbers == list(range(MESSAGES))
            for name, numbers in per_producer(queued).items()} == dict.fromkeys(
                producers, True), out_of_order(queued)
    # Ended, each subscription records its last run of offsets.
    for client in subscribers:
        client.close()
    ledger = tmp_path / "poll"
    given = collections.Counter()

    def ledger_has_every_delivery():
        given.clear()  # each export adds to the folder; all of it is read
        given.update(given_in_ledger(export_ledger(redis_url, ledger, gearmand)))
        return (len(given) == 21 and min(given.values()) == total + 1
                and sum(given.values()) == 21 * (total + 1) + again)
    wait_for(ledger_has_every_delivery, timeout=120, interval=1,
             message="every subscriber's messages in the ledger")
    problems, _ = reconcile(redis_url, tmp_path, gearmand)
    assert problems == []
    report(f"{setting}: {len(producers)} producers x {MESSAGES:,} messages (TCP and "
           f"WebSocket, two bridges) to 20 subscribers (10 plain, 10 stream) and a durable "
           "one: each "
           f"producer's order held for all; the ledger has {sum(given.values()):,} "
           "stream offsets given, and the reconciliation is clean")


class Acker(threading.Thread):
    """Acknowledges each message of a ``client-individual`` subscription as it comes."""

    def __init__(self, client):
        super().__init__(daemon=True)
        self.client, self.acked, self.stop = client, 0, threading.Event()
        self.start()

    def run(self):
        while not self.stop.is_set():
            messages = self.client.listener.messages[self.acked:]
            for message in messages:
                try:
                    self.client.conn.ack(message.headers["message-id"])
                except Exception:  # noqa: BLE001 - its bridge was killed: nothing to ack
                    return
            self.acked += len(messages)
            self.stop.wait(0.01)


def numbers(messages):
    return [int(m.body.decode().partition(":")[2]) for m in messages]


def test_a_killed_bridge_costs_stream_subscribers_what_resume_covers_and_durable_nothing(
        gearmand, bridges, stomp_clients, report):
    doomed, survivor = bridges
    # The last ``tail`` are sent after the kill, so some always follow it
    # (a fast bridge had delivered all 2,000 before it, once).
    topic, count, tail = unique_topic("live."), 2000, 200
    streamer = stomp_clients(doomed.port)
    streamer.subscribe(f"/topic/{topic}", "s", **{"x-stream-offset": "next"})
    live = stomp_clients(doomed.port)  # plain: at most once, and nothing to resume from
    live.subscribe(f"/topic/{topic}", "l")
    keeper = stomp_clients(doomed.port, **{"client-id": "rt-kill"})
    keeper.subscribe(f"/topic/{topic}", "d", ack="client-individual", durable="true",
                     **{"prefetch-count": "50"})
    acker = Acker(keeper)
    producer = stomp_clients(survivor.port)
    sending = threading.Thread(target=produce, args=(producer, topic, "p", count - tail))
    sending.start()
    streamer.messages(300, timeout=120)
    acker.stop.set()  # what the durable one gets from here on is held unacknowledged
    acker.join(30)
    wait_for(lambda: len(keeper.listener.messages) > acker.acked, timeout=120,
             message="a message held unacknowledged by the durable subscriber")
    doomed.process.kill()
    doomed.process.wait(30)
    before = list(streamer.listener.messages)
    live_got = numbers(live.listener.messages)
    held = list(keeper.listener.messages)
    sending.join(300)
    assert not sending.is_alive()
    produce(producer, topic, "p", tail, first=count - tail)
    # The stream subscriber resumes on the other bridge after its last offset.
    last = int(before[-1].headers["x-stream-offset"])
    resumed = stomp_clients(survivor.port)
    resumed.subscribe(f"/topic/{topic}", "s", **{"x-stream-offset": str(last + 1)})
    again = stomp_clients(survivor.port, **{"client-id": "rt-kill"})
    again.subscribe(f"/topic/{topic}", "d", durable="true")
    producer.send(f"/topic/{topic}", "end:0")
    after = resumed.until(b"end:0", timeout=120)
    assert numbers(before + after) == list(range(count))
    assert [int(m.headers["x-stream-offset"]) for m in before + after] == list(
        range(1, count + 1))
    assert "x-recovered" not in after[0].headers
    assert live_got == list(range(len(live_got))), "the live one: in order, none twice"
    redelivered = again.until(b"end:0", timeout=120)
    assert sorted(set(numbers(held + redelivered))) == list(range(count))
    twice = [n for n, k in collections.Counter(numbers(held + redelivered)).items() if k > 1]
    assert twice, "the messages held unacknowledged at the kill came only once"
    assert {m.headers.get("redelivered") for m in redelivered
            if numbers([m])[0] in twice} == {"true"}
    report(f"bridge killed after {len(before)} of {count} messages: the stream subscriber "
           f"resumed from offset {last + 1} on the other bridge with nothing missing or "
           f"twice; the durable one got all {count}, {len(twice)} of them again "
           "(held unacknowledged at the kill, each redelivered:true)")


def test_a_topic_only_streams_read_needs_no_fanout_job_until_a_queue_subscriber_comes(
        gearmand, bridges, stomp_clients, redis_url, tmp_path):
    """Its SENDs are appended and answered by the bridge alone (their
    ``published`` rows are the bridge's, for no copies); a Gearman
    subscriber that joins gets the messages sent after, through the job."""
    from gearhorn.client import Consumer, Producer

    topic = unique_topic("live.")
    reader = stomp_clients(bridges[1].port)
    reader.subscribe(f"/topic/{topic}", "s")
    producer = stomp_clients(bridges[0].port)
    for i in range(50):
        producer.send(f"/topic/{topic}", f"early:{i}")
    with Producer([(gearmand.host, gearmand.port)]) as admin:
        admin.subscribe(topic, "late")
    for i in range(50):
        producer.send(f"/topic/{topic}", f"late:{i}")
    producer.send(f"/topic/{topic}", "end:0")
    assert [m.body.decode() for m in reader.until(b"end:0")] == [
        f"early:{i}" for i in range(50)] + [f"late:{i}" for i in range(50)]
    with Consumer([(gearmand.host, gearmand.port)], topic, "late") as inbox:
        assert [inbox.get(timeout=30).decode() for _ in range(51)] == [
            f"late:{i}" for i in range(50)] + ["end:0"]
        assert inbox.get(timeout=0.5) is None  # nothing of before it subscribed
    published = {}

    def all_published():
        published.clear()
        for row in export_ledger(redis_url, tmp_path / "ledger", gearmand):
            if row["event"] == "published" and row["topic"] == topic:
                by = "bridge" if row["source"].startswith("bridge-") else "worker"
                published[row["message_id"]] = (by, row["count"])
        return len(published) == 101
    wait_for(all_published, timeout=60, interval=0.5, message="101 published rows")
    assert collections.Counter(published.values()) == {("bridge", 0): 50, ("worker", 1): 51}


def test_subscribers_on_the_producers_bridge_have_its_sends_before_redis_stores_them(
        configured_bridges, stomp_clients, redis_url, report):
    """With Redis taking no writes (CLIENT PAUSE WRITE) no SEND can be
    appended, yet a live (plain) subscriber on the producer's bridge gets
    it, and so does the stream subscriber beside it, offset and all, once
    the bridge holds the topic's pen (docs/design/realtime.rst, "Offsets given by
    the bridge"); a live subscriber on the other bridge gets it only once
    Redis takes writes again, and the history then has each message at the
    offset the stream subscriber was given. Nobody gets anything twice."""
    import redis

    from gearhorn.config import Config
    from gearhorn.rules.historypolicy import HistoryPolicy
    from gearhorn.store.history import History
    from gearhorn.store.keys import Keys

    here, there = configured_bridges
    topic = unique_topic("live.")
    live, stream, far = (stomp_clients(bridge.port) for bridge in (here, here, there))
    live.subscribe(f"/topic/{topic}", "l")
    stream.subscribe(f"/topic/{topic}", "s", **{"x-stream-offset": "next"})
    far.subscribe(f"/topic/{topic}", "f")
    producer = stomp_clients(here.port)
    admin = redis.Redis.from_url(redis_url)
    probes = 0

    def a_probe_arrives_while_redis_is_paused():
        # A live reader takes SENDs early once it has joined its topic's
        # feed, a moment after its SUBSCRIBE, and the bridge holds the pen
        # from an append until the topic is quiet a moment: probe until
        # both show it.
        nonlocal probes
        probes += 1
        probe = f"probe:{probes}".encode()
        producer.send(f"/topic/{topic}", f"warm:{probes}")
        admin.execute_command("CLIENT", "PAUSE", "60000", "WRITE")
        try:
            producer.conn.send(destination=f"/topic/{topic}", body=probe.decode())
            try:
                for client in (live, stream):
                    client.wait(lambda c=client: any(m.body == probe
                                                     for m in c.listener.messages),
                                2, "a probe")
            except AssertionError:
                return False
            assert probe not in [m.body for m in far.listener.messages]
            return True
        finally:
            admin.execute_command("CLIENT", "UNPAUSE")
    wait_for(a_probe_arrives_while_redis_is_paused, timeout=120, interval=0.1,
             message="subscribers given a SEND while Redis took no writes")
    producer.send(f"/topic/{topic}", "end:0")
    sent = [f"{kind}:{i}" for i in range(1, probes + 1) for kind in ("warm", "probe")]
    for client in (live, stream, far):
        assert [m.body.decode() for m in client.until(b"end:0", timeout=60)] == sent
    given = {int(m.headers["x-stream-offset"]): m.body.decode()
             for m in stream.listener.messages}
    config = Config(redis_url=redis_url)
    kept = History(admin, Keys.for_config(config), HistoryPolicy(1000, 3600)).read(topic)
    assert {m["offset"]: m["payload"] for m in kept["messages"]} == given
    report(f"a SEND reached the live and stream subscribers on its bridge while Redis took "
           f"no writes (probe {probes}), the stream one with the offset the history then "
           "gave it; the far subscriber got it after, none twice")


def epochs_of(messages):
    """The runs of offsets a stream reader was given, one per epoch in the
    order they came: [(epoch, [offsets], told)], ``told`` when the run's
    first message said ``x-recovered:false``."""
    runs = []
    for message in messages:
        epoch = message.headers["x-stream-epoch"]
        if not runs or runs[-1][0] != epoch:
            runs.append((epoch, [], message.headers.get("x-recovered") == "false"))
        runs[-1][1].append(int(message.headers["x-stream-offset"]))
    return runs


def once_each(messages):
    """``messages`` without those given again in a later epoch. A bridge
    paused past its pen had given its readers offsets Redis never wrote; it
    writes those messages in the new epoch, which starts told
    (x-recovered:false), and its own readers get them there again, at
    their new offsets (at least once across a lapsed pen, up to one write's
    worth: docs/design/realtime.rst). Any other repeat stays, for the order
    checks to find."""
    epoch_of, kept = {}, []
    for message in messages:
        epoch = message.headers.get("x-stream-epoch")
        if message.body in epoch_of and epoch_of[message.body] not in (None, epoch):
            continue
        epoch_of.setdefault(message.body, epoch)
        kept.append(message)
    return kept


def test_a_bridge_paused_past_its_pen_costs_the_topic_an_epoch_told_and_no_message_lost(
        gearmand, start_pool, start_bridge, stomp_clients, report):
    """The adversary the order test met once under a triple load: the bridge
    that holds the topic's pen (it gives its SENDs their offsets itself) is
    paused past the pen's grant while the other bridge's producer waits for
    it. Redis gives the other the pen, in a new epoch (the paused one may
    have given offsets it never wrote); the resumed bridge's write with the
    lapsed pen is refused, and what it gave is written in the new epoch.
    Every reader, on either bridge, gets every message, each producer's in
    order, offsets from 1 without a gap within an epoch, and the first
    message of a new epoch says x-recovered:false; only the paused bridge's
    readers get again, in the new epoch, what its lapsed pen had given
    them (:func:`once_each`)."""
    paused, other = start_bridges(gearmand, start_pool, start_bridge, {})
    topic, count = unique_topic("live."), 600
    readers = {f"{where}-{n}": stomp_clients(bridge.port)
               for where, bridge in (("paused", paused), ("other", other)) for n in range(2)}
    for reader in readers.values():
        assert reader.subscribe(f"/topic/{topic}", "s").headers["x-stream-offset"] == "1"
    holder, waiter = stomp_clients(paused.port), stomp_clients(other.port)
    holder.send(f"/topic/{topic}", "a:0")  # the pen comes with an append
    def paced():  # 3 s of SENDs: the pen is still held when the pause comes
        for i in range(1, count):
            holder.conn.send(destination=f"/topic/{topic}", body=f"a:{i}")
            time.sleep(0.005)
    sending = threading.Thread(target=paced)
    sending.start()
    # Paused while it writes with the pen: its readers have offsets Redis may not.
    readers["paused-0"].messages(100, timeout=120)
    paused.process.send_signal(signal.SIGSTOP)
    try:
        waited = time.monotonic()
        for i in range(count):
            waiter.conn.send(destination=f"/topic/{topic}", body=f"b:{i}")
        receipt = waiter.receipt()  # once back, the other bridge got the pen and wrote
        waiter.conn.send(destination=f"/topic/{topic}", body="b:done", receipt=receipt)
        waiter.await_receipt(receipt, timeout=120)  # the pen alone takes 5 s
        waited = time.monotonic() - waited
    finally:
        paused.process.send_signal(signal.SIGCONT)
    sending.join(120)
    assert not sending.is_alive()
    holder.send(f"/topic/{topic}", "end:0")
    again = {}
    for name, reader in readers.items():
        got = reader.until(b"end:0", timeout=120)
        numbered = once_each([m for m in got if m.body != b"b:done"])
        assert {p: seq == list(range(count)) for p, seq in per_producer(numbered).items()} == {
            "a": True, "b": True}, (name, out_of_order(numbered))
        again[name] = len(got) - 1 - len(numbered)
        runs = epochs_of(got)
        assert len(runs) == len({epoch for epoch, _, _ in runs}), (name, "an epoch came back")
        for i, (epoch, offsets, told) in enumerate(runs):
            assert offsets == list(range(1, len(offsets) + 1)), (name, epoch, offsets[:5])
            assert told == (i > 0), (name, epoch, "x-recovered:false on a new epoch's first")
    epochs = len(epochs_of(got))
    assert epochs >= 2, "the pen was given back before the pause: nothing was tested"
    assert again["other-0"] == again["other-1"] == 0, again  # never written twice
    report(f"bridge paused with the pen; the other bridge's producer waited {waited:.1f} s "
           f"for it: {epochs} epochs, each reader (2 per bridge) got all {2 * count} "
           "messages, each producer's in order, the new epoch told; given again in it to "
           f"the paused bridge's readers (its lapsed pen's): {again}")
