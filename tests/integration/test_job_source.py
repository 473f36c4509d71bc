"""gearman.JobSource, the fanout workers' intake, on real gearmand."""

import logging

import pytest

from gearhorn import gearman
from gearhorn.runtime.background import Outage
from gearhorn.supervision import servers

from .helpers import unique_topic, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def submit(server, function, count):
    client = gearman.Client([(server.host, server.port)])
    try:
        client.submit_background([gearman.Copy(function, f"{function}-{i}", str(i).encode())
                                  for i in range(count)])
    finally:
        client.close()


def answer(taken):
    for worker, job in taken:
        worker.complete(job.handle)
    for worker in {worker for worker, _ in taken}:
        worker.flush()


def test_a_backlog_comes_in_growing_batches_and_a_quiet_queue_one_at_a_time(gearmand):
    function = unique_topic("js")
    submit(gearmand, function, 100)
    source = gearman.JobSource([(gearmand.host, gearmand.port)], [function], "js-test", most=32)
    try:
        sizes, data = [], []
        while sum(sizes) < 100:
            taken = source.take(timeout=10)
            assert taken, "gearmand still had jobs"
            sizes.append(len(taken))
            data += [int(job.data) for _, job in taken]
            answer(taken)
        assert sizes[:6] == [1, 2, 4, 8, 16, 32] and max(sizes) == 32
        assert data == list(range(100))  # in the order queued
        assert source.take(timeout=0.2) == []  # empty: it sleeps
        submit(gearmand, function, 1)
        [(_, job)] = source.take(timeout=20)  # gearmand's NOOP wakes it
        assert job.data == b"0" and job.function == function
    finally:
        source.close()


def test_large_jobs_come_as_many_as_fit_in_the_batch_bytes(gearmand, monkeypatch):
    """A backlog of large jobs does not grow a batch past BATCH_BYTES of job
    data (a worker holds about that much at a time), and small ones after
    it grow again."""
    from gearhorn.gearman import worker as worker_module

    monkeypatch.setattr(worker_module, "BATCH_BYTES", 40_000)
    function = unique_topic("jsbig")
    client = gearman.Client([(gearmand.host, gearmand.port)])
    try:
        client.submit_background([gearman.Copy(function, f"big-{i}", b"x" * 10_000)
                                  for i in range(40)])
        client.submit_background([gearman.Copy(function, f"small-{i}", b"s")
                                  for i in range(100)])
    finally:
        client.close()
    source = gearman.JobSource([(gearmand.host, gearmand.port)], [function], "js-big", most=32)
    try:
        batches = []
        while sum(len(b) for b in batches) < 140:
            taken = source.take(timeout=10)
            assert taken, "gearmand still had jobs"
            batches.append([job.unique for _, job in taken])
            answer(taken)
        big = [len(b) for b in batches if all(u.startswith("big-") for u in b)]
        assert max(big) <= 8  # 1, 2, 4, 8 (80,000 bytes), then 4 at a time
        assert 4 in big[4:]
        assert max(len(b) for b in batches) == 32  # the small ones grow again
    finally:
        source.close()


def test_a_server_down_at_start_is_served_once_it_is_up(gearmand, tmp_path):
    function = unique_topic("js")
    port = servers.free_port()
    outages = {}

    def outage(what):  # as the pool tells its outages (worker/wiring.py)
        outages[what] = Outage(logging.getLogger("test"), what)
        return outages[what]
    source = gearman.JobSource([("127.0.0.1", port), (gearmand.host, gearmand.port)],
                               [function], "js-test", outages=outage)
    down = outages[f"gearmand 127.0.0.1:{port} (worker)"]
    late = None
    try:
        submit(gearmand, function, 1)
        [(_, job)] = source.take(timeout=20)  # the live one serves meanwhile
        assert job.data == b"0"
        assert down.down
        late = servers.start_gearmand(port=port, data_dir=str(tmp_path))
        submit(late, function, 1)
        taken = wait_for(lambda: source.take(timeout=1), timeout=30,
                         message="the job of the gearmand that came up")
        assert [(w.conn.port, j.data) for w, j in taken] == [(port, b"0")]
        assert not down.down
    finally:
        source.close()
        if late is not None:
            late.stop()


def test_wake_ends_a_wait(gearmand):
    source = gearman.JobSource([(gearmand.host, gearmand.port)], [unique_topic("js")], "js")
    try:
        source.wake()  # as drain() does from the signal handler
        assert source.take(timeout=600) == []  # the test's timeout is 60 s
    finally:
        source.close()
