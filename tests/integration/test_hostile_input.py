"""Hostile input on every port: a clear error, a closed connection or a
rejected job, and other clients carry on."""

import json
import time

import pytest

from .helpers import gearman_cli, unique_topic, wait_for
from .stomp_helpers import RawClient, error_detail

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def stack(gearmand, start_pool, start_bridge):
    start_pool([gearmand])
    return start_bridge([gearmand], env={"GEARHORN_STOMP_FRAME_TIMEOUT": "1",
                                         "GEARHORN_STOMP_MAX_SUBSCRIPTIONS": "5"})


@pytest.fixture
def bystander(stack, stomp_clients):
    """A well-behaved client that must notice nothing."""
    queue = unique_topic("q")
    client = stomp_clients(stack.port)
    client.subscribe(f"/queue/{queue}", "1")

    def still_served():
        seen = len(client.listener.messages)
        stomp_clients(stack.port).send(f"/queue/{queue}", b"still fine")
        assert client.messages(seen + 1)[-1].body == b"still fine"
    return still_served


def error_of(raw):
    frame = raw.read_frame()
    assert frame is not None and frame.command == "ERROR"
    assert raw.read_frame() is None  # and the bridge hung up
    return error_detail(frame)


@pytest.mark.parametrize("garbage, reason", [
    (b"SEND\n" + b"".join(b"h%d:v\n" % i for i in range(100)) + b"\n\0", "more than 64 headers"),
    (b"SEND\n" + b"x-endless:" + b"v" * 600_000, "frame headers too large"),
    (b"SEND\ndestination:/queue/\xff\xfe\n\n\0", "frame headers are not UTF-8"),
    (b"SEND\ndestination:/queue/a\0b\n\n\0", "NUL byte in frame headers"),
    (b"SEND\ndestination:/queue/a\\tb\n\n\0", "undefined escape sequence"),
    (b"SEND\ndestination:/queue/" + b"q" * 300 + b"\n\n\0", "invalid queue name"),
    (b"SEND\ndestination:/topic/a\\cb c\n\n\0", "invalid topic"),
])
def test_bad_frames_get_an_error_and_a_closed_connection(stack, bystander, garbage, reason):
    raw = RawClient(stack.port)
    raw.connect()
    raw.send(garbage)
    assert reason in error_of(raw)
    raw.close()
    bystander()


def test_a_frame_never_finished_is_cut_off(stack, bystander):
    raw = RawClient(stack.port)
    raw.connect()
    raw.send(b"SEND\ndestination:/queue/x\n")  # ...and nothing more
    # The ERROR names the 1 s frame timeout as the cause (a bridge that never
    # cut it off would leave read_frame to its 20 s socket timeout: no ERROR).
    assert error_of(raw) == "frame not completed within 1s"
    bystander()


def test_a_sender_trickling_a_frame_is_cut_off(stack, bystander):
    raw = RawClient(stack.port)
    raw.connect()
    # The whole trickle would take 7.5 s; the bridge hangs up in the middle.
    with pytest.raises(OSError):
        for byte in b"SEND\ndestination:/queue/x\ncontent-length:100\n\n" + b"x" * 100:
            raw.send(bytes([byte]))
            time.sleep(0.05)  # the trickle itself is what is tested
    bystander()


def test_a_flood_of_subscriptions_is_refused(stack, bystander):
    raw = RawClient(stack.port)
    raw.connect()
    for i in range(6):
        raw.frame("SUBSCRIBE", {"destination": f"/topic/flood{i}", "id": str(i)})
    assert error_of(raw) == "more than 5 subscriptions on one connection"
    bystander()


def test_a_flood_of_connections_is_refused_beyond_the_limit(gearmand, start_pool, start_bridge,
                                                            stomp_clients):
    start_pool([gearmand])
    bridge = start_bridge([gearmand], env={"GEARHORN_STOMP_MAX_CONNECTIONS": "20",
                                           "GEARHORN_STOMP_CONNECT_TIMEOUT": "2"})
    # 21 connections that never send CONNECT (the bridge's start-up probe may
    # still hold a place, so one or two of the last are refused).
    silent = [RawClient(bridge.port) for _ in range(21)]
    errors = [error_of(raw) for raw in silent]
    refused = errors.count("too many connections (limit 20)")
    assert 1 <= refused <= 2, errors
    # The accepted ones are cut off after stomp_connect_timeout, and room returns.
    assert errors.count("no CONNECT within 2s") == 21 - refused, errors
    wait_for(lambda: stomp_clients(bridge.port).conn.is_connected(), message="a connection")


@pytest.mark.parametrize("job, reason", [
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"topic": "t", "payload": ' + b"9" * 10_000 + b"}", "Exceeds the limit"),
    (b'{"topic": "t", "payload": NaN}', "NaN is not JSON"),
    (b'{"topic": "t", "payload": 1e999}', "out of range"),
    (b'{"topic": "t\\u0000x", "payload": 1}', "invalid topic"),
    # Over max_payload_bytes, set to 1 MB below: the gearman tool takes 35 s to
    # read 7 MB from stdin (gearhorn's own client sends it in 0.9 s), and the
    # check before parsing is the same at any limit.
    (b'{"topic": "t", "payload": "' + b"x" * 1_200_000 + b'"}', "over max_payload_bytes"),
    (b"\xff\xfe{}", "job is not UTF-8"),
])
def test_json_bombs_and_bad_names_fail_the_job_and_the_pool_serves_on(
        gearmand, start_pool, gearman_cli_tool, job, reason, monkeypatch):
    monkeypatch.setenv("GEARHORN_MAX_PAYLOAD_BYTES", "1000000")
    start_pool([gearmand])
    out = gearman_cli(gearmand, "-f", "fanout", data=job, timeout=60)
    assert out.returncode != 0 and reason in out.stdout.decode() + out.stderr.decode()
    ok = gearman_cli(gearmand, "-f", "fanout", json.dumps({"topic": "t", "payload": 1}))
    assert ok.returncode == 0 and json.loads(ok.stdout)["copies"] == 0


def test_a_burst_of_connections_subscribing_at_once_is_served(stack):
    """More simultaneous SUBSCRIBEs than Redis connections: they queue for one
    (redis-py's default pool fails beyond 100)."""
    topic = unique_topic()
    clients = [RawClient(stack.port) for _ in range(150)]
    for raw in clients:
        raw.connect()
    for i, raw in enumerate(clients):
        raw.frame("SUBSCRIBE", {"destination": f"/topic/{topic}", "id": "1",
                                "receipt": str(i)})
    for raw in clients:
        assert raw.read_frame().command == "RECEIPT"
        raw.close()


def test_line_breaks_before_connect_do_not_buy_time(gearmand, start_pool, start_bridge):
    start_pool([gearmand])
    bridge = start_bridge([gearmand], env={"GEARHORN_STOMP_CONNECT_TIMEOUT": "1"})
    raw = RawClient(bridge.port)
    # 10 s of "beating" before CONNECT; the bridge hangs up in the middle.
    with pytest.raises(OSError):
        for _ in range(100):
            raw.send(b"\n")
            time.sleep(0.1)  # the trickle itself is what is tested
