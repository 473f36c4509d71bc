"""Bounded subscriber queues on real gearmand and Redis: a subscriber that
stops reading keeps at most its limit, the others get everything; expired
copies are never handed out; an unused subscription goes; a full queue
store fails fanouts with a reason instead of hanging them.
(docs/reliability.rst, "Bounded queues")"""

from __future__ import annotations

import json
import subprocess
import threading
import time

import pytest
import redis

from gearhorn import gearman
from gearhorn.rules.limits import Limits
from gearhorn.rules.messages import Subscription
from gearhorn.rules.naming import stream_client_id
from gearhorn.store import redisconn
from gearhorn.store.keys import Keys
from gearhorn.store.ledgerentries import rows_from_entries
from gearhorn.store.ledgerexport import entries
from gearhorn.supervision import servers

from .helpers import (
    GearClient,
    PoolProcess,
    drain_jobs,
    gearman_cli,
    queue_depth,
    unique_topic,
    wait_for,
)
from .stomp_helpers import BridgeProcess, RawClient, error_detail

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

# The warden goes round five times a second here (once by default).
BRISK = {"GEARHORN_RETENTION_INTERVAL": "0.2"}


@pytest.fixture
def gc(gearmand):
    gear_client = GearClient(gearmand)
    yield gear_client
    gear_client.close()


def subscribe(gc, topic, client_id, **limits):
    return gc.call("subscribe_fanout", {"topic": topic, "client_id": client_id, **limits})


def publish(gc, topic, bodies, **extra):
    """One fanout job with ``bodies`` in order; its result."""
    return gc.call("fanout", {"topic": topic, "payloads": bodies, "background": True,
                                  **extra})


def dropped(redis_url, queue):
    """(reason, unique) of every ``dropped`` ledger entry of ``queue``."""
    gc = redisconn.connect(redis_url)
    rows = rows_from_entries(entries(gc, Keys(), 8))
    return [(r["reason"], r["unique"]) for r in rows
            if r["event"] == "dropped" and r["subscriber"] == queue]


def totals(redis_url):
    raw = redisconn.connect(redis_url).hgetall(Keys().stats("totals"))
    return {k.decode(): int(float(v)) for k, v in raw.items()}


def bodies_of(jobs):
    return [job.data.decode() for job in jobs]


@pytest.mark.cluster_too
def test_drop_head_keeps_the_newest_in_order_beside_a_live_subscriber(
        gearmand, start_pool, gc, redis_url):
    start_pool([gearmand], processes=1, env=BRISK)
    topic = unique_topic("dh")
    subscribe(gc, topic, "slow", max_length=100, overflow="drop-head")
    subscribe(gc, topic, "live")
    sent = [f"m{i:03d}" for i in range(300)]
    for chunk in range(0, 300, 50):  # six fanouts of 50 messages, in order
        assert publish(gc, topic, sent[chunk:chunk + 50])["copies"] == 100
    slow = f"{topic}_slow"
    wait_for(lambda: queue_depth(gearmand, slow) == 100 and len(dropped(redis_url, slow)) == 200,
             timeout=60, message="the slow queue cut to its newest 100")
    assert bodies_of(drain_jobs(gearmand, slow)) == sent[200:]
    assert bodies_of(drain_jobs(gearmand, f"{topic}_live")) == sent
    reasons = {reason for reason, _ in dropped(redis_url, slow)}
    assert reasons == {"maxlen"} and totals(redis_url)["dropped:maxlen"] == 200
    assert dropped(redis_url, f"{topic}_live") == []


def test_the_default_cap_bounds_a_subscriber_that_never_reads(
        gearmand, start_pool, gc, redis_url):
    start_pool([gearmand], processes=1, env={**BRISK, "GEARHORN_QUEUE_MAX_LENGTH": "40"})
    topic = unique_topic("cap")
    subscribe(gc, topic, "dead")
    subscribe(gc, topic, "reader")
    got = []
    # The live one reads as it goes, a chunk at most the cap at a time: more,
    # and the warden could trim its queue too before it drains it.
    for chunk in range(5):
        publish(gc, topic, [f"{chunk}-{i}" for i in range(40)])
        got += bodies_of(drain_jobs(gearmand, f"{topic}_reader"))
    assert got == [f"{c}-{i}" for c in range(5) for i in range(40)]
    wait_for(lambda: queue_depth(gearmand, f"{topic}_dead") == 40
             and len(dropped(redis_url, f"{topic}_dead")) == 160,
             timeout=60, message="the dead subscriber held at the default cap")
    assert bodies_of(drain_jobs(gearmand, f"{topic}_dead")) == [f"4-{i}" for i in range(40)]


@pytest.mark.cluster_too
def test_reject_publish_lists_the_full_subscriber_and_leaves_the_others_alone(
        gearmand, start_pool, gc, redis_url):
    start_pool([gearmand], processes=1, env=BRISK)
    topic = unique_topic("rp")
    subscribe(gc, topic, "capped", max_length=5, overflow="reject-publish")
    subscribe(gc, topic, "other")
    assert "full" not in publish(gc, topic, [f"a{i}" for i in range(5)])
    capped = f"{topic}_capped"
    keys = Keys()
    registry_redis = redisconn.connect(redis_url)
    wait_for(lambda: registry_redis.sismember(keys.full, capped), timeout=30,
             message="the capped queue marked full")
    # The workers hear of it on the matchmaking channel: a fanout made before
    # they did may still copy (docs/reliability.rst); it shows in the depth.
    late, deadline = 0, time.monotonic() + 30
    while "full" not in (result := publish(gc, topic, [f"b{late}"])):
        late += 1
        assert time.monotonic() < deadline, "the workers never heard the queue was full"
    assert (result["full"], result["copies"]) == (["capped"], 1)
    assert publish(gc, topic, ["after"])["full"] == ["capped"]
    early = [f"b{i}" for i in range(late)]
    assert bodies_of(drain_jobs(gearmand, f"{topic}_other")) == [
        *[f"a{i}" for i in range(5)], *early, f"b{late}", "after"]
    # A foreground fanout says so too (the other's copy answered by a worker).
    answered = subprocess.Popen(["gearman", "-h", gearmand.host, "-p", str(gearmand.port),
                                 "-w", "-f", f"{topic}_other", "-c", "1", "--", "cat"],
                                stdout=subprocess.DEVNULL)
    try:
        foreground = gc.call("fanout", {"topic": topic, "payload": "c0"}, timeout=60)
    finally:
        answered.wait(timeout=60)
    assert foreground["full"] == ["capped"] and foreground["failed"] == []
    assert bodies_of(drain_jobs(gearmand, capped)) == [f"a{i}" for i in range(5)] + early
    assert sorted(reason for reason, _ in dropped(redis_url, capped)) == ["full"] * 3


@pytest.mark.cluster_too
def test_a_burst_never_takes_a_reject_publish_queue_past_its_limit(
        gearmand, start_pool, gc, redis_url):
    """Three fanouts of 100 messages at once, from two workers, to a
    max_length 5 reject-publish subscriber: it takes the first 5, as
    RabbitMQ's x-overflow reject-publish does, and never more (before the
    room was claimed at copy time, it held all 300 until the warden's next
    round)."""
    start_pool([gearmand], processes=2, env=BRISK)
    topic = unique_topic("burst")
    subscribe(gc, topic, "capped", max_length=5, overflow="reject-publish")
    subscribe(gc, topic, "other")
    clients = [GearClient(gearmand) for _ in range(3)]
    results = [None] * 3

    def send(n):
        results[n] = publish(clients[n], topic, [f"{n}-{i}" for i in range(100)])
    senders = [threading.Thread(target=send, args=(n,)) for n in range(3)]
    try:
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join(60)
    finally:
        for client in clients:
            client.close()
    assert all(r is not None for r in results), results
    capped = bodies_of(drain_jobs(gearmand, f"{topic}_capped"))
    assert len(capped) == 5, capped
    assert len(bodies_of(drain_jobs(gearmand, f"{topic}_other"))) == 300
    assert sum(r["copies"] for r in results) == 305
    assert sum(r.get("full", []) == ["capped"] for r in results) >= 2  # said so
    wait_for(lambda: len(dropped(redis_url, f"{topic}_capped")) == 295, timeout=30,
             message="every copy not made in the ledger")


def consume_one(gearmand, queue, out, timeout_ms):
    """``gearman -w`` taking at most one job of ``queue`` within ``timeout_ms``;
    what it took is appended to ``out``."""
    gearman_cli(gearmand, "-w", "-f", queue, "-c", "1", "-t", str(timeout_ms), "--",
                "sh", "-c", f"cat >> {out}", timeout=timeout_ms / 1000 + 30)
    return out.read_bytes() if out.exists() else b""


@pytest.mark.cluster_too
def test_an_expired_copy_is_never_handed_to_a_plain_gearman_worker(
        gearmand, start_pool, gc, redis_url, gearman_cli_tool, tmp_path):
    start_pool([gearmand], processes=1, env=BRISK)
    topic = unique_topic("ttl")
    subscribe(gc, topic, "late", message_ttl=1)
    publish(gc, topic, ["x", "y", "z"])
    queue = f"{topic}_late"
    wait_for(lambda: len(dropped(redis_url, queue)) == 3, timeout=30,
             message="three copies expired")
    assert queue_depth(gearmand, queue) == 0
    # A consumer that comes now gets nothing: it waits out its 1 s timeout.
    assert consume_one(gearmand, queue, tmp_path / "late.out", 1000) == b""
    assert {reason for reason, _ in dropped(redis_url, queue)} == {"expired"}
    assert totals(redis_url)["dropped:expired"] == 3
    # Subscribing again with another TTL changes it: a copy younger than
    # that is there for a consumer.
    subscribe(gc, topic, "late", message_ttl=60)
    publish(gc, topic, ["fresh"])
    assert consume_one(gearmand, queue, tmp_path / "fresh.out", 20_000) == b"fresh"


@pytest.mark.cluster_too
def test_expires_removes_an_unused_subscription_and_keeps_a_consumed_one(
        gearmand, start_pool, gc, redis_url):
    pool = start_pool([gearmand], processes=1, env=BRISK)
    topic = unique_topic("exp")
    consumer = subprocess.Popen(["gearman", "-h", gearmand.host, "-p", str(gearmand.port),
                                 "-w", "-f", f"{topic}_kept", "--", "cat"],
                                stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: any(f.name == f"{topic}_kept" and f.workers
                             for f in _status(gearmand)), message="the consumer registered")
        subscribe(gc, topic, "gone", expires=1)
        subscribe(gc, topic, "kept", expires=1)
        # A STOMP stream subscription has no queue, so never a consumer there:
        # it is not the warden's to expire (docs/stomp.rst).
        streamed = stream_client_id()
        pool.registry.subscribe(Subscription(topic, streamed, Limits(expires=1), bridge="b"))
        publish(gc, topic, ["one", "two"])
        wait_for(lambda: pool.registry.subscribers(topic) == {"kept", streamed}
                 and len(dropped(redis_url, f"{topic}_gone")) == 2, timeout=30,
                 message="the unused subscription removed with its copies")
        removed_at = time.time()
        assert sorted(r for r, _ in dropped(redis_url, f"{topic}_gone")) == ["removed"] * 2
        assert queue_depth(gearmand, f"{topic}_gone") == 0
        # Its function is dropped from gearmand too, and the round went on.
        wait_for(lambda: all(f.name != f"{topic}_gone" for f in _status(gearmand)),
                 timeout=30, message="the unused queue's function dropped")
        # Rounds well past its expiry later, the consumed one is still there.
        backlogs = Keys().backlogs
        registry_redis = redisconn.connect(redis_url)
        wait_for(lambda: json.loads(registry_redis.get(backlogs))["at"] > removed_at + 2,
                 timeout=30, message="the warden's rounds 2 s on")
        assert pool.registry.subscribers(topic) == {"kept", streamed}
        assert "Traceback" not in pool.log(full=True)
    finally:
        consumer.kill()
        consumer.wait(timeout=10)


def _status(server):
    from gearhorn import gearman

    return gearman.status(server.host, server.port)


@pytest.fixture
def small_copy_store(tmp_path):
    """A plain gearmand, and a registry's Redis of the test's own to fill
    with held copies: (gearmand, that Redis)."""
    store = servers.start_redis(data_dir=str(tmp_path / "registry"))
    gearmand = servers.start_gearmand(data_dir=str(tmp_path / "gearmand"))
    yield gearmand, store
    gearmand.stop()
    store.stop()


def test_a_full_queue_store_fails_fanouts_with_a_reason_and_recovers(
        small_copy_store, tmp_path, stomp_clients):
    """The held copies fill the registry's Redis up to queue_maxmemory:
    above queue_store_guard of it fanouts and SENDs are refused with the
    reason (heartbeats and subscriptions go on: no Redis maxmemory stops
    them), nothing accepted is lost, and once the backlog is consumed they
    are accepted again."""
    gearmand, store = small_copy_store
    store_url = store.details["url"]
    store_redis = redis.Redis.from_url(store_url)
    # Room for a few hundred copies on top of what an idle pool and bridge use.
    most = int(store_redis.info("memory")["used_memory"]) + 6 * 1024 * 1024
    env = {**BRISK, "GEARHORN_FANOUT_TIMEOUT": "10", "GEARHORN_QUEUE_MAX_LENGTH": "0",
           "GEARHORN_QUEUE_MAXMEMORY": str(most)}
    pool = PoolProcess([gearmand], store_url, 1, log_dir=str(tmp_path), env=env).wait_ready()
    bridge = BridgeProcess([gearmand], store_url, str(tmp_path), env)
    gc = GearClient(gearmand)
    try:
        topic = unique_topic("hog")
        subscribe(gc, topic, "hog")
        accepted, failure, started = 0, None, None
        payload = "x" * 20_000
        for _ in range(2000):
            started = time.monotonic()
            job = gc.submit("fanout", {"topic": topic, "payload": payload,
                                           "background": True}, timeout=60)
            if job.failure:
                failure = b"".join(job.data).decode() or "failed"
                break
            accepted += json.loads(b"".join(job.data))["copies"]
        assert failure is not None, "the store never filled"
        assert time.monotonic() - started <= 10 + 5  # within fanout_timeout, not a hang
        # The reason names the largest backlogs the warden judged; the round
        # that saw the store over its guard may not have judged the hog's
        # queue yet (once, side by side: "largest backlogs: none"). Later
        # fanouts fail too, and soon name it.
        deadline = time.monotonic() + 60
        while f"{topic}_hog" not in failure and time.monotonic() < deadline:
            assert "queue store full" in failure, failure
            started = time.monotonic()
            job = gc.submit("fanout", {"topic": topic, "payload": payload,
                                           "background": True}, timeout=60)
            assert job.failure, "a fanout accepted while the queue store is full"
            assert time.monotonic() - started <= 10 + 5
            failure = b"".join(job.data).decode() or "failed"
        assert "queue store full" in failure and f"{topic}_hog" in failure, failure
        # A STOMP SEND with a receipt gets an ERROR with the same reason.
        sender = stomp_clients(bridge.port)
        sender.conn.send(destination=f"/topic/{topic}", body=b"one more",
                         receipt=sender.receipt())
        try:
            sender.wait(lambda: sender.listener.errors, 60, "an ERROR")
        except AssertionError as exc:  # once in a side-by-side run: say where it stood
            status = {f.name: (f.queued, f.running, f.workers)
                      for f in gearman.status(gearmand.host, gearmand.port)}
            receipts = [r.headers for r in sender.listener.receipts]
            raise AssertionError(f"{exc}; gearmand (queued, running, workers): {status}; "
                                 f"receipts: {receipts}; disconnected: "
                                 f"{sender.listener.disconnected.is_set()}; bridge log:\n"
                                 f"{bridge.log()}") from None
        said = sender.listener.errors[0].headers["message"]
        assert "queue store full" in said and f"{topic}_hog" in said, said
        # Every copy accepted is there; consumed, it makes room again.
        assert queue_depth(gearmand, f"{topic}_hog") == accepted
        assert len(drain_jobs(gearmand, f"{topic}_hog")) == accepted
        wait_for(lambda: not _refused(gc, topic), timeout=60,
                 message="fanouts accepted again")
    finally:
        gc.close()
        bridge.stop()
        pool.stop()
        store_redis.close()


def _refused(gc, topic):
    job = gc.submit("fanout", {"topic": topic, "payload": "again", "background": True},
                        timeout=60)
    return bool(job.failure)


@pytest.fixture
def bridge(gearmand, start_pool, start_bridge):
    start_pool([gearmand], processes=1, env=BRISK)
    return start_bridge([gearmand])


@pytest.mark.cluster_too
def test_a_durable_stomp_subscription_takes_rabbitmqs_limit_headers(
        gearmand, bridge, stomp_clients, redis_url):
    topic = unique_topic("sx")
    away = stomp_clients(bridge.port, **{"client-id": "app"})
    away.subscribe(f"/topic/{topic}", "dur", ack="client", durable="true",
                   **{"x-max-length": "3", "x-overflow": "drop-head"})
    away.close()
    producer = stomp_clients(bridge.port)
    for i in range(10):
        producer.send(f"/topic/{topic}", f"m{i}".encode())
    queue = [q for q in _subscription_queues(redis_url) if q.startswith(f"{topic}_")][0]
    wait_for(lambda: queue_depth(gearmand, queue) == 3 and len(dropped(redis_url, queue)) == 7,
             timeout=60, message="the durable queue cut to 3")
    back = stomp_clients(bridge.port, **{"client-id": "app"})
    back.subscribe(f"/topic/{topic}", "dur", ack="auto", durable="true")
    assert [m.body for m in back.messages(3)] == [b"m7", b"m8", b"m9"]


def test_an_invalid_limit_header_is_an_error_frame_and_nothing_is_subscribed(
        bridge, stomp_clients, redis_url):
    raw = RawClient(bridge.port)
    raw.connect()
    topic = unique_topic("bad")
    raw.frame("SUBSCRIBE", {"destination": f"/topic/{topic}", "id": "1",
                            "x-max-length": "lots"})
    error = raw.expect("ERROR")
    assert error.headers["message"] == "Invalid header"
    assert "x-max-length must be a whole number, got 'lots'" in error_detail(error)
    raw.close()
    assert not [q for q in _subscription_queues(redis_url) if q.startswith(f"{topic}_")]


def _subscription_queues(redis_url):
    return [q.decode() for q in redisconn.connect(redis_url).hkeys(Keys().subscriptions)]


@pytest.mark.cluster_too
def test_a_stomp_queue_subscription_bounds_the_queue_and_its_ttl(
        gearmand, bridge, stomp_clients, redis_url):
    queue, short = unique_topic("sq"), unique_topic("sqttl")
    reader = stomp_clients(bridge.port)
    reader.subscribe(f"/queue/{queue}", "1", **{"x-max-length": "3"})
    reader.subscribe(f"/queue/{short}", "2", **{"x-message-ttl": "1000"})
    reader.close()
    sender = stomp_clients(bridge.port)
    for i in range(10):
        sender.send(f"/queue/{queue}", f"m{i}".encode())
    sender.send(f"/queue/{short}", b"soon gone")
    wait_for(lambda: queue_depth(gearmand, queue) == 3 and len(dropped(redis_url, queue)) == 7,
             timeout=60, message="the queue cut to its newest 3")
    wait_for(lambda: [r for r, _ in dropped(redis_url, short)] == ["expired"], timeout=60,
             message="the queue's message expired")
    back = stomp_clients(bridge.port)
    back.subscribe(f"/queue/{queue}", "1")
    assert [m.body for m in back.messages(3)] == [b"m7", b"m8", b"m9"]
    assert queue_depth(gearmand, short) == 0


def test_a_send_to_a_full_reject_publish_queue_is_an_error(
        gearmand, bridge, stomp_clients, redis_url):
    queue = unique_topic("sqfull")
    reader = stomp_clients(bridge.port)
    reader.subscribe(f"/queue/{queue}", "1",
                     **{"x-max-length": "2", "x-overflow": "reject-publish"})
    reader.close()
    sender = stomp_clients(bridge.port)
    sender.send(f"/queue/{queue}", b"a")
    sender.send(f"/queue/{queue}", b"b")
    registry_redis = redisconn.connect(redis_url)
    wait_for(lambda: registry_redis.sismember(Keys().full, queue), timeout=30,
             message="the queue marked full")
    # The bridge reads the mark at most 0.25 s late: a SEND before that is queued.
    late, deadline = 0, time.monotonic() + 30
    while True:
        sender = stomp_clients(bridge.port)
        sender.conn.send(destination=f"/queue/{queue}", body=b"late",
                         receipt=sender.receipt())
        sender.wait(lambda s=sender: s.listener.errors or s.listener.receipts, 30, "an answer")
        if sender.listener.errors:
            break
        late += 1
        assert time.monotonic() < deadline, "the bridge never refused"
        sender.close()
    said = sender.listener.errors[0].headers["message"]
    assert f"queue {queue} is full (reject-publish)" in said, said
    assert queue_depth(gearmand, queue) == 2 + late


def test_an_invalid_limit_fails_the_subscribe_with_its_reason_and_subscribes_nothing(
        gearmand, start_pool, gearman_cli_tool, redis_url):
    pool = start_pool([gearmand], processes=1)
    topic = unique_topic("inv")
    out = gearman_cli(gearmand, "-f", "subscribe_fanout", json.dumps(
        {"topic": topic, "client_id": "c", "max_length": 10, "overflow": "drop-tail"}))
    assert out.returncode != 0
    said = out.stdout.decode() + out.stderr.decode()
    assert "overflow must be drop-head or reject-publish, got 'drop-tail'" in said, said
    assert pool.registry.subscribers(topic) == set()
    assert f"{topic}_c" not in _subscription_queues(redis_url)
    # The same subscription with valid limits is taken, and says so.
    ok = gearman_cli(gearmand, "-f", "subscribe_fanout", json.dumps(
        {"topic": topic, "client_id": "c", "max_length": 10, "overflow": "reject-publish"}))
    assert json.loads(ok.stdout)["subscribers"] == 1
    entry = json.loads(redisconn.connect(redis_url).hget(Keys().subscriptions, f"{topic}_c"))
    assert entry["limits"] == {"max_length": 10, "overflow": "reject-publish"}
