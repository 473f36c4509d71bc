"""What STOMP clients written for other brokers expect, on a real bridge and
gearmand, with stomp.py 8.2 used as its users write it: held messages come
back in the order sent and marked redelivered, whichever bridge delivers
them again; ``requeue`` as a Python bool; ERROR messages in the words
people grep for; and a taken port is one line, not a traceback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest
import stomp

from gearhorn.runtime.children import die_with_parent
from gearhorn.supervision import servers

from .helpers import queue_depth, unique_topic, wait_for
from .stomp_helpers import Collector, RawClient, error_detail

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture
def bridge(gearmand, start_bridge):
    return start_bridge([gearmand])


class User:
    """A stomp.py 8.2 connection, set up the way its documentation shows."""

    def __init__(self, port):
        self.port = port
        self.conn = stomp.Connection12([("127.0.0.1", port)], auto_decode=False)
        self.listener = Collector()
        self.conn.set_listener("", self.listener)
        self.conn.connect(wait=True)

    def reconnect(self, port=None):
        """Connect again (to another bridge with ``port``), as after a network
        blip: a new stomp.py connection (one connected again races with the
        receipt of its own DISCONNECT: its ``connect(wait=True)`` may return
        before CONNECTED)."""
        self.disconnect()
        self.port = port or self.port
        self.conn = stomp.Connection12([("127.0.0.1", self.port)], auto_decode=False)
        self.listener = Collector()
        self.conn.set_listener("", self.listener)
        self.conn.connect(wait=True)

    def disconnect(self):
        """DISCONNECT, and wait for its RECEIPT: stomp.py's ``disconnect``
        returns at once and says connected until it reads the RECEIPT, so a
        second one could write to the socket the bridge closed after it."""
        if self.conn.is_connected():
            self.conn.disconnect()
        wait_for(lambda: not self.conn.is_connected(), 30, message="DISCONNECT's RECEIPT")

    def wait(self, predicate, what):
        with self.listener.lock:
            if not self.listener.lock.wait_for(predicate, timeout=30):
                raise AssertionError(f"timed out waiting for {what}; errors: "
                                     f"{[e.headers for e in self.listener.errors]}")

    def received(self, count):
        self.wait(lambda: len(self.listener.messages) >= count, f"{count} messages")
        return list(self.listener.messages)

    def subscribe_confirmed(self, destination, headers=None, **kwargs):
        self.conn.subscribe(destination, headers={**(headers or {}), "receipt": "sub"}, **kwargs)
        self.wait(lambda: any(r.headers["receipt-id"] == "sub" for r in self.listener.receipts),
                  "the SUBSCRIBE's receipt")
        self.listener.receipts.clear()

    def close(self):
        self.disconnect()


@pytest.fixture
def users():
    made = []

    def make(port):
        made.append(User(port))
        return made[-1]

    yield make
    for user in made:
        user.close()


def bodies(frames):
    return [f.body.decode() for f in frames]


def flags(frames):
    return [f.headers["redelivered"] for f in frames]


@pytest.mark.parametrize("ack", ["client-individual", "client"])
def test_held_messages_come_back_in_order_and_redelivered_after_a_reconnect(
        bridge, users, gearmand, ack):
    queue = unique_topic("q")
    producer, consumer = users(bridge.port), users(bridge.port)
    consumer.subscribe_confirmed(f"/queue/{queue}", id="1", ack=ack,
                                 headers={"prefetch-count": 10})
    producer.conn.send(f"/queue/{queue}", b"test1")
    producer.conn.send(f"/queue/{queue}", b"test2")
    first = consumer.received(2)
    assert bodies(first) == ["test1", "test2"] and flags(first) == ["false", "false"]

    consumer.disconnect()  # no ACK: both go back
    producer.conn.send(f"/queue/{queue}", b"test3", headers={"receipt": "3"})
    producer.wait(lambda: producer.listener.receipts, "test3's receipt")
    consumer.reconnect()
    consumer.subscribe_confirmed(f"/queue/{queue}", id="1", ack="client-individual",
                                 headers={"prefetch-count": 10})
    again = consumer.received(3)
    assert bodies(again) == ["test1", "test2", "test3"]  # in order, ahead of newer ones
    assert flags(again) == ["true", "true", "false"]

    # A script that acks "the second one" acks test2.
    consumer.conn.ack(again[1].headers["ack"])
    consumer.disconnect()
    consumer.reconnect()
    consumer.subscribe_confirmed(f"/queue/{queue}", id="1", ack="client-individual",
                                 headers={"prefetch-count": 10})
    last = consumer.received(2)
    assert bodies(last) == ["test1", "test3"] and flags(last) == ["true", "true"]
    for frame in last:
        consumer.conn.ack(frame.headers["ack"])
    wait_for(lambda: queue_depth(gearmand, queue) == 0, message="every message acked")


def test_a_message_comes_back_redelivered_from_another_bridge_and_after_a_kill(
        gearmand, start_bridge, users):
    a, b = start_bridge([gearmand]), start_bridge([gearmand])
    queue = unique_topic("q")
    producer = users(b.port)
    consumer = users(a.port)
    consumer.subscribe_confirmed(f"/queue/{queue}", id="1", ack="client")
    producer.conn.send(f"/queue/{queue}", b"seen on a")
    assert flags(consumer.received(1)) == ["false"]

    # A clean reconnect to another bridge: bridge a gave the message back.
    consumer.reconnect(b.port)
    consumer.subscribe_confirmed(f"/queue/{queue}", id="1", ack="client")
    frame, = consumer.received(1)
    assert (frame.body, frame.headers["redelivered"]) == (b"seen on a", "true")
    consumer.conn.ack(frame.headers["ack"])
    consumer.disconnect()

    # A message only bridge c ever handed out; c dies with -9 holding it
    # (no give-back), gearmand requeues it, and b still says redelivered.
    c = start_bridge([gearmand])
    victim = users(c.port)
    victim.subscribe_confirmed(f"/queue/{queue}", id="1", ack="client")
    producer.conn.send(f"/queue/{queue}", b"held by c")
    assert [(f.body, f.headers["redelivered"]) for f in victim.received(1)] == [
        (b"held by c", "false")]
    c.process.send_signal(signal.SIGKILL)
    c.process.wait()
    producer.conn.send(f"/queue/{queue}", b"new")
    consumer.reconnect()
    consumer.subscribe_confirmed(f"/queue/{queue}", id="1", ack="client",
                                 headers={"prefetch-count": 10})
    received = consumer.received(2)
    assert sorted(zip(bodies(received), flags(received), strict=True)) == [
        ("held by c", "true"), ("new", "false")]


@pytest.mark.parametrize("requeue, back", [(False, False), ("FALSE", False),
                                            (True, True), ("True", True)])
def test_nack_requeue_is_read_in_any_case_as_stomp_py_writes_it(
        gearmand, bridge, users, requeue, back):
    queue = unique_topic("q")
    consumer, producer = users(bridge.port), users(bridge.port)
    consumer.subscribe_confirmed(f"/queue/{queue}", id="1", ack="client-individual")
    producer.conn.send(f"/queue/{queue}", b"rejected")
    message, = consumer.received(1)
    consumer.conn.send_frame("NACK", {"id": message.headers["ack"], "requeue": requeue})
    # The marker goes down the same path after the NACK: what comes first tells.
    producer.conn.send(f"/queue/{queue}", b"marker")
    nxt = consumer.received(2)[1]
    if back:
        assert (nxt.body, nxt.headers["redelivered"]) == (b"rejected", "true")
    else:
        assert nxt.body == b"marker"
        wait_for(lambda: queue_depth(gearmand, f"{queue}.dlq") == 1, message="the dead letter")


def error_of(raw, command, headers, body=b""):
    raw.frame(command, headers, body)
    frame = raw.read_frame()
    assert frame is not None and frame.command == "ERROR", frame
    return frame.headers["message"], error_detail(frame)


@pytest.mark.parametrize("command, headers, message, detail", [
    ("ACK", {}, "Missing header", "ACK needs an id header (STOMP 1.2)"),
    ("SEND", {}, "Missing destination", "SEND needs a destination header"),
    ("SUBSCRIBE", {"id": "1"}, "Missing destination", "SUBSCRIBE needs a destination header"),
    ("SEND", {"destination": "/queue"}, "Invalid destination",
     "'' is not a valid queue destination\n"),
    ("SUBSCRIBE", {"destination": "/topic/", "id": "1"}, "Invalid destination",
     "'' is not a valid topic destination\n"),
    ("SEND", {"destination": "/queue/q", "priority": "urgent"}, "Invalid header",
     "invalid priority 'urgent'"),
    ("SEND", {"destination": "/something/interesting"}, "Unknown destination",
     "unknown destination '/something/interesting'"),
    ("SUBSCRIBE", {"destination": "/exchange/does.not.exist", "id": "1"}, "not_found",
     "no exchange 'does.not.exist' in vhost '/'"),
    ("SEND", {"destination": "/queue/has space"}, "Invalid destination", "invalid queue name"),
    ("SUBSCRIBE", {"destination": "/queue/q", "id": "1", "prefetch-count": "lots"},
     "Invalid header", "invalid prefetch 'lots'"),
    ("UNSUBSCRIBE", {"id": "nope"}, "No subscription found", "no subscription with id 'nope'"),
    ("NACK", {"id": "m1", "requeue": "maybe"}, "Invalid header", "invalid requeue header"),
    ("COMMIT", {"transaction": "t9"}, "Bad transaction", "transaction 't9' was not begun"),
    ("FLY", {}, "Bad command", 'Could not interpret command "FLY"\n'),
])
def test_errors_use_the_words_people_grep_for(bridge, command, headers, message, detail):
    raw = RawClient(bridge.port)
    raw.connect()
    try:
        got_message, got_detail = error_of(raw, command, headers)
        assert got_message == message and detail in got_detail
    finally:
        raw.close()


def test_rabbitmqs_unsupported_version_case(bridge):
    """RabbitMQ's STOMP suite (connect_options.py, test_unsupported_version):
    a CONNECT with no version in common gets its words in the ERROR's body."""
    raw = RawClient(bridge.port, version="1.0")
    try:
        raw.frame("CONNECT", {"accept-version": "100.1", "host": "/", "login": "guest",
                              "passcode": "guest"})
        error = raw.expect("ERROR")
        assert error.body == b"Supported versions are 1.0,1.1,1.2\n"
        assert error.headers["version"] == "1.0,1.1,1.2"
    finally:
        raw.close()


@pytest.mark.parametrize("destination", ["a", "/queue/q"])
def test_rabbitmqs_bad_header_on_send_case(bridge, destination):
    """RabbitMQ's STOMP suite (parsing.py, test_bad_header_on_send): a SEND
    carrying ``message-id`` is refused before its destination is looked at."""
    raw = RawClient(bridge.port)
    raw.connect()
    try:
        message, detail = error_of(raw, "SEND", {"destination": destination, "message-id": "1"})
        assert message == "Invalid header"
        assert detail == "'message-id' is not allowed on 'SEND'.\n"
    finally:
        raw.close()


@pytest.mark.parametrize("destination, named", [
    ("/exchange/amq.fanout", "/exchange/amq.fanout"),
    ("/exchange/amq.direct/route", "/exchange/amq.direct/route"),
    ("/exchange/amq.topic/route", "/topic/route"),  # one topic, two names, as in RabbitMQ
])
def test_a_client_written_for_rabbitmqs_exchanges_works_unchanged(bridge, destination, named):
    raw = RawClient(bridge.port, version="1.0")
    raw.connect()
    try:
        raw.frame("SUBSCRIBE", {"destination": destination, "receipt": "r"})
        raw.expect("RECEIPT")
        raw.send(b"\0SEND\ndestination:" + destination.encode() + b"\n\nhello\n\0")
        message = raw.expect("MESSAGE")
        assert (message.headers["destination"], message.body) == (named, b"hello\n")
    finally:
        raw.close()


def test_a_stomp_1_0_connected_names_its_version_and_no_heartbeat(bridge):
    """RabbitMQ's STOMP suite (parsing.py) reads ``version`` and
    ``heart-beat`` on a 1.0 CONNECTED; 1.0 clients ignore them."""
    raw = RawClient(bridge.port, version="1.0")
    try:
        raw.frame("CONNECT", {"login": "guest", "passcode": "guest"})
        connected = raw.expect("CONNECTED")
        assert (connected.headers["version"], connected.headers["heart-beat"]) == ("1.0", "0,0")
    finally:
        raw.close()


@pytest.mark.parametrize("flag", ["durable", "persistent"])
def test_a_stomp_1_0_durable_subscription_needs_its_own_id(bridge, flag):
    """STOMP 1.0 would name a subscription without ``id`` by its destination;
    a durable one must be named (RabbitMQ's suite, destinations.py)."""
    raw = RawClient(bridge.port, version="1.0")
    raw.connect()
    try:
        assert error_of(raw, "SUBSCRIBE", {"destination": "/topic/t", flag: "true"}) == \
            ("Missing Header", "a durable subscription needs an id header")
    finally:
        raw.close()


def test_a_duplicated_subscription_id_and_a_frame_before_connect_are_named_as_elsewhere(
        bridge):
    raw = RawClient(bridge.port)
    raw.connect()
    raw.frame("SUBSCRIBE", {"destination": "/queue/q", "id": "1"})
    assert error_of(raw, "SUBSCRIBE", {"destination": "/queue/r", "id": "1"}) == \
        ("Duplicated subscription identifier", "A subscription identified by '1' already exists.")
    raw.close()
    raw = RawClient(bridge.port)
    assert error_of(raw, "SEND", {"destination": "/queue/q"})[0] == "Illegal command"
    raw.close()


def hold(port):
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    sock.listen(8)
    return sock


def run_gearhorn(*argv, env=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "gearhorn", *argv], capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ, **(env or {})))


def one_line_error(out):
    """The command failed with one line (its last) and no traceback."""
    assert out.returncode == 1, out.stderr
    assert "Traceback" not in out.stderr
    return out.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("taken", ["port", "ws-port"])
def test_a_bridge_on_a_taken_port_says_which_setting_to_change(gearmand, redis_url, taken):
    ports = {"port": servers.free_port(), "ws-port": servers.free_port()}
    held = hold(ports[taken])
    try:
        out = run_gearhorn("bridge", "--port", str(ports["port"]), "--ws-port",
                           str(ports["ws-port"]), "--redis-url", redis_url,
                           "--gearman", gearmand.address)
    finally:
        held.close()
    line = one_line_error(out)
    assert line.startswith("gearhorn bridge: port ") and f"port {ports[taken]} " in line
    assert f"--{taken} PORT" in line and "is taken" in line
    setting = {"port": "bridge_port", "ws-port": "bridge_ws_port"}[taken]
    assert f"setting {setting}" in line
    if taken == "ws-port":
        assert "--ws-port 0 turns WebSocket off" in line


def test_the_console_on_a_taken_port_says_which_setting_to_change(redis_url, gearmand):
    port = servers.free_port()
    held = hold(port)
    try:
        out = run_gearhorn("web", "--port", str(port), "--redis-url", redis_url,
                           "--gearman", gearmand.address)
    finally:
        held.close()
    line = one_line_error(out)
    assert f"gearhorn web: port {port} on 127.0.0.1 is taken" in line
    assert "--port PORT (setting web_port, env GEARHORN_WEB_PORT)" in line


@pytest.fixture
def up_ports():
    return {name: servers.free_port() for name in
            ("redis", "gearman", "stomp", "ws", "web")}


def up_argv(ports, tmp_path):
    return (["up", "--processes", "1", "--data-dir", str(tmp_path / "data"),
             "--redis-url", f"redis://127.0.0.1:{ports['redis']}/0",
             "--gearman", f"127.0.0.1:{ports['gearman']}"],
            {"GEARHORN_BRIDGE_PORT": str(ports["stomp"]),
             "GEARHORN_BRIDGE_WS_PORT": str(ports["ws"]),
             "GEARHORN_WEB_PORT": str(ports["web"])})


@pytest.mark.parametrize("taken, words", [
    ("redis", "does not answer as Redis: choose another with --redis-url URL"),
    ("gearman", "does not answer as gearmand: choose another with --gearman HOST:PORT"),
])
def test_up_refuses_a_port_held_by_something_else(tmp_path, up_ports, redis_server,
                                                  gearman_cli_tool, taken, words):
    held = hold(up_ports[taken])
    try:
        argv, env = up_argv(up_ports, tmp_path)
        out = run_gearhorn(*argv, env=env, timeout=120)
    finally:
        held.close()
    line = one_line_error(out)
    assert line.startswith(f"gearhorn up: port {up_ports[taken]} on 127.0.0.1 ") and words in line


def test_up_starts_without_what_other_programs_hold(tmp_path, up_ports, redis_server,
                                                    gearman_cli_tool):
    """RabbitMQ's STOMP, web-stomp and management ports are gearhorn's defaults too:
    up starts the rest and its banner says what is off and why."""
    held = [hold(up_ports[name]) for name in ("stomp", "ws", "web")]
    argv, env = up_argv(up_ports, tmp_path)
    log_path = tmp_path / "up.log"
    with open(log_path, "wb") as log:
        up = subprocess.Popen([sys.executable, "-m", "gearhorn", *argv], stdout=log,
                              stderr=subprocess.STDOUT, env=dict(os.environ, **env),
                              preexec_fn=die_with_parent)
    try:
        text = log_path.read_text
        wait_for(lambda: "gearhorn is up" in text() or up.poll() is not None, timeout=90,
                 message="the banner")
        banner = text()
        assert up.poll() is None, banner
        assert f"port {up_ports['stomp']} on 127.0.0.1 is taken" in banner
        assert "(setting bridge_port, env GEARHORN_BRIDGE_PORT)" in banner
        assert f"off: port {up_ports['web']} is taken" in banner
    finally:
        up.send_signal(signal.SIGINT)
        up.wait(60)
        for sock in held:
            sock.close()
    assert "Traceback" not in log_path.read_text()
