"""The commands a person types: gearhorn up, subscribe, publish, consume, status."""

import json
import os
import signal
import subprocess
import sys
import urllib.request

import pytest

from gearhorn.runtime.children import die_with_parent
from gearhorn.supervision import servers

from .helpers import unique_topic, wait_for
from .stomp_helpers import StompClient

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def gearhorn(*args, timeout=30, **kwargs):
    return subprocess.run([sys.executable, "-m", "gearhorn", *args], capture_output=True,
                          timeout=timeout, **kwargs)


@pytest.mark.cluster_too
def test_helper_commands_subscribe_publish_consume_status(gearmand, redis_url, start_pool):
    start_pool([gearmand])
    common = ["--gearman", gearmand.address, "--redis-url", redis_url]
    topic = unique_topic()
    out = gearhorn("subscribe", topic, "alice", *common)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"topic": topic, "client_id": "alice", "subscribers": 1}
    out = gearhorn("publish", topic, '{"k": [1]}', "--json", "--background", *common)
    assert json.loads(out.stdout)["copies"] == 1
    out = gearhorn("publish", topic, "plain text", "--background", *common)
    assert json.loads(out.stdout)["copies"] == 1
    out = gearhorn("publish", topic, "later", "--delay", "3600", "--priority", "high",
                   "--header", "x-team=ops", *common)
    assert json.loads(out.stdout)["scheduled"] is True, out.stderr

    out = gearhorn("status", "--json", *common)
    report = json.loads(out.stdout)
    assert {t["topic"]: t["subscribers"] for t in report["topics"]} == {topic: 1}
    assert report["delayed"] == 1 and len(report["workers"]) == 2
    (server,) = report["gearmand"]
    queued = {f["queue"]: f["queued"] for f in server["functions"]}
    assert queued[f"{topic}_alice"] == 2
    assert f"{topic}_alice" in gearhorn("status", *common).stdout.decode()

    out = gearhorn("consume", topic, "alice", "--count", "2", *common)
    assert out.stdout.splitlines() == [b'{"k":[1]}', b"plain text"]
    out = gearhorn("unsubscribe", topic, "alice", *common)
    assert json.loads(out.stdout)["subscribers"] == 0


def test_helper_commands_report_bad_input_in_one_line(gearmand, redis_url, start_pool):
    start_pool([gearmand])
    out = gearhorn("subscribe", "t", "bad_id", "--gearman", gearmand.address)
    assert out.returncode == 1
    assert out.stderr.decode().strip().endswith("'_' is not allowed "
                                                "(copies go to <topic>_<client_id>, split at "
                                                "the last '_')")
    out = gearhorn("publish", "t", "{nope", "--json", "--gearman", gearmand.address)
    assert out.returncode == 1 and b"PAYLOAD is not JSON" in out.stderr


def test_unreachable_gearmand_is_a_clear_error():
    port = servers.free_port()
    out = gearhorn("publish", "t", "x", "--gearman", f"127.0.0.1:{port}")
    assert out.returncode == 1
    assert f"cannot connect to gearmand 127.0.0.1:{port}" in out.stderr.decode()


def test_up_starts_everything_and_stops_it_on_ctrl_c(tmp_path, redis_server, gearman_cli_tool):
    redis_port, gearman_port, stomp_port, ws_port, web_port = (
        servers.free_port() for _ in range(5))
    log = open(tmp_path / "up.log", "wb")  # noqa: SIM115
    up = subprocess.Popen(
        [sys.executable, "-m", "gearhorn", "up", "--processes", "2",
         "--data-dir", str(tmp_path / "data"),
         "--redis-url", f"redis://127.0.0.1:{redis_port}/0",
         "--gearman", f"127.0.0.1:{gearman_port}"],
        env=dict(os.environ, GEARHORN_BRIDGE_PORT=str(stomp_port),
                 GEARHORN_BRIDGE_WS_PORT=str(ws_port), GEARHORN_WEB_PORT=str(web_port)),
        stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
    try:
        text = lambda: (tmp_path / "up.log").read_text()  # noqa: E731
        wait_for(lambda: "gearhorn is up" in text(), timeout=60, message="the banner")
        assert "started gearmand" in text() and "started, data in" in text()
        # The banner's own commands, run as printed, make a broadcast.
        commands = [line.strip() for line in text().splitlines()
                    if line.strip().startswith("gearman -h")]
        assert len(commands) == 3
        outputs = [subprocess.run(["bash", "-c", cmd], capture_output=True, timeout=20)
                   for cmd in commands]
        assert [o.returncode for o in outputs] == [0, 0, 0]
        assert json.loads(outputs[0].stdout)["subscribers"] == 1
        assert json.loads(outputs[1].stdout)["copies"] == 1
        assert outputs[2].stdout == b"hello"
        assert f"stomp     127.0.0.1:{stomp_port}  (started)" in text()
        assert f"websocket ws://127.0.0.1:{ws_port}/ws" in text()
        assert servers.is_listening("127.0.0.1", ws_port)
        assert f"console   http://127.0.0.1:{web_port}/" in text()
        with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/readyz", timeout=20) as r:
            assert json.loads(r.read())["ready"] is True
        client = StompClient(stomp_port)
        client.subscribe("/topic/news", "1")
        subprocess.run(["bash", "-c", commands[1]], capture_output=True, timeout=20)
        assert client.messages(1)[0].body == b"hello"
        client.close()
    finally:
        up.send_signal(signal.SIGINT)
        assert up.wait(30) == 0
        log.close()
    assert not servers.is_listening("127.0.0.1", redis_port)
    assert not servers.is_listening("127.0.0.1", gearman_port)
    assert not servers.is_listening("127.0.0.1", stomp_port)
    assert not servers.is_listening("127.0.0.1", ws_port)
    assert not servers.is_listening("127.0.0.1", web_port)
    assert os.path.exists(tmp_path / "data" / "appendonlydir")


@pytest.mark.parametrize(("credentials", "reason"), [
    ("[users]\nalice = not-a-hash\n", "unknown key 'alice'"),
    (None, "cannot read credentials file"),
])
def test_a_bad_credentials_file_stops_the_bridge_with_one_line(tmp_path, credentials, reason):
    path = tmp_path / "credentials.ini"
    if credentials is not None:
        path.write_text(credentials)
    out = gearhorn("bridge", "--port", str(servers.free_port()),
                   env=dict(os.environ, GEARHORN_STOMP_CREDENTIALS_FILE=str(path)))
    assert out.returncode == 1
    lines = out.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gearhorn bridge: ") and reason in lines[0]


def test_a_bad_setting_is_one_line_and_exit_status_2():
    out = gearhorn("status", env=dict(os.environ, GEARHORN_PERSISTENCE="sometimes"))
    assert out.returncode == 2
    assert out.stderr.decode().strip() == (
        "gearhorn status: persistence must be one of auto, redis, sqlite, none, got 'sometimes'")
