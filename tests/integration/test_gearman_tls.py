"""TLS between gearhorn and a Gearman server (gear.Server: Debian's gearmand
is built without TLS). TLS is a setting of each connection, not of the
process: one process holds TLS and plain connections side by side."""

import json
import os
import subprocess
import sys

import pytest

from gearhorn import gearman
from gearhorn.client import Producer
from gearhorn.supervision import servers

from .helpers import PoolProcess, self_signed_certificate, unique_topic, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


@pytest.fixture
def tls_files(tmp_path):
    cert, key = self_signed_certificate(str(tmp_path), "gearman")
    return gearman.TlsFiles(cert, cert, key)


@pytest.fixture
def tls_server(tls_files, tmp_path):
    server = servers.start_gear_server(data_dir=str(tmp_path / "gear"),
                                       tls=(tls_files.ca, tls_files.cert, tls_files.key))
    yield server
    server.stop()


@pytest.fixture
def tls_env(tls_files, monkeypatch):
    monkeypatch.setenv("GEARHORN_GEARMAN_TLS_CA", tls_files.ca)
    monkeypatch.setenv("GEARHORN_GEARMAN_TLS_CERT", tls_files.cert)
    monkeypatch.setenv("GEARHORN_GEARMAN_TLS_KEY", tls_files.key)


def test_workers_clients_and_commands_speak_tls(tls_files, tls_server, tls_env, redis_url,
                                                tmp_path):
    server = tls_server
    pool = PoolProcess([server], redis_url, processes=1, log_dir=str(tmp_path),
                       tls=tls_files)
    try:
        pool.wait_ready()
        topic = unique_topic()
        with Producer([(server.host, server.port)], tls=tls_files) as producer:
            producer.subscribe(topic, "alice")
            assert producer.publish(topic, "secret", background=True)["copies"] == 1
        # gearhorn status takes its TLS files from the environment.
        out = subprocess.run([sys.executable, "-m", "gearhorn", "status", "--json",
                              "--gearman", server.address, "--redis-url", redis_url],
                             capture_output=True, timeout=60, env=dict(os.environ))
        (entry,) = json.loads(out.stdout)["gearmand"]
        assert {f["queue"]: f["queued"] for f in entry["functions"]}[f"{topic}_alice"] == 1
        # Without TLS the server does not talk to us, while a TLS worker
        # connection in the same process does.
        with pytest.raises((gearman.GearmanError, OSError)):
            gearman.status(server.host, server.port, timeout=2)
        worker = gearman.WorkerConnection(server.host, server.port, [f"{topic}_alice"],
                                          tls=tls_files)
        worker.open()
        # Polled: a loaded gear.Server that answers no echo for 3 s is let
        # go of, and the held copy comes again a moment later (c12's run).
        (job,) = wait_for(lambda: worker.grab(1), timeout=60, interval=0.2,
                          message="the copy, over TLS")
        assert job.data == b"secret"
        worker.close()
    finally:
        pool.stop()


def test_bridge_speaks_tls_for_queues_topics_and_requests(tls_files, tls_server, tls_env,
                                                          redis_url, tmp_path, start_bridge):
    from .stomp_helpers import StompClient

    server = tls_server
    pool = PoolProcess([server], redis_url, processes=1, log_dir=str(tmp_path),
                       tls=tls_files)
    bridge = start_bridge([server])
    try:
        pool.wait_ready()
        client = StompClient(bridge.port)
        topic = unique_topic()
        client.subscribe(f"/topic/{topic}", "t")
        client.subscribe(f"/queue/{topic}.jobs", "q")
        client.send(f"/topic/{topic}", "to the topic")
        client.send(f"/queue/{topic}.jobs", "to the queue")
        bodies = sorted(m.body for m in client.messages(2))
        assert bodies == [b"to the queue", b"to the topic"]
        # A request answered by a Gearman worker, over TLS both ways.
        worker = gearman.WorkerConnection(server.host, server.port, [f"{topic}.rpc"],
                                          tls=tls_files)
        worker.open()
        client.send(f"/queue/{topic}.rpc", "2+2", **{"reply-to": "/temp-queue/answers",
                                                     "correlation-id": "c1"})
        job = wait_for(lambda: worker.grab(1), timeout=30, interval=0.1,
                       message="the request")[0]
        assert job.data == b"2+2"
        worker.complete(job.handle, b"4")
        reply = client.messages(3)[2]
        assert reply.body == b"4" and reply.headers["correlation-id"] == "c1"
        worker.close()
        client.close()
    finally:
        pool.stop()
