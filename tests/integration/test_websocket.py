"""STOMP over WebSocket on the real bridge: the handshake, frames in
messages, heart-beats, logins and wss:// with a hand-made client, then real
JavaScript clients: @stomp/stompjs under Node, and stompjs's browser bundle
in headless Chromium."""

import contextlib
import json
import os
import subprocess

import pytest
from wsproto.events import Message

from .browser import JS_DIR, browser, node_modules, static_site, stomp_page, stompjs_bundle
from .helpers import gearman_cli, self_signed_certificate, unique_topic, wait_for
from .stomp_helpers import WsClient, error_detail

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CONNECT = b"CONNECT\naccept-version:1.0,1.1,1.2\nhost:x\n\n\0"


@pytest.fixture
def stack(gearmand, start_pool, start_bridge):
    start_pool([gearmand], processes=1)
    return start_bridge([gearmand], websocket=True)


@pytest.fixture
def ws_clients():
    clients = []

    def make(port, **kwargs):
        client = WsClient(port, **kwargs)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.mark.parametrize(("offered", "chosen"), [
    (["v10.stomp", "v11.stomp", "v12.stomp"], "v12.stomp"),
    (["v11.stomp"], "v11.stomp"),
    (["v10.stomp"], "v10.stomp"),
    ([], None),
])
def test_the_stomp_subprotocols_are_negotiated(stack, ws_clients, offered, chosen):
    client = ws_clients(stack.ws_port, subprotocols=offered)
    assert client.accepted is not None and client.accepted.subprotocol == chosen
    client.send_message(CONNECT)
    assert client.expect("CONNECTED").headers["version"] == "1.2"


def test_other_paths_and_subprotocols_are_refused_with_http_errors(stack, ws_clients):
    assert ws_clients(stack.ws_port, path="/other").rejected.status_code == 404
    refused = ws_clients(stack.ws_port, subprotocols=["mqtt"])
    assert refused.rejected.status_code == 400


def test_one_frame_per_message_or_several_in_one(stack, ws_clients):
    queue = f"/queue/{unique_topic()}"
    client = ws_clients(stack.ws_port)
    client.send_message(CONNECT)
    client.expect("CONNECTED")
    # SUBSCRIBE and two SENDs in one message, a third SEND split over two.
    send = b"SEND\ndestination:" + queue.encode() + b"\ncontent-length:%d\n\n%s\0"
    client.send_message(b"SUBSCRIBE\nid:s\ndestination:" + queue.encode() + b"\n\n\0",
                        send % (2, b"m1"), send % (2, b"m2"))
    third = send % (2, b"m3")
    client.send_message(third[:10])
    client.send_message(third[10:])
    assert [client.expect("MESSAGE").body for _ in range(3)] == [b"m1", b"m2", b"m3"]


def test_a_broken_websocket_frame_ends_the_connection_after_what_came_before(stack,
                                                                              ws_clients):
    """An unmasked frame right behind a SEND: the SEND is kept and its
    RECEIPT comes, then the close frame with RFC 6455's 1002."""
    queue = f"/queue/{unique_topic()}"
    client = ws_clients(stack.ws_port)
    client.send_message(CONNECT)
    client.expect("CONNECTED")
    send = client.ws.send(Message(data=f"SEND\ndestination:{queue}\nreceipt:r\n\nkept\0"))
    client.sock.sendall(send + b"\x81\x05SEND\n")  # the second frame is not masked
    assert client.expect("RECEIPT").headers["receipt-id"] == "r"
    assert client.read_frame() is None
    assert client.close_code == 1002 and "masked" in client.close_reason
    reader = ws_clients(stack.ws_port)
    reader.send_message(CONNECT)
    reader.expect("CONNECTED")
    reader.send_message(f"SUBSCRIBE\nid:s\ndestination:{queue}\n\n\0".encode())
    assert reader.expect("MESSAGE").body == b"kept"


def test_heart_beats_over_websocket(gearmand, start_bridge, ws_clients):
    # The bridge offers 200 ms (10 s by default), so two beats come quickly.
    bridge = start_bridge([gearmand], websocket=True,
                          env={"GEARHORN_STOMP_HEARTBEAT_MS": "200"})
    client = ws_clients(bridge.ws_port)
    client.send_message(b"CONNECT\naccept-version:1.2\nhost:x\nheart-beat:0,300\n\n\0")
    connected = client.expect("CONNECTED")
    assert connected.headers["heart-beat"].split(",")[0] != "0"

    def beats():
        client.sock.settimeout(1)
        with contextlib.suppress(TimeoutError):
            client.receive_once()
        return client.parser.heartbeats >= 2

    wait_for(beats, timeout=60, message="two heart-beats from the bridge")


def test_logins_and_rights_are_the_same_as_over_tcp(gearmand, start_pool, start_bridge,
                                                    ws_clients, tmp_path):
    from gearhorn.rules import auth

    path = tmp_path / "credentials.ini"
    path.write_text(f"[user carol]\npasscode = {auth.hash_passcode('C4rol-pass-1', 1000)}\n"
                    "read = /queue/mine\nwrite = /queue/mine\n")
    bridge = start_bridge([gearmand], websocket=True,
                          env={"GEARHORN_STOMP_CREDENTIALS_FILE": str(path)})
    wrong = ws_clients(bridge.ws_port)
    wrong.send_message(b"CONNECT\naccept-version:1.2\nhost:x\nlogin:carol\npasscode:nope\n\n\0")
    assert error_detail(wrong.expect("ERROR")) == "Access refused for user 'carol'"
    assert wrong.read_frame() is None
    carol = ws_clients(bridge.ws_port)
    carol.send_message(b"CONNECT\naccept-version:1.2\nhost:x\nlogin:carol\n"
                       b"passcode:C4rol-pass-1\n\n\0")
    carol.expect("CONNECTED")
    carol.frame("SEND", {"destination": "/queue/theirs", "receipt": "r"}, b"x")
    assert "may not send to /queue/theirs" in error_detail(carol.expect("ERROR"))


def test_wss_with_the_bridge_certificate(gearmand, start_pool, start_bridge, ws_clients,
                                         tmp_path):
    cert, key = self_signed_certificate(str(tmp_path), "bridge")
    bridge = start_bridge([gearmand], websocket=True,
                          env={"GEARHORN_STOMP_TLS_CERT": cert, "GEARHORN_STOMP_TLS_KEY": key})
    client = ws_clients(bridge.ws_port, tls_ca=cert)
    assert client.accepted.subprotocol == "v12.stomp"
    client.send_message(CONNECT)
    client.expect("CONNECTED")
    queue = f"/queue/{unique_topic()}"
    client.frame("SUBSCRIBE", {"id": "s", "destination": queue})
    client.frame("SEND", {"destination": queue}, b"over wss")
    assert client.expect("MESSAGE").body == b"over wss"


# -- real JavaScript clients ------------------------------------------------------------


def test_stompjs_under_node_subscribes_and_publishes(gearmand, stack, gearman_cli_tool):
    node_modules()
    topic, queue = unique_topic(), unique_topic("q")
    node = subprocess.Popen(
        ["node", os.path.join(JS_DIR, "stompjs_client.mjs"),
         f"ws://127.0.0.1:{stack.ws_port}/ws", topic, queue],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=JS_DIR)
    lines = []

    def line():
        text = node.stdout.readline()
        assert text, f"node exited: {lines}"
        lines.append(json.loads(text))
        return lines[-1]

    try:
        assert line() == {"connected": "1.2", "subprotocol": "v12.stomp"}
        assert line() == {"ready": True}
        # Its own publication comes back through the fanout workers.
        assert line() == {"destination": f"/topic/{topic}", "body": "from-node"}
        # A Gearman client's fanout and queue job reach it too.
        assert gearman_cli(gearmand, "-f", "fanout", json.dumps(
            {"topic": topic, "payload": "from-gearman"})).returncode == 0
        assert line() == {"destination": f"/topic/{topic}", "body": "from-gearman"}
        assert gearman_cli(gearmand, "-b", "-f", queue, "queued").returncode == 0
        assert line() == {"destination": f"/queue/{queue}", "body": "queued",
                          "redelivered": "false"}
        # What it sent to a queue is a Gearman job any worker takes.
        out = gearman_cli(gearmand, "-w", "-c", "1", "-f", f"{queue}.out")
        assert out.stdout == b"job-from-node"
        gearman_cli(gearmand, "-f", "fanout", json.dumps({"topic": topic, "payload": "stop"}))
        assert node.wait(60) == 0, lines
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()


# -- a real browser -----------------------------------------------------------------------


PAGE = stomp_page("gearhorn", """\
const client = new StompJs.Client({brokerURL: params.get("url"), reconnectDelay: 0});
client.onConnect = () => {
  client.subscribe("/topic/" + params.get("topic"), (m) => log("got:" + m.body),
                   {receipt: "sub"});
  client.watchForReceipt("sub", () => {
    log("ready");
    client.publish({destination: "/queue/" + params.get("queue"), body: "from-the-browser"});
  });
};
client.onStompError = (f) => log("error:" + f.headers.message);
client.activate();
""")


def test_a_browser_page_gets_a_fanout_and_publishes_to_a_queue(gearmand, stack, tmp_path,
                                                               gearman_cli_tool):
    topic, queue = unique_topic(), unique_topic("q")
    with static_site(tmp_path / "site", {"index.html": PAGE,
                                         "stomp.umd.min.js": stompjs_bundle()}) as site:
        url = (f"{site}/index.html?"
               f"url=ws://127.0.0.1:{stack.ws_port}/ws&topic={topic}&queue={queue}")
        with browser() as chromium:
            page = chromium.new_page()
            page.goto(url)
            page.wait_for_selector("#log li:text('ready')", timeout=60_000)
            # A Gearman client publishes with the gearman command-line tool.
            out = gearman_cli(gearmand, "-f", "fanout",
                              json.dumps({"topic": topic, "payload": "to-the-browser"}))
            # The page reads the topic's history (real-time topics, the
            # default): no gearmand copy is made for it.
            assert json.loads(out.stdout)["copies"] == 0
            page.wait_for_selector("#log li:text('got:to-the-browser')", timeout=60_000)
            # What the page published is a Gearman job on the queue.
            out = gearman_cli(gearmand, "-w", "-c", "1", "-f", queue)
            assert out.stdout == b"from-the-browser"
            assert not page.locator("#log li:text-matches('^error')").count()
