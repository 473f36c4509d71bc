"""Acknowledgements after replication, on real servers: with
``min_replicas = 1`` the worker pool and the bridge answer only once a
replica of the registry's Redis holds what the answer covers, and refuse
with the reason while none confirms (gearhorn/store/replicas.py).

A real master (AOF, with its syncer) and a real replica (``--replicaof``);
the replica is paused with SIGSTOP to make it miss the writes, as a
replica behind a partition does."""

from __future__ import annotations

import signal

import pytest
import redis

from gearhorn.store.keys import Keys
from gearhorn.supervision import servers
from tests.needs import require_binary

from .helpers import GearClient, PoolProcess, unique_topic, wait_for
from .stomp_helpers import BridgeProcess, StompClient

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SETTINGS = {"GEARHORN_MIN_REPLICAS": "1", "GEARHORN_REPLICA_TIMEOUT": "0.5",
            "GEARHORN_BARRIER_TIMEOUT": "2"}


class Paused:
    """A server stopped with SIGSTOP until the block ends (SIGCONT)."""

    def __init__(self, server):
        self.server = server

    def __enter__(self):
        self.server.process.send_signal(signal.SIGSTOP)
        return self

    def __exit__(self, *exc):
        self.server.process.send_signal(signal.SIGCONT)


@pytest.fixture
def replicated(tmp_path):
    require_binary("redis-server", "redis-server")
    master = servers.start_redis(data_dir=str(tmp_path / "master"), appendonly=True)
    replica = servers.start_redis(data_dir=str(tmp_path / "replica"), appendonly=True,
                                  extra=["--replicaof", master.host, str(master.port)])
    try:
        client = redis.Redis.from_url(replica.details["url"])
        wait_for(lambda: client.info("replication").get("master_link_status") == "up", 60,
                 message="the replica to sync")
        yield master, replica, client
    finally:
        replica.process.send_signal(signal.SIGCONT)
        replica.stop()
        master.stop()


def held_on(client, queue):
    """Records of held copies for ``queue`` on the Redis of ``client``."""
    return client.hlen(Keys().copies(queue))


@pytest.mark.parametrize("min_replicas", ["1", "0"])
def test_a_fanout_is_answered_only_once_a_replica_holds_its_copies(
        replicated, gearmand, tmp_path, min_replicas):
    """min_replicas = 1: each answered fanout's copy is on the replica when
    the answer comes; with the replica paused the fanout fails with the
    reason, and works again once it is back. min_replicas = 0 (the control):
    the paused replica is not waited for, so the answer says nothing of it."""
    master, replica, on_replica = replicated
    pool = PoolProcess([gearmand], master.details["url"], processes=1, log_dir=str(tmp_path),
                       env={**SETTINGS, "GEARHORN_MIN_REPLICAS": min_replicas})
    client = GearClient(gearmand)
    topic = unique_topic("replicas")
    queue = f"{topic}_bob"
    try:
        pool.wait_ready()
        client.call("subscribe_fanout", {"topic": topic, "client_id": "bob"})
        for sent in range(1, 6):  # bob is away: every copy stays held
            answer = client.call("fanout", {"topic": topic, "payload": f"m{sent}",
                                            "background": True})
            assert answer["copies"] == 1
            if min_replicas == "1":
                assert held_on(on_replica, queue) == sent  # read at once: no waiting
        with Paused(replica):
            job = client.submit("fanout", {"topic": topic, "payload": "unreplicated",
                                           "background": True}, timeout=60)
        said = b"".join(job.data).decode()
        if min_replicas == "0":
            assert not job.failure, said
            return
        assert job.failure, said
        assert "only 0 of the 1 replicas of the registry's Redis" in said, said
        assert "waited 2s for it" in said, said
        wait_for(lambda: on_replica.info("replication").get("master_link_status") == "up",
                 60, message="the replica to catch up")
        answer = client.call("fanout", {"topic": topic, "payload": "back",
                                        "background": True}, timeout=60)
        assert answer["copies"] == 1
        # The refused copy was written on the master, so it may still be
        # delivered; what was answered is on the replica.
        assert held_on(on_replica, queue) >= 6
        assert "replicas: also on 1 replica(s)" in pool.log(full=True)
    finally:
        client.close()
        pool.stop()


def test_a_receipt_waits_for_a_replica_and_none_is_an_error_frame(replicated, gearmand,
                                                                 tmp_path):
    master, replica, on_replica = replicated
    bridge = BridgeProcess([gearmand], master.details["url"], str(tmp_path), env=SETTINGS)
    client = StompClient(bridge.port)
    try:
        client.send("/queue/replicated", b"one")  # waits for its RECEIPT
        assert held_on(on_replica, "replicated") == 1
        with Paused(replica):
            client.conn.send(destination="/queue/replicated", body=b"two", receipt="r-none")
            client.wait(lambda: client.listener.errors, 60, "an ERROR")
        message = client.listener.errors[0].headers["message"]
        assert "only 0 of the 1 replicas" in message, message
        assert "r-none" not in client.listener.arrived
    finally:
        client.close()
        bridge.stop()
