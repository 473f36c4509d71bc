"""Priorities, delayed delivery, dead letters, request/reply and headers, on
real gearmand, Redis, the worker pool and the bridge, with stomp.py and the
``gearman`` command-line tool."""

import json
import subprocess
import time
import types

import pytest

from gearhorn import gearman
from gearhorn.client import JobFailed, Producer
from gearhorn.store import redisconn
from gearhorn.store.keys import Keys
from gearhorn.supervision import servers

from .helpers import gearman_cli, queue_depth, unique_topic, wait_for
from .stomp_helpers import error_detail

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def stack(gearmand, start_pool, start_bridge):
    start_pool([gearmand])
    return start_bridge([gearmand])


def fanout(server, **job):
    out = gearman_cli(server, "-f", "fanout", json.dumps(job))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def subscribe(server, topic, client_id):
    assert gearman_cli(server, "-f", "subscribe_fanout",
                       json.dumps({"topic": topic, "client_id": client_id})).returncode == 0


def work(server, function, count, timeout=20.0):
    """``gearman -w`` taking ``count`` jobs; it prints their payloads back to back,
    so the tests send payloads that end with a newline."""
    return gearman_cli(server, "-w", "-c", str(count), "-f", function,
                       timeout=timeout).stdout.decode().splitlines()


def functions(server):
    """Gearman functions with a worker, by name."""
    return {f.name: f for f in gearman.status(server.host, server.port) if f.workers}


# -- priority ---------------------------------------------------------------------


@pytest.mark.cluster_too
def test_a_backlog_is_consumed_high_before_normal_before_low(gearmand, stack, stomp_clients,
                                                             gearman_cli_tool):
    topic = unique_topic()
    subscribe(gearmand, topic, "cli")
    for priority in ("low", "normal", "high", "low", "high"):
        fanout(gearmand, topic=topic, payload=priority + "\n", priority=priority,
               background=True)
    assert work(gearmand, f"{topic}_cli", 5) == ["high", "high", "normal", "low", "low"]

    # STOMP: the JMS priority header, a prefetch of one and client acks.
    queue = unique_topic("q")
    producer = stomp_clients(stack.port)
    for jms in ("0", "4", "9", "2", "7"):
        producer.send(f"/queue/{queue}", jms.encode(), priority=jms)
    consumer = stomp_clients(stack.port)
    consumer.subscribe(f"/queue/{queue}", "1", ack="client-individual", prefetch="1")
    got = []
    for n in range(1, 6):
        message = consumer.messages(n)[-1]
        got.append(message.body.decode())
        consumer.conn.ack(message.headers["ack"])
    assert got[:2] == ["9", "7"] and got[2] == "4" and sorted(got[3:]) == ["0", "2"]


# -- delayed delivery ---------------------------------------------------------------


@pytest.mark.cluster_too
def test_a_delayed_stomp_message_is_invisible_until_due_then_on_time(stack, stomp_clients):
    topic, queue = unique_topic(), unique_topic("q")
    sub = stomp_clients(stack.port)
    sub.subscribe(f"/topic/{topic}", "t")
    sub.subscribe(f"/queue/{queue}", "q")
    producer = stomp_clients(stack.port)
    sent = time.time()
    producer.send(f"/topic/{topic}", b"rabbit", **{"x-delay": "1500"})
    producer.send(f"/queue/{queue}", b"activemq", AMQ_SCHEDULED_DELAY="1500")
    producer.send(f"/topic/{topic}", b"now")
    assert sub.messages(1)[0].body == b"now"
    arrivals = {}

    def arrived():
        for message in sub.listener.messages:
            arrivals.setdefault(message.body, time.time())
        return len(arrivals) == 3

    sub.wait(arrived, message="both delayed messages")
    for body in (b"rabbit", b"activemq"):
        lateness = arrivals[body] - (sent + 1.5)
        # Never early; how late on an idle machine is bench/delayed.py's to say
        # (a loaded 2-core box may add seconds): here, only that it came.
        assert 0 <= lateness < 10, f"{body!r} arrived {lateness:+.3f}s after its time"


def test_a_delayed_fanout_reaches_a_sleeping_gearman_worker_on_time(gearmand, stack,
                                                                     gearman_cli_tool):
    # gearmand's own epoch jobs never wake a sleeping `gearman -w`
    # (docs/delivery.rst, "Delayed delivery").
    topic = unique_topic()
    subscribe(gearmand, topic, "cli")
    worker = subprocess.Popen(["gearman", "-h", gearmand.host, "-p", str(gearmand.port), "-w",
                               "-c", "1", "-f", f"{topic}_cli"], stdout=subprocess.PIPE)
    try:
        due = time.time() + 1.5
        result = fanout(gearmand, topic=topic, payload="later", deliver_at=due)
        assert result["scheduled"] is True and result["copies"] == 0
        assert queue_depth(gearmand, f"{topic}_cli") == 0
        assert worker.communicate(timeout=20)[0] == b"later"
        assert 0 <= time.time() - due < 10  # never early; bench/delayed.py measures lateness
    finally:
        worker.kill()
        worker.wait()


@pytest.mark.cluster_too
def test_sleeping_workers_are_woken_for_a_message_due_before_their_next_look(
        gearmand, start_pool, gearman_cli_tool):
    # The workers look for due messages once an hour here: only the
    # scheduler's announcement on the matchmaking channel (a PUBLISH from
    # its Lua script, on a cluster too) can get this message out on time.
    start_pool([gearmand], env={"GEARHORN_DELAY_POLL_INTERVAL": "3600",
                                "GEARHORN_DELAY_SHARD_SECONDS": "7200"})
    topic = unique_topic()
    subscribe(gearmand, topic, "cli")
    now = time.time()
    for payload, due in (("later", now + 6), ("sooner", now + 3)):  # a sleep, then woken
        result = fanout(gearmand, topic=topic, payload=f"{payload}\n", deliver_at=due)
        assert result["scheduled"] is True
    assert work(gearmand, f"{topic}_cli", 1) == ["sooner"]
    assert 0 <= time.time() - (now + 3) < 10  # never early; and not an hour late
    assert work(gearmand, f"{topic}_cli", 1) == ["later"]
    assert 0 <= time.time() - (now + 6) < 10


def test_workers_restarted_with_narrower_shards_still_send_delayed_messages(
        gearmand, start_pool, gearman_cli_tool):
    # The first pool's shard width stays the store's (docs/operations.rst,
    # "Delayed delivery"): with each process's own, the lane's cursor of
    # 10 s shards left every message of 2.5 s shards unseen for decades.
    # (One lane: both messages behind the same cursor.)
    first = start_pool([gearmand], env={"GEARHORN_DELAY_LANES": "1"})
    topic = unique_topic()
    subscribe(gearmand, topic, "cli")
    fanout(gearmand, topic=topic, payload="first\n", deliver_at=time.time() + 1)
    assert work(gearmand, f"{topic}_cli", 1) == ["first"]  # the cursors exist now
    first.stop()
    start_pool([gearmand], env={"GEARHORN_DELAY_LANES": "1",
                                "GEARHORN_DELAY_SHARD_SECONDS": "2.5"})
    due = time.time() + 1
    assert fanout(gearmand, topic=topic, payload="second\n", deliver_at=due)["scheduled"]
    assert work(gearmand, f"{topic}_cli", 1) == ["second"]
    assert 0 <= time.time() - due < 10


def test_a_delayed_message_survives_a_gearmand_restart_with_its_sqlite_queue(
        redis_url, start_pool, tmp_path, gearman_cli_tool):
    data_dir = str(tmp_path / "gearmand")
    gearmand = servers.start_gearmand(data_dir=data_dir, queue="sqlite")
    try:
        start_pool([gearmand], processes=1)
        topic = unique_topic()
        subscribe(gearmand, topic, "cli")
        due = time.time() + 2.5
        fanout(gearmand, topic=topic, payload="kept\n", deliver_at=due, background=True)
        fanout(gearmand, topic=topic, payload="queued\n", background=True)
        gearmand.stop()
        gearmand = servers.start_gearmand(port=gearmand.port, data_dir=data_dir,
                                          queue="sqlite")
        # The copy queued before the restart came back from sqlite; the delayed
        # one was in Redis and arrives after its time.
        assert work(gearmand, f"{topic}_cli", 1) == ["queued"]
        assert work(gearmand, f"{topic}_cli", 1) == ["kept"]
        assert time.time() >= due
    finally:
        gearmand.stop()


# -- retries and dead letters --------------------------------------------------------


def test_nacked_max_deliveries_times_a_message_goes_to_the_dead_letter_queue(
        gearmand, stack, stomp_clients):
    queue = unique_topic("q")
    consumer = stomp_clients(stack.port)
    consumer.subscribe(f"/queue/{queue}", "1", ack="client-individual")
    stomp_clients(stack.port).send(f"/queue/{queue}", b"poison", **{"x-trace": "t1"})
    for n in range(1, 6):
        message = consumer.messages(n)[-1]
        assert message.body == b"poison" and message.headers["delivery-count"] == str(n)
        assert message.headers["redelivered"] == ("true" if n > 1 else "false")
        consumer.conn.nack(message.headers["ack"])
    dead = stomp_clients(stack.port)
    dead.subscribe(f"/queue/{queue}.dlq", "dlq", ack="client-individual")
    (letter,) = dead.messages(1)
    assert letter.body == b"poison"
    assert letter.headers["dlq-reason"] == "rejected with NACK"
    assert letter.headers["dlq-delivery-count"] == "5"
    assert letter.headers["dlq-original-destination"] == f"/queue/{queue}"
    assert letter.headers["x-trace"] == "t1"
    dead.conn.ack(letter.headers["ack"])
    wait_for(lambda: queue_depth(gearmand, queue) == 0, message="the original to be done")
    assert len(consumer.listener.messages) == 5  # and it stopped being redelivered


def test_ack_timeouts_count_towards_dead_lettering(stack, stomp_clients, gearmand):
    queue = unique_topic("q")
    slow = stomp_clients(stack.port)
    slow.subscribe(f"/queue/{queue}", "1", ack="client", **{"ack-timeout": "0.2"})
    stomp_clients(stack.port).send(f"/queue/{queue}", b"slow")
    slow.messages(5)
    wait_for(lambda: queue_depth(gearmand, f"{queue}.dlq") == 1, message="the dead letter")
    dead = stomp_clients(stack.port)
    dead.subscribe(f"/queue/{queue}.dlq", "dlq")
    assert dead.messages(1)[0].headers["dlq-reason"] == "not acknowledged within 0.2s"


# -- request / reply ----------------------------------------------------------------


def answered_by_a_gearman_worker(gearmand, requester, text):
    """A request a ``gearman -w`` worker answers: its reply comes back through
    the bridge's forwarding of job results (the marker for that path)."""
    function = unique_topic("echo")
    worker = subprocess.Popen(["gearman", "-h", gearmand.host, "-p", str(gearmand.port), "-w",
                               "-c", "1", "-f", function, "--", "cat"])
    try:
        wait_for(lambda: functions(gearmand).get(function), message="the worker")
        requester.send(f"/queue/{function}", text, **{"reply-to": "/temp-queue/answers",
                                                      "correlation-id": "marker"})
        worker.wait(timeout=20)
    finally:
        worker.kill()
        worker.wait()


@pytest.mark.cluster_too
def test_request_reply_with_a_stomp_service(gearmand, stack, stomp_clients, gearman_cli_tool):
    service_queue = unique_topic("svc")
    service = stomp_clients(stack.port)
    service.subscribe(f"/queue/{service_queue}", "svc", ack="client-individual")
    requester = stomp_clients(stack.port)
    requester.send(f"/queue/{service_queue}", b"2+2", **{"reply-to": "/temp-queue/answers",
                                                        "correlation-id": "q-17"})
    (request,) = service.messages(1)
    assert request.headers["correlation-id"] == "q-17"
    reply_to = request.headers["reply-to"]
    assert reply_to.startswith("/queue/gearhorn.tmp.")
    service.send(reply_to, b"4", **{"correlation-id": request.headers["correlation-id"]})
    service.conn.ack(request.headers["ack"])
    (reply,) = requester.messages(1)
    assert reply.body == b"4" and reply.headers["correlation-id"] == "q-17"
    assert reply.headers["subscription"] == "/temp-queue/answers"
    # The empty result the service's ACK gave the job is not forwarded as a
    # reply: the next reply through that path, a Gearman worker's, is the
    # next message the requester gets.
    wait_for(lambda: queue_depth(gearmand, service_queue) == 0, message="the ACK to land")
    answered_by_a_gearman_worker(gearmand, requester, b"marker")
    marker = requester.messages(2)[1]
    assert (marker.body, marker.headers["correlation-id"]) == (b"marker", "marker")
    requester.send("/queue/" + unique_topic("x"), b"")  # a round trip: nothing else came
    assert len(requester.listener.messages) == 2


def test_request_reply_with_a_gearman_service(gearmand, stack, stomp_clients,
                                              gearman_cli_tool):
    function = unique_topic("upper")
    worker = subprocess.Popen(["gearman", "-h", gearmand.host, "-p", str(gearmand.port), "-w",
                               "-c", "1", "-f", function, "--", "tr", "a-z", "A-Z"])
    try:
        wait_for(lambda: functions(gearmand).get(function), message="the worker")
        requester = stomp_clients(stack.port)
        requester.send(f"/queue/{function}", b"shout", **{"reply-to": "/temp-queue/r",
                                                          "correlation-id": "c9"})
        (reply,) = requester.messages(1)
        assert reply.body == b"SHOUT" and reply.headers["correlation-id"] == "c9"
        assert reply.headers["gearman-status"] == "complete"
    finally:
        worker.kill()
        worker.wait()


def test_a_request_fails_over_past_a_dead_gearmand(gearmand, start_bridge, stomp_clients):
    """Requests take the Gearman client's failover path: the first server
    listed is down, the request goes to the next one."""
    dead = types.SimpleNamespace(address=f"127.0.0.1:{servers.free_port()}")
    bridge = start_bridge([dead, gearmand])
    function = unique_topic("svc")
    worker = gearman.WorkerConnection(gearmand.host, gearmand.port, [function])
    worker.open()
    try:
        requester = stomp_clients(bridge.port)
        requester.send(f"/queue/{function}", b"ping", **{"reply-to": "/temp-queue/r"})
        (job,) = wait_for(lambda: worker.grab(1), interval=0.1, message="the request")
        worker.complete(job.handle, b"pong")
        (reply,) = requester.messages(1)
        assert reply.body == b"pong" and reply.headers["gearman-status"] == "complete"
    finally:
        worker.close()


def test_temp_queues_are_private_and_gone_with_the_connection(gearmand, stack, stomp_clients):
    requester = stomp_clients(stack.port)
    requester.send("/queue/nobody-home", b"x", **{"reply-to": "/temp-queue/r"})
    (temp,) = wait_for(lambda: [f for f in functions(gearmand) if f.startswith("gearhorn.tmp.")],
                       message="the temp queue")
    spy = stomp_clients(stack.port)
    rid = spy.receipt()
    spy.conn.subscribe(destination=f"/queue/{temp}", id="spy", headers={"receipt": rid})
    spy.wait(lambda: spy.listener.errors, message="an ERROR")
    assert "belongs to the connection" in error_detail(spy.listener.errors[0])
    requester.close()
    wait_for(lambda: temp not in functions(gearmand), message="the temp queue to be dropped")


def test_python_client_call_with_a_timeout(gearmand, stack, gearman_cli_tool):
    function = unique_topic("rev")
    worker = subprocess.Popen(["gearman", "-h", gearmand.host, "-p", str(gearmand.port), "-w",
                               "-c", "1", "-f", function, "--", "rev"])
    with Producer([(gearmand.host, gearmand.port)]) as producer:
        assert producer.call(function, "abc\n", timeout=20) == b"cba\n"
        worker.wait(timeout=20)
        with pytest.raises(TimeoutError):
            producer.call(unique_topic("nobody"), "x", timeout=0.5)
        with pytest.raises(JobFailed, match="invalid topic"):
            producer.call("fanout", json.dumps({"topic": "bad topic", "payload": 1}))


# -- headers ---------------------------------------------------------------------------


@pytest.mark.cluster_too
def test_sender_headers_reach_stomp_consumers_unchanged_and_gearman_gets_the_payload(
        gearmand, stack, stomp_clients, gearman_cli_tool):
    topic, queue = unique_topic(), unique_topic("q")
    headers = {"content-type": "application/json", "correlation-id": "c-1",
               "reply-to": "/queue/replies", "x-tenant": "a:b\\c", "x-empty": ""}
    sub = stomp_clients(stack.port)
    sub.subscribe(f"/topic/{topic}", "t")
    sub.subscribe(f"/queue/{queue}", "q")
    subscribe(gearmand, topic, "cli")
    producer = stomp_clients(stack.port)
    producer.send(f"/topic/{topic}", b'{"n": 1}', **headers)
    producer.send(f"/queue/{queue}", b'{"n": 2}', **headers)
    for message in sub.messages(2):
        assert {k: message.headers.get(k) for k in headers} == headers
    assert work(gearmand, f"{topic}_cli", 1) == ['{"n": 1}']
    # A Gearman producer sets headers in the fanout payload.
    fanout(gearmand, topic=topic, payload="p", headers={"x-from": "gearman"}, background=True)
    assert sub.messages(3)[2].headers["x-from"] == "gearman"


def test_a_reply_to_a_requester_who_left_is_not_queued(gearmand, stack, stomp_clients,
                                                       gearman_cli_tool, redis_url):
    function = unique_topic("slow")
    requester = stomp_clients(stack.port)
    before = set(functions_with_jobs(gearmand))
    requester.send(f"/queue/{function}", b"x", **{"reply-to": "/temp-queue/gone"})
    redis = redisconn.connect(redis_url)

    def listed() -> bool:
        return any(q.endswith(b".gone") for q in redis.smembers(Keys().temp_queues))

    wait_for(listed, message="the requester's temp queue")
    requester.close()  # leaves before the service answers
    # stomp.py does not wait for the DISCONNECT's receipt: the bridge has
    # seen the requester leave once its temp queue is no longer listed.
    wait_for(lambda: not listed(), message="the requester's leaving")
    out = gearman_cli(gearmand, "-w", "-c", "1", "-f", function, "--", "cat")
    assert out.returncode == 0
    # A second request answered the same way, after the first: once its reply
    # is back, the bridge has forwarded (or dropped) the first one's too.
    other = stomp_clients(stack.port)
    answered_by_a_gearman_worker(gearmand, other, b"marker")
    assert other.messages(1)[0].body == b"marker"
    # The answer went nowhere: no temp queue of the requester who left holds
    # a job nobody will take. (Not any temp queue: the marker's own one
    # counts its reply in gearmand until the bridge's WORK_COMPLETE, which
    # follows the MESSAGE: it was seen there once, a run in a few.)
    assert not {f for f in functions_with_jobs(gearmand) - before
                if f.startswith("gearhorn.tmp.") and f.endswith(".gone")}


def functions_with_jobs(server):
    return {f.name for f in gearman.status(server.host, server.port) if f.queued}
