"""stomp.py clients through a real bridge, gearmand, Redis and worker pool."""

import json
import socket
import subprocess
import threading

import pytest

from gearhorn.gearman import P
from gearhorn.stomp.protocol.frames import encode
from gearhorn.store import redisconn
from gearhorn.store.keys import Keys

from .helpers import GearClient, GearmanTap, gearman_cli, queue_depth, unique_topic, wait_for
from .stomp_helpers import RawClient, error_detail

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def stack(gearmand, start_pool, start_bridge):
    start_pool([gearmand])
    return start_bridge([gearmand], env={"GEARHORN_STOMP_HEARTBEAT_MS": "200"})


def control(client, path):
    return client.send(f"/control/{path}", b"").headers


@pytest.mark.cluster_too
def test_topic_fanout_to_three_connections_in_order_exactly_once(stack, stomp_clients):
    topic = unique_topic()
    subs = [stomp_clients(stack.port) for _ in range(3)]
    for i, sub in enumerate(subs):
        sub.subscribe(f"/topic/{topic}", f"s{i}")
    producer = stomp_clients(stack.port)
    for i in range(1000):
        producer.conn.send(destination=f"/topic/{topic}", body=str(i).encode())
    producer.send(f"/topic/{topic}", b"end")  # its receipt: every SEND before it is done
    expected = [str(i).encode() for i in range(1000)] + [b"end"]
    for sub in subs:
        got = sub.messages(1001, timeout=60)
        assert [m.body for m in got] == expected
        assert len({m.headers["message-id"] for m in got}) == 1001
    # Nothing more arrives: a final marker comes right after the last message.
    producer.send(f"/topic/{topic}", b"marker")
    for sub in subs:
        assert sub.messages(1002)[-1].body == b"marker"
        assert len(sub.listener.messages) == 1002


def test_queue_competing_consumers_get_each_message_once(stack, stomp_clients):
    queue = unique_topic("q")
    consumers = [stomp_clients(stack.port) for _ in range(2)]
    for i, c in enumerate(consumers):
        c.subscribe(f"/queue/{queue}", f"c{i}", ack="client-individual", prefetch="5")
    producer = stomp_clients(stack.port)
    for i in range(200):
        producer.conn.send(destination=f"/queue/{queue}", body=str(i).encode())
    producer.send(f"/queue/{queue}", b"200")

    def drain():
        for c in consumers:
            with c.listener.lock:
                fresh = [m for m in c.listener.messages if not hasattr(m, "acked")]
            for m in fresh:
                m.acked = True
                c.conn.ack(m.headers["ack"])
        return sum(len(c.listener.messages) for c in consumers) >= 201

    wait_for(drain, timeout=60, message="all 201 messages")
    bodies = [m.body for c in consumers for m in c.listener.messages]
    assert sorted(bodies, key=int) == [str(i).encode() for i in range(201)]
    assert all(c.listener.messages for c in consumers), "both consumers got work"


def test_nack_gives_the_message_to_another_consumer(gearmand, stack, stomp_clients):
    queue = unique_topic("q")
    a, b = stomp_clients(stack.port), stomp_clients(stack.port)
    a.subscribe(f"/queue/{queue}", "a", ack="client-individual")
    b.subscribe(f"/queue/{queue}", "b", ack="client-individual")
    stomp_clients(stack.port).send(f"/queue/{queue}", b"job")
    wait_for(lambda: a.listener.messages or b.listener.messages)
    first, second = (a, b) if a.listener.messages else (b, a)
    (message,) = first.listener.messages
    first.conn.nack(message.headers["ack"])
    (again,) = second.messages(1)
    assert again.body == b"job" and again.headers.get("redelivered") == "true"
    second.conn.ack(again.headers["ack"])
    wait_for(lambda: queue_depth(gearmand, queue) == 0, message="the ack to complete the job")


def test_unacked_message_is_redelivered_after_its_ack_timeout(stack, stomp_clients):
    queue = unique_topic("q")
    slow = stomp_clients(stack.port)
    slow.subscribe(f"/queue/{queue}", "slow", ack="client", **{"ack-timeout": "0.5"})
    stomp_clients(stack.port).send(f"/queue/{queue}", b"job")
    slow.messages(1)
    fast = stomp_clients(stack.port)
    fast.subscribe(f"/queue/{queue}", "fast", ack="client")
    (message,) = fast.messages(1)
    assert message.body == b"job" and message.headers["redelivered"] == "true"


def test_a_killed_consumer_gives_its_messages_back(stack, stomp_clients):
    queue = unique_topic("q")
    doomed = RawClient(stack.port)
    doomed.connect()
    doomed.frame("SUBSCRIBE", {"destination": f"/queue/{queue}", "id": "1", "ack": "client"})
    stomp_clients(stack.port).send(f"/queue/{queue}", b"precious")
    assert doomed.read_frame().body == b"precious"
    doomed.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
    doomed.close()  # RST, no DISCONNECT, no ACK
    heir = stomp_clients(stack.port)
    heir.subscribe(f"/queue/{queue}", "heir", ack="client")
    (message,) = heir.messages(1)
    assert message.body == b"precious"


@pytest.mark.cluster_too
@pytest.mark.parametrize("flag", ["durable", "persistent"])  # RabbitMQ's older spelling
def test_durable_topic_subscription_keeps_its_backlog(stack, stomp_clients, flag):
    topic = unique_topic()
    first = stomp_clients(stack.port, **{"client-id": "app1"})
    first.subscribe(f"/topic/{topic}", "dur", ack="client",
                    **{flag: "true", "auto-delete": "false"})
    first.close()
    producer = stomp_clients(stack.port)
    for i in range(5):
        producer.send(f"/topic/{topic}", f"m{i}".encode())
    assert control(producer, f"count-subscribers/topic/{topic}")["num-subscribers"] == "1"
    back = stomp_clients(stack.port, **{"client-id": "app1"})
    back.subscribe(f"/topic/{topic}", "dur", ack="auto", **{flag: "true"})
    assert [m.body for m in back.messages(5)] == [f"m{i}".encode() for i in range(5)]
    # UNSUBSCRIBE with the same flag ends it for good.
    rid = back.receipt()
    back.conn.unsubscribe("dur", headers={flag: "true", "receipt": rid})
    back.await_receipt(rid)
    assert control(producer, f"count-subscribers/topic/{topic}")["num-subscribers"] == "0"


def test_activemq_style_durable_subscription(stack, stomp_clients):
    topic = unique_topic()
    first = stomp_clients(stack.port, **{"client-id": "amq"})
    first.subscribe(f"/topic/{topic}", "x", **{"activemq.subscriptionName": "audit"})
    first.close()
    stomp_clients(stack.port).send(f"/topic/{topic}", b"while away")
    back = stomp_clients(stack.port, **{"client-id": "amq"})
    back.subscribe(f"/topic/{topic}", "y", **{"activemq.subscriptionName": "audit"})
    assert back.messages(1)[0].body == b"while away"


def test_non_durable_subscription_is_gone_with_its_connection(stack, stomp_clients):
    topic = unique_topic()
    producer = stomp_clients(stack.port)
    sub = stomp_clients(stack.port)
    sub.subscribe(f"/topic/{topic}", "1")
    assert control(producer, f"count-subscribers/topic/{topic}")["num-subscribers"] == "1"
    sub.close()
    wait_for(lambda: control(producer, f"count-subscribers/topic/{topic}")[
        "num-subscribers"] == "0", message="subscription cleaned up")
    result = producer.send(f"/topic/{topic}", b"nobody")
    assert result.headers["receipt-id"]


@pytest.mark.cluster_too
def test_prefix_subscription_receives_every_matching_topic(stack, stomp_clients):
    stem = unique_topic("p")
    sub = stomp_clients(stack.port)
    sub.subscribe(f"/topic/{stem}.*", "all")
    producer = stomp_clients(stack.port)
    for name in ("a", "b"):
        producer.send(f"/topic/{stem}.{name}", name.encode())
    producer.send(f"/topic/{stem}x", b"not a match")
    producer.send(f"/topic/{stem}.c", b"c")
    assert [m.body for m in sub.messages(3)] == [b"a", b"b", b"c"]
    # each MESSAGE names the topic it was published to, as RabbitMQ does
    assert [m.headers["destination"] for m in sub.messages(3)] == [
        f"/topic/{stem}.a", f"/topic/{stem}.b", f"/topic/{stem}.c"]
    assert {m.headers["subscription"] for m in sub.messages(3)} == {"all"}


def test_control_destinations_answer_in_the_receipt(stack, stomp_clients):
    queue = unique_topic("q")
    client = stomp_clients(stack.port)
    for i in range(3):
        client.send(f"/queue/{queue}", str(i).encode())
    assert control(client, f"count-msgs/queue/{queue}")["num-messages"] == "3"
    assert control(client, f"count-subscribers/queue/{queue}")["num-subscribers"] == "0"
    consumers = [stomp_clients(stack.port) for _ in range(2)]
    for c in consumers:
        c.subscribe(f"/queue/{queue}", "1", ack="client")
    assert control(client, f"count-subscribers/queue/{queue}")["num-subscribers"] == "2"


def test_transactions_commit_and_abort(stack, stomp_clients):
    queue = unique_topic("q")
    client = stomp_clients(stack.port)
    tx = client.conn.begin()
    client.conn.send(destination=f"/queue/{queue}", body=b"t1", transaction=tx)
    client.conn.send(destination=f"/queue/{queue}", body=b"t2", transaction=tx)
    assert control(client, f"count-msgs/queue/{queue}")["num-messages"] == "0"
    client.conn.commit(tx)
    assert control(client, f"count-msgs/queue/{queue}")["num-messages"] == "2"
    tx = client.conn.begin()
    client.conn.send(destination=f"/queue/{queue}", body=b"never", transaction=tx)
    client.conn.abort(tx)
    assert control(client, f"count-msgs/queue/{queue}")["num-messages"] == "2"

    consumer = stomp_clients(stack.port)
    consumer.subscribe(f"/queue/{queue}", "1", ack="client-individual", prefetch="2")
    got = consumer.messages(2)
    tx = consumer.conn.begin()
    for m in got:
        consumer.conn.ack(m.headers["ack"], transaction=tx)
    consumer.conn.abort(tx)  # the acks are void: the messages stay unacked
    assert control(client, f"count-subscribers/queue/{queue}")["num-subscribers"] == "1"
    tx = consumer.conn.begin()
    for m in got:
        consumer.conn.ack(m.headers["ack"], transaction=tx)
    rid = consumer.receipt()
    consumer.conn.commit(tx, headers={"receipt": rid})
    consumer.await_receipt(rid)
    assert [m.body for m in got] == [b"t1", b"t2"]


def test_receipts_for_every_frame_that_asks(stack):
    raw = RawClient(stack.port)
    raw.connect()
    queue = unique_topic("q")
    frames = [("SUBSCRIBE", {"destination": f"/queue/{queue}", "id": "1"}),
              ("BEGIN", {"transaction": "t"}),
              ("SEND", {"destination": f"/queue/{queue}", "transaction": "t"}),
              ("ABORT", {"transaction": "t"}),
              ("UNSUBSCRIBE", {"id": "1"}),
              ("DISCONNECT", {})]
    for n, (command, headers) in enumerate(frames):
        raw.frame(command, {**headers, "receipt": f"rc-{n}"})
    # In order; the SEND's receipt comes with the ABORT that discarded it.
    for n in range(len(frames)):
        reply = raw.read_frame()
        assert (reply.command, reply.headers["receipt-id"]) == ("RECEIPT", f"rc-{n}")
        assert (reply.headers.get("transaction-aborted") == "t") == (n == 2)
    assert raw.read_frame() is None  # closed after DISCONNECT
    raw.close()


def test_heartbeats_both_ways_and_a_silent_client_is_closed(stack):
    raw = RawClient(stack.port)
    raw.frame("CONNECT", {"accept-version": "1.2", "host": "x", "heart-beat": "100,100"})
    connected = raw.read_frame()
    assert connected.headers["heart-beat"] == "200,200"
    # The bridge beats every 200 ms; we say nothing, so it gives up on us.
    error = raw.read_frame()
    assert raw.parser.heartbeats >= 1
    assert error.command == "ERROR" and error.headers["message"] == "heart-beat timeout"
    assert raw.read_frame() is None
    raw.close()


def test_a_client_that_keeps_beating_stays_connected(stack):
    """Nothing but heart-beats for more than twice the time after which the
    bridge hangs up on a silent client (the test above), then a SEND: its
    RECEIPT shows the heart-beats kept the connection."""
    raw = RawClient(stack.port)
    raw.frame("CONNECT", {"accept-version": "1.2", "host": "x", "heart-beat": "1000,0"})
    assert raw.read_frame().command == "CONNECTED"  # silent for 2 s: hung up
    for _ in range(18):  # 4.5 s of EOLs, one every 0.25 s
        raw.send(b"\n")
        threading.Event().wait(0.25)  # the beats are the test: a pace, not a wait
    raw.frame("SEND", {"destination": f"/queue/{unique_topic('q')}", "receipt": "alive"})
    reply = raw.read_frame()
    assert (reply.command, reply.headers.get("receipt-id")) == ("RECEIPT", "alive")
    raw.close()


@pytest.mark.parametrize("garbage, reason", [
    (b"HELLO WORLD\n\n\0", "invalid command"),
    (b"SEND\ndestination:/queue/x\ncontent-length:zz\n\n\0", "invalid content-length"),
    (b"SEND\nbad header\n\n\0", "malformed header line"),
    (b"SEND\ndestination:/nowhere/x\n\n\0", "unknown destination"),
    (b"SUBSCRIBE\ndestination:/queue/x\n\n\0", "SUBSCRIBE needs an id header"),
])
def test_malformed_frame_gets_error_and_others_carry_on(stack, stomp_clients, garbage, reason):
    queue = unique_topic("q")
    bystander = stomp_clients(stack.port)
    bystander.subscribe(f"/queue/{queue}", "1")
    raw = RawClient(stack.port)
    raw.connect()
    raw.send(garbage)
    error = raw.read_frame()
    assert error.command == "ERROR" and reason in error_detail(error)
    assert raw.read_frame() is None
    raw.close()
    stomp_clients(stack.port).send(f"/queue/{queue}", b"still fine")
    assert bystander.messages(1)[0].body == b"still fine"


def test_frames_before_connect_and_oversized_frames_are_refused(stack):
    raw = RawClient(stack.port)
    raw.frame("SEND", {"destination": "/queue/x"})
    assert "before CONNECT" in error_detail(raw.read_frame())
    raw.close()
    raw = RawClient(stack.port)
    raw.connect()
    raw.send(b"SEND\ndestination:/queue/x\n\n" + b"x" * (1200 * 1024))
    assert "larger than" in raw.read_frame().headers["message"]
    raw.close()


def test_binary_body_with_nul_bytes_through_a_topic(stack, stomp_clients):
    topic = unique_topic()
    sub = stomp_clients(stack.port)
    sub.subscribe(f"/topic/{topic}", "1")
    body = bytes(range(256)) * 4
    stomp_clients(stack.port).send(f"/topic/{topic}", body)
    assert sub.messages(1)[0].body == body


@pytest.mark.parametrize("version", ["1.0", "1.1"])
def test_older_protocol_versions(stack, stomp_clients, version):
    queue = unique_topic("q")
    client = stomp_clients(stack.port, version=version)
    client.conn.subscribe(destination=f"/queue/{queue}", id="1", ack="client")
    client.send(f"/queue/{queue}", b"old")
    (message,) = client.messages(1)
    assert message.body == b"old"
    if version == "1.0":
        client.conn.ack(message.headers["message-id"])
    else:
        client.conn.ack(message.headers["message-id"], "1")
    client.send(f"/queue/{queue}", b"after ack")
    assert client.messages(2)[1].body == b"after ack"


def test_interop_with_the_gearman_command_line_tool(gearmand, stack, stomp_clients,
                                                    gearman_cli_tool):
    topic, queue = unique_topic(), unique_topic("q")
    sub = stomp_clients(stack.port)
    sub.subscribe(f"/topic/{topic}", "1")
    out = gearman_cli(gearmand, "-f", "fanout", json.dumps({"topic": topic, "payload": "gm"}))
    # Read from the topic's history (real-time topics): no copy to complete.
    assert json.loads(out.stdout)["copies"] == 0
    assert sub.messages(1)[0].body == b"gm"

    stomp_clients(stack.port).send(f"/queue/{queue}", b"to a gearman worker")
    out = gearman_cli(gearmand, "-w", "-c", "1", "-f", queue)
    assert out.stdout == b"to a gearman worker"


def test_stopping_the_bridge_returns_unacked_messages(gearmand, start_pool, start_bridge,
                                                      stomp_clients):
    start_pool([gearmand])
    bridge = start_bridge([gearmand])
    queue = unique_topic("q")
    consumer = stomp_clients(bridge.port)
    consumer.subscribe(f"/queue/{queue}", "1", ack="client")
    stomp_clients(bridge.port).send(f"/queue/{queue}", b"keep me")
    consumer.messages(1)
    bridge.process.kill()
    bridge.process.wait()
    # The bridge held the SEND's copy too: gearmand drops the job with its
    # holder, and the pool hands the copy again once the bridge's holder
    # heartbeat (worker_ttl, 6 s) is gone.
    out = subprocess.run(["gearman", "-h", gearmand.host, "-p", str(gearmand.port), "-w",
                          "-c", "1", "-f", queue], capture_output=True, timeout=60)
    assert out.stdout == b"keep me"



def test_a_stuck_consumer_does_not_delay_others_and_its_backlog_waits_in_gearmand(
        gearmand, stack, stomp_clients):
    topic = unique_topic()
    stuck = socket.socket()
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stuck.connect(("127.0.0.1", stack.port))
    # With a limit of its own it asks for a queue (not the real-time path,
    # where a reader this far behind reads on from history, told what it lost).
    stuck.sendall(encode("CONNECT", {"accept-version": "1.2", "host": "x"}) +
                  encode("SUBSCRIBE", {"destination": f"/topic/{topic}", "id": "1",
                                       "receipt": "s", "x-max-length": "100000"}))
    wait_for(lambda: b"receipt-id:s" in stuck.recv(65536, socket.MSG_PEEK))
    healthy = stomp_clients(stack.port)
    healthy.subscribe(f"/topic/{topic}", "1")
    producer = stomp_clients(stack.port)
    body = b"x" * 1024
    for _ in range(10_000):
        producer.conn.send(destination=f"/topic/{topic}", body=body)
    producer.send(f"/topic/{topic}", b"last")
    assert healthy.messages(10_001, timeout=60)[-1].body == b"last"
    # What the stuck client cannot take waits in gearmand, not in the bridge.
    from gearhorn import gearman
    waiting = sum(f.queued for f in gearman.status(gearmand.host, gearmand.port)
                  if f.name.startswith(f"{topic}_s"))
    assert waiting > 5_000
    stuck.close()


def test_connection_limit(gearmand, start_pool, start_bridge, stomp_clients):
    start_pool([gearmand])
    bridge = start_bridge([gearmand], env={"GEARHORN_STOMP_MAX_CONNECTIONS": "2"})
    # One at a time; the bridge's start-up probe may still hold a place for a
    # moment, so the second may be refused too.
    answers, held = [], []
    for _ in range(3):
        raw = RawClient(bridge.port)
        held.append(raw)  # open until the end
        raw.frame("CONNECT", {"accept-version": "1.2", "host": "x"})
        frame = raw.read_frame()
        answers.append(frame.command if frame.command == "CONNECTED"
                       else frame.headers["message"])
    assert answers[0] == "CONNECTED" and answers[2] == "too many connections (limit 2)"
    assert answers[1] in ("CONNECTED", "too many connections (limit 2)")
    for raw in held:
        raw.close()


def test_a_fanout_no_worker_answers_is_an_error_that_says_so(gearmand, start_bridge,
                                                             stomp_clients, redis_url):
    from gearhorn.rules.messages import Subscription
    from gearhorn.store import redisconn
    from gearhorn.store.keys import Keys
    from gearhorn.store.registry import Registry

    bridge = start_bridge([gearmand], env={"GEARHORN_FANOUT_TIMEOUT": "1"})  # and no pool
    client = stomp_clients(bridge.port)
    topic = unique_topic()
    # A Gearman subscriber, so the SEND needs a fanout job (one to a topic
    # only real-time readers read is the bridge's alone).
    Registry(redisconn.connect(redis_url), Keys()).subscribe(Subscription(topic, "gm"))
    client.conn.send(f"/topic/{topic}", b"x", receipt="r1")
    client.wait(lambda: client.listener.errors, message="an ERROR")
    message = error_detail(client.listener.errors[0])
    assert message == f"fanout to {topic} failed: no answer within 1s"
    assert not client.listener.receipts


def test_bridge_processes_share_the_port_and_topics_stay_right(gearmand, start_pool,
                                                               start_bridge, stomp_clients,
                                                               redis_url):
    import redis as redis_client

    from gearhorn.store.keys import Keys
    from gearhorn.store.liveness import of_bridges

    start_pool([gearmand])
    bridge = start_bridge([gearmand], env={"GEARHORN_BRIDGE_PROCESSES": "2"})
    client, keys = redis_client.Redis.from_url(redis_url, decode_responses=True), Keys()
    bridges = of_bridges(client, keys)
    wait_for(lambda: len(bridges.alive()) == 2, timeout=60, message="two bridge processes")
    topic = unique_topic()
    subscribers = [stomp_clients(bridge.port) for _ in range(20)]
    for i, sub in enumerate(subscribers):
        sub.subscribe(f"/topic/{topic}", f"s{i}")
    # Both processes hold some of the subscriptions: the kernel spread the
    # connections (all 20 on one of two processes: one chance in 500,000).
    held = [len(client.smembers(keys.bridge(b))) for b in bridges.alive()]
    assert sorted(held)[0] > 0 and sum(held) == 20, held
    producer = stomp_clients(bridge.port)
    for i in range(100):
        producer.conn.send(destination=f"/topic/{topic}", body=str(i).encode())
    producer.send(f"/topic/{topic}", b"end")
    expected = [str(i).encode() for i in range(100)] + [b"end"]
    for sub in subscribers:
        assert [m.body for m in sub.messages(101, timeout=60)] == expected
    # Stopping the bridge stops both processes.
    bridge.stop()
    wait_for(lambda: not bridges.alive(), timeout=60, message="both bridges to retire")


def test_a_message_at_a_time_costs_the_bridge_a_grab_or_two(gearmand, start_bridge,
                                                              stomp_clients):
    """A subscriber with credit for 1,000 messages that arrive one at a time:
    each wake-up asks gearmand for about one job (GRAB and PRE_SLEEP in one
    write), not for the whole credit. Before, each message cost 128 GRABs
    and 127 NO_JOBs, and the bridge's CPU went into them."""
    tap = GearmanTap(gearmand)
    try:
        bridge = start_bridge([tap])
        queue = unique_topic("one-at-a-time")
        subscriber = stomp_clients(bridge.port)
        subscriber.subscribe(f"/queue/{queue}", "s", **{"prefetch-count": "1000"})
        wait_for(lambda: tap.count(P.PRE_SLEEP), message="the bridge's grab loop to sleep")
        producer = GearClient(gearmand)
        before = tap.count(P.GRAB_JOB_UNIQ)
        for i in range(10):
            producer.submit(queue, f"m{i}".encode(), background=True)
            assert subscriber.messages(i + 1)[i].body == f"m{i}".encode()
        producer.close()
        # 1 or 2 a message; a few more if the test ran across the loop's
        # once-a-second look.
        assert tap.count(P.GRAB_JOB_UNIQ) - before <= 30
    finally:
        tap.close()


def test_a_held_copy_its_subscriber_left_unacked_stays_held_until_acked(
        stack, stomp_clients, redis_url):
    """A durable subscriber's copy with headers (its unique names them) that
    it leaves unacknowledged goes back to gearmand as the held job it is:
    never given back as a background job of gearmand's alone, its record
    forgotten (a gearmand crash would then lose it)."""
    topic = unique_topic()
    first = stomp_clients(stack.port, **{"client-id": "keeper"})
    first.subscribe(f"/topic/{topic}", "d", ack="client", durable="true")
    producer = stomp_clients(stack.port)
    producer.send(f"/topic/{topic}", b"precious", **{"x-tag": "kept"})
    assert first.messages(1)[0].body == b"precious"
    records = redisconn.connect(redis_url)
    [held] = records.scan_iter(match=Keys().copies(f"{topic}_d-*"))  # the durable queue's
    assert records.hlen(held) == 1
    first.close()  # DISCONNECT, no ACK

    heir = stomp_clients(stack.port, **{"client-id": "keeper"})
    heir.subscribe(f"/topic/{topic}", "d", ack="client", durable="true")
    (message,) = heir.messages(1)
    assert (message.body, message.headers["x-tag"]) == (b"precious", "kept")
    assert records.hlen(held) == 1  # still held: nobody acknowledged it
    heir.conn.ack(message.headers["ack"])
    wait_for(lambda: records.hlen(held) == 0, 30, message="the ACK dropping its record")
    records.close()
