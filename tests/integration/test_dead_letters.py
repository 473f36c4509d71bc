"""Dead letters from the command line and the console's API, on a real bridge
and gearmand: listed without being consumed, requeued, purged; and who may
act on them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from gearhorn import gearman
from gearhorn.rules import auth
from gearhorn.rules.retention import TallyEntry
from gearhorn.store import redisconn
from gearhorn.store.keys import Keys

from .helpers import queue_depth, unique_topic, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture
def stack(gearmand, start_pool, start_bridge):
    pool = start_pool([gearmand], processes=1)
    bridge = start_bridge([gearmand])
    bridge.pool = pool  # for the logs of a failure
    return bridge


def stack_logs(stack):
    return f"{stack.pool.log()}\n-- the bridge's:\n{stack.log()}"


def dead_letter(consumer, sender, queue, body, deliveries=5):
    """``body`` sent to ``queue`` and NACKed until the bridge dead-letters it."""
    before = len(consumer.listener.messages)
    sender.send(f"/queue/{queue}", body, **{"x-trace": body.decode()})
    for n in range(1, deliveries + 1):
        message = consumer.messages(before + n)[-1]
        assert message.body == body
        consumer.conn.nack(message.headers["ack"])


def dlq(gearmand, redis_url, *args):
    out = subprocess.run([sys.executable, "-m", "gearhorn", "dlq", *args, "--redis-url",
                          redis_url, "--gearman", gearmand.address],
                         capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, GEARHORN_PERSISTENCE="none"))
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.cluster_too
def test_list_requeue_and_purge_from_the_command_line(gearmand, stack, stomp_clients,
                                                      redis_url, start_web):
    queue = unique_topic("q")
    consumer = stomp_clients(stack.port)
    consumer.subscribe(f"/queue/{queue}", "1", ack="client-individual")
    sender = stomp_clients(stack.port)
    dead_letter(consumer, sender, queue, b"first")
    dead_letter(consumer, sender, queue, b"second")
    wait_for(lambda: queue_depth(gearmand, f"{queue}.dlq") == 2, message="two dead letters")

    listed = json.loads(dlq(gearmand, redis_url, "list", queue, "--json"))
    assert listed["queued"] == 2
    assert [(d["preview"], d["reason"], d["deliveries"]) for d in listed["letters"]] == [
        ("first", "rejected with NACK", 5), ("second", "rejected with NACK", 5)]
    text = dlq(gearmand, redis_url, "list", queue)
    assert f"{queue}.dlq: 2 queued" in text and "rejected with NACK" in text
    assert queue_depth(gearmand, f"{queue}.dlq") == 2  # listing consumed nothing
    metrics = start_web([gearmand]).metrics()
    assert metrics[("gearhorn_dead_letters_total", (("queue", queue),))] == 2

    assert "1 dead letters moved back" in dlq(gearmand, redis_url, "requeue", queue,
                                              "--count", "1")
    again = consumer.messages(11)[-1]  # 5 + 5 deliveries, then the requeued one
    assert again.body == b"first" and again.headers["x-trace"] == "first"
    assert again.headers["delivery-count"] == "1"  # a fresh start
    assert not [h for h in again.headers if h.startswith("dlq-")]
    consumer.conn.ack(again.headers["ack"])
    assert [d["preview"] for d in json.loads(
        dlq(gearmand, redis_url, "list", queue, "--json"))["letters"]] == ["second"]

    assert "1 dead letters of" in dlq(gearmand, redis_url, "purge", queue)
    assert queue_depth(gearmand, f"{queue}.dlq") == 0
    assert json.loads(dlq(gearmand, redis_url, "list", queue, "--json")) == {
        "queue": queue, "queued": 0, "letters": []}
    wait_for(lambda: queue_depth(gearmand, queue) == 0, message="the requeued one done")


def test_copies_requeued_to_a_bounded_queue_are_tallied(gearmand, stack, stomp_clients,
                                                         redis_url):
    """The warden knows their age and size at its next round, as it knows a
    SEND's: a requeue is not an outside copy it can only guess the age of."""
    queue, body = unique_topic("qb"), b"bounded and dead"
    client = redisconn.connect(redis_url)
    consumer = stomp_clients(stack.port)
    consumer.subscribe(f"/queue/{queue}", "1", ack="client-individual",
                       **{"x-max-length": "100"})
    dead_letter(consumer, stomp_clients(stack.port), queue, body)
    wait_for(lambda: queue_depth(gearmand, f"{queue}.dlq") == 1, message="the dead letter")
    consumer.close()  # nobody takes the requeued copy: it stays tallied
    wait_for(lambda: not workers_of(gearmand, queue),
             message="the bridge no longer a worker of the queue")
    tally = Keys().tally(queue)
    before = client.lrange(tally, 0, -1)  # the SEND's entry, unless the warden forgot it
    requeued_at = time.time_ns() // 1_000_000
    assert "1 dead letters moved back" in dlq(gearmand, redis_url, "requeue", queue)
    # Held as every copy gearhorn queues (a crash of gearmand loses none),
    # handed to gearmand by a worker that takes it over.
    assert client.hlen(Keys().copies(queue)) == 1
    wait_for(lambda: queue_depth(gearmand, queue) == 1, message="the requeued copy")
    # Its entry; the SEND's own (and its NACKs' give-backs), older, are the
    # warden's to forget as consumed.
    # New entries, and made since the requeue: the bridge writes its entries
    # every 0.1 s, so on a loaded machine the last NACK's give-back, older,
    # may come after ``before`` was read (seen: two entries of one copy).
    after = client.lrange(tally, 0, -1)
    entries = [e for e in (TallyEntry.decode(raw) for raw in after if raw not in before)
               if e.at_ms >= requeued_at]
    assert [(e.count, e.size) for e in entries] == [(1, len(body))], (
        f"tally before the requeue {before}, after {after}, sums "
        f"{client.hgetall(Keys().tally_sum(queue))}; records {client.hgetall(Keys().copies(queue))}"
        f"; pool's log:\n{stack_logs(stack)}")
    assert not workers_of(gearmand, queue)  # nobody took and gave it back meanwhile


def workers_of(gearmand, queue):
    return sum(f.workers for f in gearman.status(gearmand.host, gearmand.port)
               if f.name == queue)


@pytest.fixture
def credentials(tmp_path):
    path = tmp_path / "users.ini"
    path.write_text(f"""
[user boss]
passcode = {auth.hash_passcode("boss-pass", iterations=1000)}
read = *
write = *
admin = true

[user viewer]
passcode = {auth.hash_passcode("viewer-pass", iterations=1000)}
read = /topic/*
""")
    return str(path)


ACT = {"X-Requested-With": "gearhorn"}


def test_anyone_logged_in_may_look_and_only_admins_may_act(gearmand, stack, stomp_clients,
                                                           start_web, credentials):
    queue = unique_topic("q")
    consumer = stomp_clients(stack.port)
    consumer.subscribe(f"/queue/{queue}", "1", ack="client-individual")
    dead_letter(consumer, stomp_clients(stack.port), queue, b"bad")
    wait_for(lambda: queue_depth(gearmand, f"{queue}.dlq") == 1, message="the dead letter")
    web = start_web([gearmand], env={"GEARHORN_STOMP_CREDENTIALS_FILE": credentials})

    status, headers, _ = web.request("/")
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
    assert web.request("/api/overview", login=("viewer", "wrong"))[0] == 401
    assert web.request("/api/overview", login=("viewer", "viewer-pass"))[0] == 200
    assert web.request("/", login=("viewer", "viewer-pass"))[0] == 200
    # Metrics and health checks stay open (loopback; docs/security.rst).
    assert web.request("/metrics")[0] == 200 and web.request("/readyz")[0] == 200

    status, body = web.json("/api/dlq?queue=" + queue, login=("viewer", "viewer-pass"))
    assert status == 200 and body["queued"] == 1 and body["letters"][0]["preview"] == "bad"
    status, body = web.json("/api/dlq/purge", body={"queue": queue}, headers=ACT,
                            login=("viewer", "viewer-pass"))
    assert status == 403 and "may look but not act" in body["error"]
    status, body = web.json("/api/dlq/purge", body={"queue": queue},
                            login=("boss", "boss-pass"))
    assert status == 403  # without the header a cross-site form cannot add
    assert queue_depth(gearmand, f"{queue}.dlq") == 1
    assert web.json("/api/whoami", login=("boss", "boss-pass"))[1] == {"name": "boss",
                                                                        "admin": True}
    status, body = web.json("/api/dlq/requeue", body={"queue": queue}, headers=ACT,
                            login=("boss", "boss-pass"))
    assert (status, body["moved"]) == (200, 1)
    assert consumer.messages(6)[-1].body == b"bad"


def test_anonymous_looks_only_when_the_credentials_file_allows(gearmand, start_web, tmp_path,
                                                               credentials):
    with open(credentials, "a") as fp:
        fp.write("\n[anonymous]\nread = /topic/public.*\n")
    web = start_web([gearmand], env={"GEARHORN_STOMP_CREDENTIALS_FILE": credentials})
    assert web.json("/api/whoami") == (200, {"name": "anonymous", "admin": False})
    status, body = web.json("/api/dlq/purge", body={"queue": "q"}, headers=ACT)
    assert status == 403
