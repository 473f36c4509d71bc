"""gearhorn/gearman/holder.py on a real gearmand: copies held as foreground
jobs, each answer reported once with what the receiver said, and every
copy not answered reported lost when the connection goes (gearmand killed,
or the holder closed), so that it can be placed again."""

from __future__ import annotations

import threading

import pytest

from gearhorn.gearman import Copy, Holder, Unavailable, WorkerConnection

from .helpers import clients_waiting, queue_depth, unique_topic, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def gearmand(own_gearmand):  # this file's tests kill theirs, or read its jobs
    return own_gearmand


class Heard:
    """What a holder reported."""

    def __init__(self):
        self.lock = threading.Lock()
        self.answers, self.lost = [], []

    def answered(self, copy, outcome):
        with self.lock:
            self.answers.append((copy.unique, outcome.status, outcome.data or outcome.reason))

    def on_lost(self, copies, reason):
        with self.lock:
            self.lost.append((sorted(c.unique for c in copies), reason))


def holder_on(server, heard):
    return Holder(server.host, server.port, heard.answered, heard.on_lost)


def consume(server, function, count, answer):
    """A receiver: takes ``count`` jobs and answers each with ``answer(worker, job)``."""
    worker = WorkerConnection(server.host, server.port, [function], "receiver")
    worker.open()
    taken = []
    try:
        while len(taken) < count:
            jobs = worker.grab(count - len(taken))
            for job in jobs:
                answer(worker, job)
            worker.flush()
            taken += jobs
            if not jobs:
                wait_for(lambda: queue_depth(server, function) > 0, 20, message="more jobs")
    finally:
        worker.close()
    return taken


def test_each_answer_is_reported_with_what_the_receiver_said(gearmand):
    heard, function = Heard(), unique_topic("q_")
    holder = holder_on(gearmand, heard)
    copies = [Copy(function, f"m{i}", f"body{i}".encode()) for i in range(3)]
    holder.hold(copies)
    assert holder.held() == 3 and queue_depth(gearmand, function) == 3

    def answer(worker, job):
        n = int(job.unique[1:])
        if n == 0:
            worker.complete(job.handle, b"ok:" + job.data)
        elif n == 1:
            worker.fail(job.handle)
        else:
            worker.warn(job.handle, b"receiver broke")
            worker.fail(job.handle)
    consume(gearmand, function, 3, answer)
    wait_for(lambda: len(heard.answers) == 3, 20, message="three answers")
    assert sorted(heard.answers) == [("m0", "complete", b"ok:body0"),
                                     ("m1", "failed", "job failed"),
                                     ("m2", "failed", "receiver broke")]
    assert holder.held() == 0
    holder.close()
    assert heard.lost == [([], "closed")]  # nothing held when it let go


def test_a_killed_gearmand_reports_every_copy_not_answered(gearmand):
    heard, function = Heard(), unique_topic("q_")
    holder = holder_on(gearmand, heard)
    holder.hold([Copy(function, f"m{i}", b"x") for i in range(5)])
    consume(gearmand, function, 2, lambda w, job: w.complete(job.handle, b"done"))
    wait_for(lambda: len(heard.answers) == 2, 20, message="two answers")
    gearmand.kill()
    wait_for(lambda: heard.lost, 20, message="the loss reported")
    [(lost, reason)] = heard.lost
    answered = {u for u, _, _ in heard.answers}
    assert set(lost) == {f"m{i}" for i in range(5)} - answered and len(lost) == 3
    assert reason
    with pytest.raises(Unavailable, match="is gone"):
        holder.hold([Copy(function, "m9", b"x")])  # one connection's life: a new holder


def test_a_closed_holder_reports_its_jobs_lost_and_gearmand_drops_them(gearmand):
    """What was held on a connection that went is never run: the reason it
    is reported lost, to be placed again under a unique of its own."""
    heard, function = Heard(), unique_topic("q_")
    holder = holder_on(gearmand, heard)
    holder.hold([Copy(function, "m1", b"x")])
    holder.close("worker stopping")
    assert heard.lost == [(["m1"], "worker stopping")]
    wait_for(lambda: clients_waiting(gearmand, "m1") == (True, 0), 20,
             message="gearmand to see the holder gone")
    worker = WorkerConnection(gearmand.host, gearmand.port, [function], "receiver")
    worker.open()
    try:
        wait_for(lambda: not worker.grab(1) and queue_depth(gearmand, function) == 0, 20,
                 message="gearmand to drop the abandoned job")
    finally:
        worker.close()


def test_a_copy_gearmand_refuses_is_reported_refused_and_the_rest_are_held(gearmand):
    """gearmand answers ERROR instead of JOB_CREATED for a job over the
    function's ``maxqueue``: that copy is reported ``refused`` with
    gearmand's words, and the holder keeps the others."""
    from gearhorn.gearman import admin

    heard, function = Heard(), unique_topic("q_")
    holder = holder_on(gearmand, heard)
    holder.hold([Copy(function, "m1", b"x")])  # the function exists: it can be bounded
    assert admin(gearmand.host, gearmand.port, f"maxqueue {function} 1") == ["OK"]
    holder.hold([Copy(function, "m2", b"x")])
    assert holder.held() == 1
    [(unique, status, reason)] = heard.answers
    assert (unique, status) == ("m2", "refused") and "gearmand refused it" in reason
    holder.close()
    assert heard.lost == [(["m1"], "closed")]


def test_an_attach_says_whether_it_joined_the_job_or_made_it_again(gearmand):
    """A taker's attach (the same unique from a second connection) asks
    after the job in the same write: two clients when it joined the live
    job; one, its own, when the job had been answered just before and the
    submission made it again (docs/design/held-copies.rst, "The bounds")."""
    function = unique_topic("q_")
    owner, taker = holder_on(gearmand, Heard()), holder_on(gearmand, Heard())
    owner.hold([Copy(function, "m1", b"x")])
    assert taker.hold([Copy(function, "m1", b"x")], ask_after=True) == {"m1": (True, 2)}
    (job,) = consume(gearmand, function, 1, lambda worker, job: worker.complete(job.handle))
    assert job.unique == "m1"
    assert taker.hold([Copy(function, "m1", b"x")], ask_after=True) == {"m1": (True, 1)}
    owner.close()
    taker.close()
