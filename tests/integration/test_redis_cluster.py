"""gearhorn on a real Redis Cluster (3 masters, from ``redis-cli --cluster create``).

``redis_url`` is overridden here to point at one node of the cluster; tests
of other modules marked ``cluster_too`` run on it too, unchanged: the
pool, the bridge and the command-line tools find the cluster by asking that
node (``redis_cluster = auto``). Before the hash-tagged key layout every one
of them failed here (CROSSSLOT in the scripts, MOVED in heartbeats).
"""

import itertools
import json
import re
import subprocess
import sys
from collections import Counter
from types import SimpleNamespace

import pytest
import redis

from gearhorn.client import Producer
from gearhorn.config import Config
from gearhorn.store import redisconn
from gearhorn.store.keys import Keys
from gearhorn.store.ledger import Ledger
from gearhorn.store.ledgerentries import rows_from_entries
from gearhorn.store.ledgerexport import entries
from gearhorn.supervision import redisclusters
from tests.needs import require_binary

# Tests of other modules marked cluster_too run on the cluster too, through
# the redis_url fixture (tests/integration/conftest.py).
from .fault_helpers import (
    MESSAGES,
    SUBSCRIBERS,
    UNBOUNDED,
    SteadyProducer,
    depth,
    drain,
    publish_marker,
    stomp_subscriber,
)
from .helpers import GearClient, PoolProcess, nothing_held, unique_topic, wait_for
from .spark_helpers import reconcile

pytestmark = [pytest.mark.integration, pytest.mark.cluster, pytest.mark.timeout(240)]


@pytest.fixture
def redis_url(redis_cluster):
    for node in redis_cluster.nodes:
        redis.Redis.from_url(node.details["url"]).flushall()
    return redis_cluster.url


@pytest.fixture
def stack(gearmand, start_pool, start_bridge):
    start_pool([gearmand])
    return start_bridge([gearmand])


def test_the_node_url_is_found_to_be_a_cluster_and_keys_spread_over_its_nodes(
        redis_url, redis_cluster, gearmand, start_pool):
    client = redisconn.connect(redis_url)
    assert redisconn.is_cluster_client(client)
    assert not redisconn.is_cluster_client(redisconn.connect(redis_url, "no"))
    start_pool([gearmand])
    gear = GearClient(gearmand)
    for n in range(30):
        gear.call("subscribe_fanout", {"topic": f"spread.{n}", "client_id": "alice"})
    gear.call("subscribe_fanout", {"topic": "spread.*", "client_id": "carol"})
    assert gear.call("fanout", {"topic": "spread.7", "payload": "x",
                                "background": True})["copies"] == 2
    gear.close()
    holding = [node for node in redis_cluster.nodes
               if redis.Redis.from_url(node.details["url"]).dbsize()]
    assert len(holding) == 3  # topics, ledger streams and heartbeats on every master


def test_ledger_export_reads_every_stream_of_the_cluster(redis_url, gearmand, start_pool,
                                                         tmp_path):
    pool = start_pool([gearmand])
    topic = unique_topic()
    gear = GearClient(gearmand)
    gear.call("subscribe_fanout", {"topic": topic, "client_id": "alice"})
    for n in range(40):
        gear.call("fanout", {"topic": topic, "payload": f"m{n}", "background": True})
    gear.close()
    client, shards = redisconn.connect(redis_url), Config().ledger_shards

    def published():
        found = [r for r in rows_from_entries(entries(client, Keys(), shards))
                 if r["event"] == "published"]
        return found if len(found) == 40 else None
    writers = {r["source"] for r in wait_for(published, message="40 fanouts in the ledger")}
    assert writers <= set(pool.live())
    used = {Ledger(client, Keys(), source=w, shards=shards).stream for w in writers}
    # The two workers share a stream 1 time in 8 (crc32 of their names): a
    # writer of the test's own, on a stream neither uses, makes sure the
    # export always has more than one stream to merge.
    extra = next(ledger for ledger in (Ledger(client, Keys(), source=f"test-{n}", shards=shards)
                                       for n in itertools.count())
                 if ledger.stream not in used)
    extra.failed("planted by the test", topic=topic)
    extra.flush()
    streams = {Keys().ledger(shard) for shard in range(shards) if client.xlen(Keys().ledger(shard))}
    assert streams == used | {extra.stream}
    out = subprocess.run([sys.executable, "-m", "gearhorn", "ledger", "export", "--out",
                          str(tmp_path), "--format", "jsonl", "--redis-url", redis_url],
                         capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode()
    rows = [json.loads(line) for path in tmp_path.rglob("*.jsonl")
            for line in path.read_text().splitlines()]
    assert sum(r["event"] == "published" for r in rows) == 40
    assert sum(r["event"] == "enqueued" for r in rows) == 40
    assert [r["topic"] for r in rows if r["event"] == "failed"] == [topic]


def replicated(cluster):
    """A predicate: true once every master's replica has every write the
    master had when this was called. The target is taken once: the pool
    keeps writing (leases, heartbeats), so a master's current offset is
    always a little ahead of what its replica last acknowledged."""
    targets = []
    for node in cluster.nodes:
        if node.process.poll() is None:
            client = redis.Redis.from_url(node.details["url"])
            info = client.info("replication")
            if info["role"] == "master":
                targets.append((client, info["master_repl_offset"]))

    def caught_up():
        for client, target in targets:
            info = client.info("replication")
            replicas = [info[f"slave{n}"] for n in range(info["connected_slaves"])]
            if not replicas or any(r["offset"] < target for r in replicas):
                return False
        return True
    return caught_up


def taken_over(cluster, key, victim):
    """True once another node serves ``key``'s slot (a node may refuse to
    answer while the cluster elects one)."""
    try:
        return owner(cluster, key) is not victim
    except redisconn.REDIS_ERRORS:
        return False


def owner(cluster, key):
    """The node that serves ``key``'s hash slot now (a new client each time:
    one kept would answer from the slot map it read first; closed at once,
    as the failover test asks many times a second)."""
    client = redisconn.connect(cluster.url)
    try:
        node = client.get_node_from_key(key)
    finally:
        client.close()
    return next(n for n in cluster.nodes if n.port == node.port)


@pytest.mark.faults
@pytest.mark.timeout(600)
def test_a_master_killed_mid_broadcast_fails_over_and_nothing_acknowledged_is_lost(
        gearmand, tmp_path, report):
    """3 masters with a replica each; 5,000 messages to 10 subscribers and a
    durable STOMP subscriber receiving live through a bridge; the master
    serving the topic is killed with -9 while the broadcast runs."""
    require_binary("java", "default-jre-headless")  # for the reconciliation at the end
    cluster = redisclusters.start_redis_cluster(masters=3, replicas=1, node_timeout_ms=1000,
                                          data_dir=str(tmp_path / "cluster"))
    pool = None
    try:
        # A topic served by another master than the one in the URL every
        # process starts from (that node has to stay up to be asked).
        topic = next(t for t in (unique_topic("failover") for _ in range(100))
                     if owner(cluster, Keys().topic(t)) is not cluster.nodes[0])
        victim = owner(cluster, Keys().topic(topic))
        stack = SimpleNamespace(gearmand=gearmand, redis_url=cluster.url)
        pool = PoolProcess([gearmand], cluster.url, processes=2, log_dir=str(tmp_path),
                           env=UNBOUNDED)
        pool.wait_ready()
        subscribers = [f"s{i}" for i in range(SUBSCRIBERS)]
        with Producer([(gearmand.host, gearmand.port)]) as admin:
            for who in subscribers:
                admin.subscribe(topic, who)
        with stomp_subscriber(stack, tmp_path, topic) as (bridge, live):
            wait_for(replicated(cluster), 60, message="the subscriptions on the replicas")
            producer = SteadyProducer([(gearmand.host, gearmand.port)], topic, MESSAGES)
            producer.start()
            wait_for(lambda: depth(gearmand, f"{topic}_s0") >= MESSAGES * 0.3, 120,
                     message="30% of the copies")
            victim.kill()
            killed_at = producer.submitted
            wait_for(lambda: taken_over(cluster, Keys().topic(topic), victim), 60,
                     message="a replica to take over the topic's slot")

            producer.join(240)
            assert producer.error is None and not producer.is_alive()
            wait_for(lambda: depth(gearmand, "fanout") == 0, 240, message="every fanout done")
            marker = publish_marker(gearmand, topic)
            expected = {f"m{i}" for i in range(MESSAGES)}
            duplicates = {}
            for who in subscribers:
                # held copies (the default) come once their holder is back or taken over
                got = Counter(drain(gearmand, f"{topic}_{who}", cluster.url))
                assert got.pop(marker.decode()) == 1
                missing = expected - set(got)
                assert not missing, f"{who} lacks {len(missing)}, e.g. {sorted(missing)[:5]}"
                duplicates[who] = sum(got.values()) - len(got)
            # handed again after a crash, copies come in no promised order
            got = Counter(m.body.decode() for m in live.every(
                {m.encode() for m in expected} | {marker}, 180))
            assert got.pop(marker.decode()) == 1
            assert set(got) == expected
            duplicates["live"] = sum(got.values()) - len(got)
            # its acks are the answers that drop the records: all of them, before it goes
            wait_for(nothing_held(cluster.url, f"{topic}_d-*"), 60,
                     message="the STOMP subscriber's copies answered")
            logs = {"workers": pool.log(full=True), "bridge": bridge.log(full=True)}
        waited = len(re.findall(r"job .* waits: ", logs["workers"]))
        report(f"{MESSAGES:,} messages x {SUBSCRIBERS} subscribers + 1 live STOMP subscriber "
               f"all delivered; duplicates per subscriber (every message counted up to a "
               f"marker): {duplicates}; master :{victim.port} killed with {killed_at:,} "
               f"fanouts submitted; {waited} fanout jobs waited through the outage")
        # docs/reliability.rst: the Gearman subscribers drain afterwards, so
        # none; the live one at most one per fanout run again (one waited).
        assert {duplicates[who] for who in subscribers} == {0}, duplicates
        assert duplicates["live"] <= waited, duplicates
        problems, unaccounted = reconcile(cluster.url, tmp_path, gearmand)
        report(f"ledger reconciliation: {dict(Counter(kind for kind, _ in problems))}")
        assert problems == [], problems[:5]
        # Held copies' answers are in the ledger: every Gearman subscriber is
        # tracked, none left to count as what gearmand still holds (issue 63).
        assert unaccounted == {}, unaccounted
        for who, log in logs.items():
            errors = re.findall(r".* ERROR \[\d+\] gearhorn\..*", log)
            assert not errors, errors
            # Each loop logs an outage once (and its end once), not per retry.
            outages = Counter(re.findall(r"\[(\d+)\] (gearhorn\.\S+): (redis \(.*?\)) "
                                         r"unavailable", log))
            assert max(outages.values(), default=0) <= 2, outages
            report(f"{who} logged the outage: {sorted(set(k[2] for k in outages))}, "
                   f"{len(re.findall(r'job .* waits: ', log))} waiting jobs")
    finally:
        if pool is not None:
            pool.stop()
        cluster.stop()


def migrate_slot(cluster, key, target, midway):
    """Move ``key``'s hash slot to ``target`` the way redis-cli --cluster
    reshard does, and call ``midway(source)`` with the keys moved but the
    slot not yet handed over: then the source answers ASK; after, MOVED."""
    source = owner(cluster, key)
    nodes = {n.port: redis.Redis.from_url(n.details["url"]) for n in cluster.nodes}
    src, dst = nodes[source.port], nodes[target.port]
    slot = src.cluster("keyslot", key)
    ids = {n.port: nodes[n.port].cluster("myid").decode() for n in cluster.nodes}
    dst.cluster("setslot", slot, "importing", ids[source.port])
    src.cluster("setslot", slot, "migrating", ids[target.port])
    while keys := src.cluster("getkeysinslot", slot, 1):
        src.migrate(target.host, target.port, keys, 0, 5000)
    midway(src)
    for port in (target.port, source.port, *(p for p in nodes if p not in (target.port,
                                                                           source.port))):
        nodes[port].cluster("setslot", slot, "node", ids[target.port])


def test_fanouts_ride_through_a_slot_moving_to_another_master(redis_url, redis_cluster,
                                                               gearmand, start_pool):
    """The topic's slot moves while fanouts run: fanouts made while the
    source answers ASK and after it answers MOVED both reach everyone, and
    the subscriber set moved whole."""
    start_pool([gearmand])
    topic = unique_topic("moving")
    key = Keys().topic(topic)
    gear = GearClient(gearmand)
    for who in ("a", "b", "c"):
        gear.call("subscribe_fanout", {"topic": topic, "client_id": who})
    masters = [n for n in redis_cluster.nodes
               if redis.Redis.from_url(n.details["url"]).info("replication")["role"] == "master"]
    target = next(n for n in masters if n is not owner(redis_cluster, key))
    producer = SteadyProducer([(gearmand.host, gearmand.port)], topic, 600, batch=20,
                              pause=0.02)
    producer.start()
    wait_for(lambda: depth(gearmand, f"{topic}_a") >= 100, 60, message="100 copies")

    def midway(source):
        with pytest.raises(redis.exceptions.AskError):
            source.smembers(key)  # the slot is migrating: the source sends clients on
        assert gear.call("fanout", {"topic": topic, "payload": "midway",
                                    "background": True})["copies"] == 3
    migrate_slot(redis_cluster, key, target, midway)
    assert owner(redis_cluster, key) is target
    producer.join(120)
    assert producer.error is None and not producer.is_alive()
    # The producer's fanouts are background jobs: submitted is not yet run.
    # d must join after the last of them ran, or it rightly gets its copy.
    wait_for(lambda: depth(gearmand, "fanout") == 0, 120, message="every fanout done")
    gear.call("subscribe_fanout", {"topic": topic, "client_id": "d"})
    assert gear.call("fanout", {"topic": topic, "payload": "last",
                                "background": True})["copies"] == 4
    gear.close()
    expected = {f"m{i}" for i in range(600)} | {"midway", "last"}
    for who in ("a", "b", "c"):
        assert set(drain(gearmand, f"{topic}_{who}")) == expected
    assert drain(gearmand, f"{topic}_d") == ["last"]
