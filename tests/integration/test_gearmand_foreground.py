"""What gearmand does with a foreground job whose submitter goes away: the
ground that issue 63's held copies (a copy submitted as a foreground job,
held open by a connection of gearhorn's) must be built on.

Measured on gearmand 1.1.20 (Debian 12), and read in its source
(libgearman-server/client.cc, gearman_server_client_free; gearmand_con.cc,
gearman_server_job_peek and _take), the same at its HEAD:

- the job stays counted in ``status`` but is marked ``ignore_job``: no
  worker is ever given it, and the next worker to look for that function
  frees it;
- a second SUBMIT_JOB with the same function and unique attaches to that
  job (the same handle) and does not revive it: it is freed all the same,
  and the new submitter is never answered;
- so a copy whose holding connection was lost must be submitted again
  under a unique of its own (its generation), never under the old one;
- GET_STATUS_UNIQUE tells a held job (one client) from an abandoned one
  (none), but not once something attached to the abandoned one.
"""

from __future__ import annotations

import gear
import pytest

from gearhorn.gearman import WorkerConnection

from .helpers import clients_waiting, queue_depth, unique_topic, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

@pytest.fixture
def gearmand(own_gearmand):  # this file's tests kill theirs, or read its jobs
    return own_gearmand


def submitter(server):
    client = gear.Client("holder")
    client.addServer(server.host, server.port)
    client.waitForServer(20)
    return client


def submit(client, function, unique, data=b"copy"):
    job = gear.Job(function.encode(), data, unique=unique.encode())
    client.submitJob(job, background=False)
    wait_for(lambda: job.handle is not None, 20, message="JOB_CREATED")
    return job


def grab_one(server, function):
    """What a worker is given for ``function`` now (None: nothing)."""
    worker = WorkerConnection(server.host, server.port, [function], "consumer")
    worker.open()
    try:
        jobs = worker.grab(1)
        for job in jobs:
            worker.complete(job.handle, b"done:" + job.data)
        worker.flush()
        return jobs[0] if jobs else None
    finally:
        worker.close()


def abandon(server, function, unique):
    """A foreground job submitted, then its submitter gone."""
    client = submitter(server)
    job = submit(client, function, unique)
    assert clients_waiting(server, unique) == (True, 1)
    client.shutdown()
    wait_for(lambda: clients_waiting(server, unique) == (True, 0), 20,
             message="gearmand to see the submitter gone")
    return job


def test_a_held_foreground_job_is_run_and_its_answer_reaches_the_holder(gearmand):
    function = unique_topic("held_")
    client = submitter(gearmand)
    try:
        job = submit(client, function, "m1")
        assert grab_one(gearmand, function).data == b"copy"
        wait_for(lambda: job.complete, 20, message="WORK_COMPLETE at the holder")
        assert b"".join(job.data) == b"done:copy"
    finally:
        client.shutdown()


def test_an_abandoned_foreground_job_stays_counted_but_is_never_run(gearmand):
    function = unique_topic("abandoned_")
    abandon(gearmand, function, "m1")
    assert queue_depth(gearmand, function) == 1  # still counted
    assert grab_one(gearmand, function) is None  # ... and freed instead of given
    assert queue_depth(gearmand, function) == 0
    assert clients_waiting(gearmand, "m1") == (False, 0)


def test_attaching_to_an_abandoned_job_does_not_revive_it(gearmand):
    function = unique_topic("attached_")
    first = abandon(gearmand, function, "m1")
    client = submitter(gearmand)
    try:
        again = submit(client, function, "m1")
        assert again.handle == first.handle  # attached, not a new job
        assert clients_waiting(gearmand, "m1") == (True, 1)  # looks held again
        assert grab_one(gearmand, function) is None  # freed all the same
        assert queue_depth(gearmand, function) == 0
        assert not again.complete  # and its new submitter is never answered
    finally:
        client.shutdown()


def test_a_copy_submitted_again_under_a_unique_of_its_own_is_run(gearmand):
    function = unique_topic("generation_")
    abandon(gearmand, function, "m1")
    client = submitter(gearmand)
    try:
        again = submit(client, function, "m1~2")  # its second generation
        job = grab_one(gearmand, function)  # the abandoned one is freed on the way
        assert job is not None and job.unique == "m1~2"
        wait_for(lambda: again.complete, 20, message="WORK_COMPLETE at the new holder")
        assert b"".join(again.data) == b"done:copy"
    finally:
        client.shutdown()
