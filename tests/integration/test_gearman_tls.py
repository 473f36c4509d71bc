"""TLS between gearhorn and a Gearman server (gear.Server: Debian's gearmand
is built without TLS)."""

import pytest

from gearhorn import gearman, servers
from gearhorn.client import Producer

from .helpers import PoolProcess, self_signed_certificate, unique_topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def tls_files(tmp_path):
    cert, key = self_signed_certificate(str(tmp_path), "gearman")
    files = gearman.TlsFiles(cert, cert, key)
    gearman.use_tls(files)
    yield files
    gearman.use_tls(None)


def test_workers_and_clients_speak_tls_to_the_gearman_server(tls_files, redis_url, tmp_path,
                                                             monkeypatch):
    server = servers.start_gear_server(data_dir=str(tmp_path / "gear"),
                                       tls=(tls_files.ca, tls_files.cert, tls_files.key))
    monkeypatch.setenv("GEARHORN_GEARMAN_TLS_CA", tls_files.ca)
    monkeypatch.setenv("GEARHORN_GEARMAN_TLS_CERT", tls_files.cert)
    monkeypatch.setenv("GEARHORN_GEARMAN_TLS_KEY", tls_files.key)
    pool = PoolProcess([server], redis_url, processes=1, log_dir=str(tmp_path))
    try:
        pool.wait_ready()
        topic = unique_topic()
        with Producer([(server.host, server.port)]) as producer:
            producer.subscribe(topic, "alice")
            assert producer.publish(topic, "secret", background=True)["copies"] == 1
        worker = gearman.WorkerConnection(server.host, server.port, [f"{topic}_alice"])
        worker.open()
        (job,) = worker.grab(1)
        assert job.data == b"secret"
        worker.close()
        # Without TLS the server does not talk to us.
        gearman.use_tls(None)
        with pytest.raises((gearman.GearmanError, OSError)):
            gearman.status(server.host, server.port, timeout=2)
    finally:
        pool.stop()
        server.stop()
