"""gearhorn on Redis Sentinel: a ``redis+sentinel://`` URL follows the master
through a failover (a real master, replica and Sentinel on loopback)."""

import json
import threading

import pytest
import redis

from gearhorn.store import redisconn
from gearhorn.supervision import redisclusters, servers
from tests.needs import require_binary

from .helpers import GearClient, PoolProcess, drain_queue, unique_topic, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture
def sentinel_stack(tmp_path):
    require_binary("redis-server", "redis-server")
    started = []
    try:
        master = servers.start_redis(data_dir=str(tmp_path / "master"), appendonly=True)
        started.append(master)
        replica = servers.start_redis(data_dir=str(tmp_path / "replica"), appendonly=True,
                                      extra=["--replicaof", master.host, str(master.port)])
        started.append(replica)
        sentinel = redisclusters.start_redis_sentinel(master, "gearhorn",
                                                      str(tmp_path / "sentinel"))
        started.append(sentinel)
        yield master, replica, sentinel
    finally:
        for server in reversed(started):
            server.stop()


def replication(server):
    """INFO replication; {} while the node drops its clients (Sentinel kills
    the connections of a replica it promotes)."""
    try:
        return redis.Redis.from_url(server.details["url"]).info("replication")
    except redis.ConnectionError:
        return {}


def port_of(client):
    """The port of the server ``client`` reaches now; None while it cannot."""
    try:
        return client.info("server")["tcp_port"]
    except redis.RedisError:  # refused, no master named yet, timed out
        return None


def answer(gear, function, payload):
    """A job's result; a job that met the failover first gets a WORK_WARNING
    ("... retrying"), which gear puts before the result in ``data``."""
    job = gear.submit(function, payload, timeout=60)
    assert not job.failure, job.data
    return json.loads(job.data[-1])


def test_a_sentinel_url_follows_the_master_through_a_failover(sentinel_stack, gearmand,
                                                              tmp_path):
    master, replica, sentinel = sentinel_stack
    url = sentinel.details["url"]
    assert redisconn.connect(url).info("server")["tcp_port"] == master.port
    capped = redisconn.connect(url, max_connections=2)  # as the bridge opens Redis
    assert capped.info("server")["tcp_port"] == master.port
    pool = PoolProcess([gearmand], url, processes=1, log_dir=str(tmp_path))
    gear = GearClient(gearmand)
    try:
        pool.wait_ready()
        topic = unique_topic("sentinel")
        gear.call("subscribe_fanout", {"topic": topic, "client_id": "alice"})
        before = {"topic": topic, "payload": "before", "background": True}
        assert gear.call("fanout", before)["copies"] == 1
        wait_for(lambda: replication(replica).get("master_link_status") == "up"
                 and replication(replica)["slave_repl_offset"]
                 >= replication(master)["master_repl_offset"], 30,
                 message="the replica to have every write")
        master.kill()
        wait_for(lambda: replication(replica).get("role") == "master", 60,
                 message="Sentinel to promote the replica")

        wait_for(lambda: port_of(capped) == replica.port, 60,
                 message="the capped client to follow the new master")
        # The pool follows the new master: alice is still subscribed, bob joins.
        assert answer(gear, "subscribe_fanout",
                      {"topic": topic, "client_id": "bob"})["subscribers"] == 2
        after = {"topic": topic, "payload": "after", "background": True}
        assert answer(gear, "fanout", after)["copies"] == 2
        assert drain_queue(gearmand, f"{topic}_alice") == [b"before", b"after"]
        assert drain_queue(gearmand, f"{topic}_bob") == [b"after"]
    finally:
        gear.close()
        pool.stop()


def test_a_capped_sentinel_client_makes_callers_wait_for_a_free_connection(sentinel_stack):
    """The bridge caps its Redis connections (max_connections) so that a
    burst of greenlets waits for a free one: with Sentinel too. redis-py's
    Sentinel pool would open more, then fail with "Too many connections"."""
    master, replica, sentinel = sentinel_stack
    client = redisconn.connect(sentinel.details["url"], max_connections=3,
                               client_name="capped", socket_timeout=10)
    callers = 12
    start = threading.Barrier(callers)
    errors = []

    def hold_a_connection(i):
        start.wait(30)
        try:
            client.blpop(f"nothing-{i}", timeout=0.5)  # holds its connection meanwhile
        except redis.RedisError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=hold_a_connection, args=(i,)) for i in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    named = [c for c in redis.Redis.from_url(master.details["url"]).client_list()
             if c["name"] == "capped"]
    assert 1 <= len(named) <= 3
