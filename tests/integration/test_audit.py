"""The live delivery audit (``gearhorn audit``) on real servers: a minute of
clean traffic has no finding, a planted loss is found once (naming the
message and the subscriber) within the deadline plus the lag, also across a
kill -9 and restart of the audit; counting first (the default, no Spark),
and as a Spark Structured Streaming job on a standalone cluster
(``--master``)."""

import contextlib
import glob
import json
import os
import threading
import time

import pyarrow.parquet as pq
import pytest
import redis

from gearhorn import gearman
from gearhorn.store.keys import Keys

from .helpers import ChildProcess, GearClient, nothing_held, unique_topic, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

DEADLINE, LATENESS, INTERVAL = 5, 2, 1
# A finding is due DEADLINE + LATENESS after its copy was enqueued, plus the
# audit's lag (an export round, a micro-batch; seconds on a loaded machine).
FOUND_WITHIN = 120


class AuditFolder:
    """What an audit running in ``process`` wrote to ``folder``."""

    def __init__(self, folder, process):
        self.folder, self.process = folder, process

    def state(self):
        try:
            with open(os.path.join(self.folder, "state.json")) as fp:
                return json.load(fp)
        except (OSError, ValueError):
            return {}

    def wait_judging(self, timeout=240):
        """Until it has judged a micro-batch whose clock is after now."""
        since = time.time_ns() // 1_000_000

        def judging():
            assert self.process.poll() is None, self.log()
            return self.state().get("clock_ms", 0) > since
        wait_for(judging, timeout, interval=0.2, message="the audit judging")

    def clock_past(self, ts_ms, timeout=FOUND_WITHIN):
        wait_for(lambda: self.state().get("clock_ms", 0) > ts_ms, timeout, interval=0.2,
                 message="the audit's clock")

    def findings(self):
        """Both audits': Spark's Parquet files and the count-first one's JSON Lines."""
        rows = []
        for path in sorted(glob.glob(os.path.join(self.folder, "findings", "*.parquet"))):
            rows += pq.read_table(path).to_pylist()
        for path in sorted(glob.glob(os.path.join(self.folder, "findings", "*.jsonl"))):
            with open(path, encoding="utf-8") as fp:
                rows += [json.loads(line) for line in fp]
        return rows


class AuditProcess(ChildProcess, AuditFolder):
    """``gearhorn audit`` as a real child process."""

    name = "audit"

    def __init__(self, redis_url, folder, log_dir, master=None, env=None):
        argv = ["audit", "--dir", folder, "--redis-url", redis_url, "--deadline", str(DEADLINE),
                "--lateness", str(LATENESS), "--interval", str(INTERVAL)]
        ChildProcess.__init__(self, argv + (["--master", master] if master else []),
                              os.path.join(log_dir, "audit.log"), env=env)
        AuditFolder.__init__(self, folder, self.process)


class Consumer:
    """A plain Gearman worker of some queues, answering every job it takes."""

    def __init__(self, gearmand, queues):
        self.gearmand, self.queues, self.taken = gearmand, queues, 0
        self.stopping = threading.Event()
        self.thread = None

    def start(self):
        self.stopping.clear()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        return self

    def _run(self):
        worker = gearman.WorkerConnection(self.gearmand.host, self.gearmand.port, self.queues,
                                          client_id="audit-test-consumer")
        worker.open()
        try:
            while not self.stopping.is_set():
                jobs = worker.grab(20)
                for job in jobs:
                    worker.complete(job.handle)
                self.taken += len(jobs)
                if not jobs:
                    time.sleep(0.02)
        except gearman.GearmanError:
            return  # its gearmand went away: the test is over
        finally:
            worker.close()

    def stop(self):
        self.stopping.set()
        self.thread.join(30)


class Traffic:
    """Fanouts to ``topic`` from a thread, about 20 a second, until stopped;
    :meth:`pause` holds them (``with traffic.paused():``)."""

    def __init__(self, gearmand, topic):
        self.client = GearClient(gearmand)
        self.topic, self.sent = topic, 0
        self.stopping, self.running = threading.Event(), threading.Event()
        self.idle = threading.Event()
        self.running.set()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stopping.wait(0.05):
            if not self.running.is_set():
                self.idle.set()
                self.running.wait(1.0)
                continue
            self.idle.clear()
            self.client.call("fanout", {"topic": self.topic, "payload": f"m{self.sent}",
                                        "background": True})
            self.sent += 1

    @contextlib.contextmanager
    def paused(self):
        self.running.clear()
        self.idle.wait(60)
        try:
            yield
        finally:
            self.running.set()

    def stop(self):
        self.stopping.set()
        self.thread.join(60)
        self.client.close()


@pytest.fixture
def traffic_to():
    """Traffic threads, stopped after the test whatever happened."""
    started = []

    def start(gearmand, topic):
        started.append(Traffic(gearmand, topic))
        return started[-1]
    yield start
    for traffic in started:
        traffic.stop()


def plant_loss(gearmand, redis_url, gear, consumer, traffic, topic, queue):
    """A copy of ``queue`` taken by a worker that never answers, while its
    real consumer goes on with the copies after it: (message id, the
    connection that holds it; closing it would give the copy back)."""
    with traffic.paused():
        # Every copy made so far answered: the next one is the only one.
        wait_for(nothing_held(redis_url, queue), timeout=60, message="every copy answered")
        consumer.stop()
        rogue = gearman.WorkerConnection(gearmand.host, gearmand.port, [queue],
                                          client_id="rogue")
        rogue.open()
        message_id = gear.call("fanout", {"topic": topic, "payload": "victim",
                                          "background": True})["message_id"]
        taken = []
        wait_for(lambda: taken.extend(rogue.grab(1)) or taken, timeout=30,
                 message="the victim")
        assert taken[0].unique.startswith(message_id)
        consumer.start()
    return message_id, rogue


def losses(audit):
    return sorted((f["kind"], f["message_id"], f["subscriber"]) for f in audit.findings())


def test_clean_traffic_has_no_finding_and_a_planted_loss_is_found_once_across_a_restart(
        gearmand, redis_url, start_pool, start_bridge, stomp_clients, tmp_path, traffic_to):
    start_pool([gearmand])
    bridge = start_bridge([gearmand])
    audit = AuditProcess(redis_url, str(tmp_path / "audit"), str(tmp_path))
    topic = unique_topic("audit")
    gear = GearClient(gearmand)
    for client_id in ("a", "b", "away"):
        gear.call("subscribe_fanout", {"topic": topic, "client_id": client_id})
    # Kept to its three newest copies, and taken slowly: most are dropped by
    # policy, which is not a loss.
    gear.call("subscribe_fanout", {"topic": topic, "client_id": "bounded", "max_length": 3})
    stomp = stomp_clients(bridge.port, **{"client-id": "audit-durable"})
    stomp.subscribe(f"/topic/{topic}", "d", ack="client-individual", durable="true")
    stomp_acks = threading.Thread(target=ack_all, args=(stomp,), daemon=True)
    stomp_acks.start()
    consumer = Consumer(gearmand, [f"{topic}_a", f"{topic}_b"]).start()
    slow = SlowConsumer(gearmand, f"{topic}_bounded").start()
    audit.wait_judging()

    traffic = traffic_to(gearmand, topic)
    minute_ends = time.time_ns() // 1_000_000 + 60_000
    audit.clock_past(minute_ends + (DEADLINE + LATENESS) * 1000, timeout=240)
    assert audit.findings() == [], audit.log()
    state = audit.state()
    assert state["settled"] > 1000 and state["away"] > 0  # "away" took nothing: not counted
    verdict = json.loads(redis.Redis.from_url(redis_url).get(Keys().audit))
    assert verdict["line"].startswith("audit: nothing lost"), verdict
    assert "audit: nothing lost" in audit.log(full=True)
    assert policy_drops(redis_url, f"{topic}_bounded") > 0  # and none of them a finding

    first, rogue = plant_loss(gearmand, redis_url, gear, consumer, traffic, topic,
                              f"{topic}_a")
    wait_for(lambda: audit.findings(), timeout=FOUND_WITHIN, message="the planted loss found")
    assert losses(audit) == [("never_delivered", first, f"{topic}_a")]
    assert f"never_delivered: message {first} for {topic}_a" in audit.log(full=True)

    # Killed mid-run and started again: a loss planted while it was down is
    # found, and none is found twice.
    audit.process.kill()
    audit.process.wait()
    second, rogue2 = plant_loss(gearmand, redis_url, gear, consumer, traffic, topic,
                                f"{topic}_b")
    audit = AuditProcess(redis_url, audit.folder, str(tmp_path))
    wait_for(lambda: len(audit.findings()) == 2, timeout=FOUND_WITHIN + 120,
             message="the loss planted while the audit was down")
    audit.clock_past(time.time_ns() // 1_000_000 + 2 * DEADLINE * 1000)
    assert losses(audit) == sorted([("never_delivered", first, f"{topic}_a"),
                                    ("never_delivered", second, f"{topic}_b")])
    verdict = json.loads(redis.Redis.from_url(redis_url).get(Keys().audit))
    assert verdict["totals"]["never_delivered"] == 2 and verdict["line"].startswith(
        "audit: FINDINGS")
    for held in (rogue, rogue2):
        held.close()
    consumer.stop()
    slow.stop()
    audit.stop()
    gear.close()


def policy_drops(redis_url, subscriber):
    from gearhorn.config import Config
    from gearhorn.store import redisconn
    from gearhorn.store.ledgerentries import rows_from_entries
    from gearhorn.store.ledgerexport import entries

    rows = rows_from_entries(entries(redisconn.connect(redis_url), Keys(),
                                     Config().ledger_shards))
    return sum(1 for row in rows if row["event"] == "dropped" and row["subscriber"] == subscriber)


def ack_all(stomp):
    seen = 0
    while stomp.conn.is_connected():
        messages = list(stomp.listener.messages)
        for frame in messages[seen:]:
            stomp.conn.ack(frame.headers["ack"])
        seen = len(messages)
        time.sleep(0.05)


class SlowConsumer(Consumer):
    """Takes a copy every half second."""

    def _run(self):
        worker = gearman.WorkerConnection(self.gearmand.host, self.gearmand.port, self.queues,
                                          client_id="audit-test-slow")
        worker.open()
        try:
            while not self.stopping.wait(0.5):
                for job in worker.grab(1):
                    worker.complete(job.handle)
                    self.taken += 1
        finally:
            worker.close()




def test_the_audit_runs_on_a_spark_standalone_cluster(gearmand, redis_url, start_pool,
                                                      tmp_path, spark_cluster, traffic_to):
    start_pool([gearmand])
    topic = unique_topic("auditc")
    gear = GearClient(gearmand)
    gear.call("subscribe_fanout", {"topic": topic, "client_id": "a"})
    consumer = Consumer(gearmand, [f"{topic}_a"]).start()
    spark_cluster.wait_ready()
    audit = AuditProcess(redis_url, str(tmp_path / "audit"), str(tmp_path),
                         master=spark_cluster.url, env={"SPARK_LOCAL_IP": "127.0.0.1"})
    audit.wait_judging()
    traffic = traffic_to(gearmand, topic)
    lost, rogue = plant_loss(gearmand, redis_url, gear, consumer, traffic, topic,
                             f"{topic}_a")
    wait_for(lambda: audit.findings(), timeout=FOUND_WITHIN, message="the planted loss found")
    assert losses(audit) == [("never_delivered", lost, f"{topic}_a")]
    assert [app["name"] for app in spark_cluster.state()["activeapps"]] == ["gearhorn-audit"]
    rogue.close()
    consumer.stop()
    audit.stop()
    gear.close()


def test_up_runs_the_audit_by_default_and_its_findings_reach_metrics_and_terminal(
        ups, tmp_path, traffic_to):
    """``gearhorn up``, as a newcomer runs it: the banner says the audit is
    live, and a planted loss is on up's terminal and at /metrics."""
    import urllib.request

    from gearhorn.supervision import servers

    web_port = servers.free_port()
    up = ups(tmp_path, env={
        "GEARHORN_WEB_PORT": str(web_port), "GEARHORN_AUDIT_DEADLINE": str(DEADLINE),
        "GEARHORN_AUDIT_LATENESS": str(LATENESS), "GEARHORN_AUDIT_INTERVAL": str(INTERVAL)})
    assert "audit     live: a copy not delivered within 5 s" in up.text()
    audit = AuditFolder(os.path.join(up.store, "audit"), up.process)  # the one up started
    audit.wait_judging()
    topic = unique_topic("auditup")
    gear = GearClient(up.gearmand)
    gear.call("subscribe_fanout", {"topic": topic, "client_id": "a"})
    consumer = Consumer(up.gearmand, [f"{topic}_a"]).start()
    traffic = traffic_to(up.gearmand, topic)
    lost, rogue = plant_loss(up.gearmand, up.redis_url, gear, consumer, traffic, topic,
                             f"{topic}_a")
    wait_for(lambda: f"never_delivered: message {lost} for {topic}_a" in up.text(),
             timeout=FOUND_WITHIN, message="the finding on up's terminal")

    def metric():
        with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/metrics", timeout=10) as r:
            text = r.read().decode()
        return f'gearhorn_audit_copies_lost_total{{topic="{topic}"}} 1.0' in text
    wait_for(metric, timeout=30, message="the finding at /metrics")
    rogue.close()
    consumer.stop()
    gear.close()
