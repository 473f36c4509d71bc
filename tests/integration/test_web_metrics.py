"""``gearhorn web``: /metrics read with prometheus_client's parser, health and
readiness, on real Redis, gearmand, worker pools and bridges."""

from __future__ import annotations

import json
import os
import signal
import threading

import pytest
import redis

from gearhorn.config import Config
from gearhorn.store.keys import Keys
from gearhorn.store.ledgerentries import rows_from_entries
from gearhorn.store.ledgerexport import entries
from gearhorn.supervision import servers
from tests.needs import require_binary

from .helpers import GearClient, PoolProcess, unique_topic, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def copies(metrics, topic):
    return metrics.get(("gearhorn_copies_total", (("topic", topic),)))


def subscribe(client, topic, *ids):
    for client_id in ids:
        client.call("subscribe_fanout", {"topic": topic, "client_id": client_id})


def fan_out_concurrently(gearmand, topic, count):
    """``count`` fanouts at once, so that both worker processes take some."""
    results, clients = [], [GearClient(gearmand) for _ in range(count)]
    threads = [threading.Thread(target=lambda c=c, i=i: results.append(c.call(
        "fanout", {"topic": topic, "payload": f"m{i}", "background": True})))
        for i, c in enumerate(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for client in clients:
        client.close()
    assert [r["copies"] for r in results] == [3] * count


def test_copies_add_up_over_worker_processes_and_survive_a_killed_worker(
        gearmand, start_pool, start_web, redis_url):
    pool = start_pool([gearmand], processes=2)
    web = start_web([gearmand])
    topic = unique_topic()
    client = GearClient(gearmand)
    subscribe(client, topic, "a", "b", "c")
    # Subscribed, nothing fanned out yet (a scrape may show a sample up to 1 s old).
    wait_for(lambda: copies(web.metrics(), topic) == 0, message="the topic listed")

    # Both worker processes make copies, so the counter is their sum:
    # fanouts at once, 7 at a time, until the ledger shows both took some
    # (gearmand hands a job to whichever asks first; on a loaded machine one
    # process took all of the first 7 once).
    ledger = redis.Redis.from_url(redis_url)

    def sources(expected):
        published = [r for r in rows_from_entries(entries(ledger, Keys(),
                                                          Config().ledger_shards))
                     if r["event"] == "published"]
        return {r["source"] for r in published} if len(published) == expected else None
    fanouts = 0
    for _ in range(20):
        fan_out_concurrently(gearmand, topic, 7)
        fanouts += 7
        if len(wait_for(lambda n=fanouts: sources(n), message=f"{fanouts} fanouts in the "
                        "ledger")) == 2:
            break
    assert len(sources(fanouts)) == 2, "one worker process took every fanout"
    # Workers write their counts every 0.1 s: wait for them, then exact.
    metrics = wait_for(lambda: (m := web.metrics())[("gearhorn_all_fanouts_total", ())]
                       >= fanouts and m, message=f"{fanouts} fanouts counted")
    assert copies(metrics, topic) == 3 * fanouts
    assert metrics[("gearhorn_fanouts_total", (("topic", topic),))] == fanouts
    assert metrics[("gearhorn_subscribers", (("topic", topic),))] == 3
    assert metrics[("gearhorn_fanout_latency_seconds_count", ())] == fanouts
    assert metrics[("gearhorn_all_copies_total", ())] == 3 * fanouts

    victim = next(w for w in pool.live().values() if "pid" in w)
    os.kill(int(victim["pid"]), signal.SIGKILL)
    wait_for(lambda: victim["pid"] not in {w.get("pid") for w in pool.live().values()}
             and len(pool.live()) == 2, timeout=60, message="the pool to replace the worker")
    assert copies(web.metrics(), topic) == 3 * fanouts

    fan_out_concurrently(gearmand, topic, 7)
    wait_for(lambda: web.metrics()[("gearhorn_all_fanouts_total", ())] >= fanouts + 7,
             message=f"{fanouts + 7} fanouts counted")
    assert copies(web.metrics(), topic) == 3 * (fanouts + 7)
    client.close()


@pytest.mark.cluster_too
def test_metrics_cover_queues_processes_connections_and_delays(
        gearmand, start_pool, start_bridge, start_web, stomp_clients):
    start_pool([gearmand], processes=1)
    bridge = start_bridge([gearmand])
    # The session's gearmand holds the queues earlier tests left: label
    # them all, so this test's 3 jobs are not cut by the top 100.
    web = start_web([gearmand], env={"GEARHORN_METRICS_TOP": "100000"})
    topic, queue = unique_topic(), unique_topic("q")
    client = GearClient(gearmand)
    subscribe(client, topic, "x")
    client.call("fanout", {"topic": topic, "payload": "later", "delay": 600})
    for i in range(3):
        client.submit(queue, f"job{i}".encode(), background=True)
    stomp_clients(bridge.port)
    stomp_clients(bridge.port)

    def seen():
        m = web.metrics()
        return m if m[("gearhorn_stomp_connections", ())] == 2 else None
    metrics = wait_for(seen, timeout=30, message="the bridge to report 2 connections")
    assert metrics[("gearhorn_queue_depth", (("queue", queue),))] == 3
    assert metrics[("gearhorn_delayed_messages", ())] == 1
    assert metrics[("gearhorn_workers", ())] == 1
    assert metrics[("gearhorn_bridges", ())] == 1
    assert metrics[("gearhorn_redis_up", ())] == 1
    assert metrics[("gearhorn_gearmand_up", (("server", gearmand.address),))] == 1
    client.close()


def test_labels_are_bounded_by_metrics_top(gearmand, start_pool, start_web):
    start_pool([gearmand], processes=1)
    web = start_web([gearmand], env={"GEARHORN_METRICS_TOP": "3"})
    client = GearClient(gearmand)
    topics = [unique_topic() for _ in range(5)]
    for n, topic in enumerate(topics):
        subscribe(client, topic, "only")
        for i in range(n + 1):
            client.call("fanout", {"topic": topic, "payload": f"{i}", "background": True})
    metrics = wait_for(lambda: (m := web.metrics())[("gearhorn_all_fanouts_total", ())] >= 15
                       and m, message="15 fanouts counted")
    labelled = {dict(labels)["topic"] for name, labels in metrics
                if name == "gearhorn_copies_total" and labels}
    assert labelled == set(topics[2:])  # the three with the most copies
    assert metrics[("gearhorn_all_copies_total", ())] == 15
    client.close()


@pytest.fixture
def own_servers(tmp_path):
    """A Redis and a gearmand of this test's own, to stop and start again."""
    require_binary("gearmand", "gearman-job-server")
    redis_server = servers.start_redis(servers.free_port(), str(tmp_path / "redis"))
    gearmand = servers.start_gearmand(servers.free_port(), str(tmp_path / "gearmand"))
    yield redis_server, gearmand
    gearmand.stop()
    redis_server.stop()


def test_readiness_follows_redis_and_gearmand(own_servers, start_web, tmp_path):
    redis_server, gearmand = own_servers
    url = redis_server.details["url"]
    web = start_web([gearmand], redis=url)
    assert web.json("/healthz")[0] == 200
    status, body = web.json("/readyz")
    assert (status, body["reasons"]) == (503, ["no live worker"])
    pool = PoolProcess([gearmand], url, processes=1, log_dir=str(tmp_path)).wait_ready()
    try:
        wait_for(lambda: web.json("/readyz")[0] == 200, message="ready")

        redis_port = redis_server.port
        redis_server.stop()
        status, body = wait_for(lambda: (r := web.json("/readyz"))[0] == 503 and r,
                                message="not ready without Redis")
        assert body["ready"] is False and "redis unreachable" in body["reasons"][0]
        assert web.json("/healthz")[0] == 200  # alive all the same
        redis_server = servers.start_redis(redis_port, str(tmp_path / "redis"))
        wait_for(lambda: web.json("/readyz")[0] == 200, timeout=60, message="ready again")

        gearmand_port = gearmand.port
        gearmand.stop()
        status, body = wait_for(lambda: (r := web.json("/readyz"))[0] == 503 and r,
                                message="not ready without gearmand")
        assert body["reasons"] == [f"gearmand 127.0.0.1:{gearmand_port} unreachable: "
                                   + body["reasons"][0].split("unreachable: ", 1)[1]]
        gearmand = servers.start_gearmand(gearmand_port, str(tmp_path / "gearmand"))
        wait_for(lambda: web.json("/readyz")[0] == 200, timeout=60, message="ready again")
    finally:
        pool.stop()
        redis_server.stop()
        gearmand.stop()


def test_bad_requests_get_clear_errors(gearmand, start_web):
    web = start_web([gearmand])
    assert web.json("/nowhere")[0] == 404
    status, body = web.json("/api/dlq?queue=has%20space")
    assert status == 400 and "invalid queue name" in body["error"]
    status, body = web.json("/api/presence?topic=has%20space")
    assert status == 400 and "invalid topic" in body["error"]
    assert web.json("/api/presence?topic=nobody")[1]["subscribers"] == 0
    status, body = web.json("/api/dlq/purge", body=b"{not json",
                            headers={"X-Requested-With": "gearhorn"})
    assert status == 400 and "not JSON" in body["error"]
    status, body = web.json("/api/dlq/requeue", body={"queue": "q", "count": -1},
                            headers={"X-Requested-With": "gearhorn"})
    assert status == 400 and "count" in body["error"]
    status, body = web.json("/api/dlq/purge", body={"queue": "q"})
    assert status == 403 and "X-Requested-With" in body["error"]
    assert json.loads(web.request("/healthz")[2])["status"] == "alive"


def test_dead_letters_without_gearmand_are_a_clear_503(start_web):
    class Gone:
        address = f"127.0.0.1:{servers.free_port()}"
    web = start_web([Gone()])
    status, body = web.json("/api/dlq?queue=jobs")
    assert status == 503 and "Connection refused" in body["error"]
