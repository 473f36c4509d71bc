"""Real traffic -> ledger -> export -> `gearhorn report` on a real Spark
standalone cluster: everything reconciles but a planted loss, which is found."""

import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import redis

from gearhorn import gearman
from gearhorn.store import redisconn
from gearhorn.store.keys import Keys

from .helpers import GearClient, drain_jobs, queue_depth, unique_topic, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def gearhorn(*args, timeout=240, env=None):
    out = subprocess.run([sys.executable, "-m", "gearhorn", *args], capture_output=True,
                         timeout=timeout, env=None if env is None else {**os.environ, **env})
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    return out.stdout.decode()


def acked_events(redis_url):
    from gearhorn.config import Config
    from gearhorn.store.ledgerentries import rows_from_entries
    from gearhorn.store.ledgerexport import entries

    rows = rows_from_entries(entries(redisconn.connect(redis_url), Keys(),
                                     Config().ledger_shards))
    return sum(1 for row in rows if row["event"] == "acked")


def reconciliation(out_dir):
    table = pq.read_table(f"{out_dir}/tables/reconciliation").to_pylist()
    return sorted((row["kind"], row["subscriber"]) for row in table)




def test_traffic_reconciles_and_a_planted_loss_is_found(gearmand, redis_url, start_pool,
                                                        start_bridge, stomp_clients, tmp_path,
                                                        spark_cluster):
    """Two exports (the second adds only new events), then one report on a
    Spark standalone cluster started meanwhile. Spark's local mode runs the
    same job in tests/unit/test_pipeline.py. The losses are planted in
    gearmand's queue, so the copies are there (copies = gearmand); held
    copies reconcile clean across a crash in tests/integration/test_held_copies.py."""
    start_pool([gearmand], env={"GEARHORN_COPIES": "gearmand"})
    bridge = start_bridge([gearmand])
    topic = unique_topic()
    durable = stomp_clients(bridge.port, **{"client-id": "ledger-test"})
    durable.subscribe(f"/topic/{topic}", "d", durable="true")
    plain = stomp_clients(bridge.port)
    # A queue of its own (a limit asks for one): its deliveries and acks are
    # ledger rows (a real-time reader's runs of offsets: test_realtime_default.py).
    plain.subscribe(f"/topic/{topic}", "p", **{"x-max-length": "10000"})
    gear = GearClient(gearmand)
    gear.call("subscribe_fanout", {"topic": topic, "client_id": "gearmanonly"})

    producer = stomp_clients(bridge.port)
    for i in range(50):
        producer.conn.send(destination=f"/topic/{topic}", body=f"s{i}".encode())
    producer.send(f"/topic/{topic}", b"s50")
    for i in range(20):
        gear.call("fanout", {"topic": topic, "payload": f"g{i}", "background": True})
    for sub in (durable, plain):
        assert len(sub.messages(71)) == 71
    wait_for(lambda: acked_events(redis_url) == 142, message="acks in the ledger")

    ledger, report = tmp_path / "ledger", tmp_path / "report"
    assert "rows" in gearhorn("ledger", "export", "--out", str(ledger),
                              "--redis-url", redis_url, "--gearman", gearmand.address)

    # Plant a loss: the durable subscriber is away, its queue is dropped.
    durable.close()
    wait_for(lambda: not [f for f in gearman.status(gearmand.host, gearmand.port)
                          if f.name.startswith(f"{topic}_d-") and f.workers])
    for i in range(5):
        gear.call("fanout", {"topic": topic, "payload": f"lost{i}", "background": True})
    assert len(plain.messages(76)) == 76
    (queue,) = [f.name for f in gearman.status(gearmand.host, gearmand.port)
                if f.name.startswith(f"{topic}_d-")]
    gearman.admin(gearmand.host, gearmand.port, f"drop function {queue}")
    wait_for(lambda: acked_events(redis_url) == 147, message="acks in the ledger")
    # And one on the Gearman subscriber, which records no delivery: a worker
    # that is not its consumer takes one of its 76 waiting copies.
    gearman_queue = f"{topic}_gearmanonly"
    assert queue_depth(gearmand, gearman_queue) == 76
    assert len(drain_jobs(gearmand, gearman_queue, limit=1)) == 1

    exported = gearhorn("ledger", "export", "--out", str(ledger), "--redis-url", redis_url,
                        "--gearman", gearmand.address)
    assert exported.startswith("exported ")
    spark_cluster.wait_ready()
    out = gearhorn("report", "--ledger", str(ledger), "--out", str(report),
                   "--master", spark_cluster.url,
                   env={"SPARK_LOCAL_IP": "127.0.0.1", "GEARHORN_REDIS_URL": redis_url})
    # Exactly the planted losses: every other copy of both exports reconciled,
    # the Gearman subscriber's against what gearmand still held.
    assert "reconciliation: 5 problems" in out
    assert "1 copies of 1 untracked Gearman subscribers unaccounted" in out
    assert reconciliation(report) == [("never_delivered", queue)] * 5
    html = (report / "report.html").read_text()
    assert "5 problems found" in html and gearman_queue in html
    untracked = pq.read_table(f"{report}/tables/untracked").to_pylist()
    assert untracked == [{"subscriber": gearman_queue, "enqueued": 76, "dropped": 0,
                          "queued": 75,
                          "unaccounted": 1}]
    # The verdict is left where gearhorn web's console shows it.
    verdict = json.loads(redis.Redis.from_url(redis_url).get(Keys().last_report))
    assert verdict["reconciliation"] == {"never_delivered": 5}
    assert verdict["unaccounted"] == {gearman_queue: 1}
    assert verdict["report"] == str(report / "report.html")
    # It ran on the cluster: the master lists it as a finished application.
    assert [app["name"] for app in spark_cluster.state()["completedapps"]] == [
        "gearhorn-report"]
    gear.close()


def test_report_without_input_is_a_clear_error(tmp_path):
    out = subprocess.run([sys.executable, "-m", "gearhorn", "report", "--ledger",
                          str(tmp_path / "none"), "--out", str(tmp_path / "r")],
                         capture_output=True, timeout=60)
    assert out.returncode == 1
    assert b"run `gearhorn ledger export" in out.stderr
    assert b"Traceback" not in out.stderr and b"Exception" not in out.stderr


def test_report_without_java_is_a_clear_error(tmp_path):
    (tmp_path / "l").mkdir()
    (tmp_path / "l" / "x.jsonl").write_text(json.dumps({"event": "acked", "ts": 1}) + "\n")
    env = {"PATH": "/nonexistent", "HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "gearhorn", "report", "--ledger",
                          str(tmp_path / "l"), "--out", str(tmp_path / "r")],
                         capture_output=True, timeout=60, env=env)
    assert out.returncode == 1
    assert b"Java is not installed" in out.stderr
