"""A connection's topic SENDs in flight (gearhorn/stomp/outbox.py), under
gevent with a publisher whose jobs answer when the test says: one job at a
time, in order, the SENDs that waited leaving together, RECEIPTs after
their job, and a failed job ending it all."""

import gevent
import gevent.event
import pytest

from gearhorn.stomp.backend import FanoutFailed
from gearhorn.stomp.frames import Frame
from gearhorn.stomp.outbox import Outbox
from gearhorn.stomp.sending import PLAIN, SendOptions, TopicSend

pytestmark = pytest.mark.timeout(10)


class Job:
    def __init__(self, send):
        self.send = send
        self.answer = gevent.event.AsyncResult()

    def wait(self):
        return self.answer.get()


class Publisher:
    """Records each job; a job waits until the test answers it."""

    def __init__(self):
        self.jobs = []

    def start(self, client, send):
        self.jobs.append(Job(TopicSend(send.topic, list(send.bodies), send.options,
                                       send.message_ids)))
        return self.jobs[-1]


def wait_for(condition):
    while not condition():
        gevent.sleep(0.001)


@pytest.fixture
def box():
    publisher, answered, failed = Publisher(), [], []
    outbox = Outbox(publisher, lambda: None,
                    lambda frames, result: answered.append([f.body for f in frames]),
                    lambda frame, exc: failed.append((frame.body, str(exc))),
                    max_bytes=1000, most_held=5)
    return outbox, publisher, answered, failed


def put(outbox, body, topic="news", options=PLAIN):
    outbox.put(TopicSend(topic, [body], options), [Frame("SEND", {}, body)])


def test_sends_made_while_a_job_runs_leave_together_in_order(box):
    outbox, publisher, answered, _ = box
    put(outbox, b"1")
    wait_for(lambda: len(publisher.jobs) == 1)
    for body in (b"2", b"3", b"4"):
        put(outbox, body)
    assert outbox.busy and answered == []
    publisher.jobs[0].answer.set({})
    wait_for(lambda: len(publisher.jobs) == 2)
    assert answered == [[b"1"]]
    assert publisher.jobs[1].send.bodies == [b"2", b"3", b"4"]
    publisher.jobs[1].answer.set({})
    outbox.flush()
    assert answered == [[b"1"], [b"2", b"3", b"4"]] and not outbox.busy


def test_only_what_one_job_may_carry_goes_together(box):
    outbox, publisher, answered, _ = box
    put(outbox, b"first")
    wait_for(lambda: len(publisher.jobs) == 1)
    put(outbox, b"a")
    put(outbox, b"b", topic="sport")  # another topic
    put(outbox, b"c", topic="sport", options=SendOptions(priority="high"))  # other options
    put(outbox, b"x" * 1000, topic="sport", options=SendOptions(priority="high"))  # too big
    for job in range(5):
        wait_for(lambda job=job: len(publisher.jobs) > job)
        publisher.jobs[job].answer.set({})
    outbox.flush()
    assert [(j.send.topic, j.send.bodies) for j in publisher.jobs] == [
        ("news", [b"first"]), ("news", [b"a"]), ("sport", [b"b"]), ("sport", [b"c"]),
        ("sport", [b"x" * 1000])]
    assert answered == [[b"first"], [b"a"], [b"b"], [b"c"], [b"x" * 1000]]


def test_ids_given_at_send_travel_with_their_messages():
    joined = TopicSend("news", [b"1"], PLAIN, ["id1"])
    assert joined.take(TopicSend("news", [b"2", b"3"], PLAIN, ["id2", "id3"]), 100)
    assert joined.bodies == [b"1", b"2", b"3"] and joined.message_ids == ["id1", "id2", "id3"]
    # Appended to the history or not: never one job (its ids would not say which).
    assert not joined.take(TopicSend("news", [b"4"]), 100)


def test_a_full_outbox_holds_the_sender_back_until_a_job_is_answered(box):
    outbox, publisher, answered, _ = box
    put(outbox, b"1")
    wait_for(lambda: len(publisher.jobs) == 1)
    for body in b"2345":
        put(outbox, bytes([body]))
    blocked = gevent.spawn(put, outbox, b"6")
    gevent.sleep(0.05)
    assert not blocked.ready()  # five held: the sixth waits
    publisher.jobs[0].answer.set({})
    blocked.join()
    publisher.jobs[1].answer.set({})
    wait_for(lambda: len(publisher.jobs) == 3)
    assert [j.send.bodies for j in publisher.jobs] == [[b"1"], [b"2", b"3", b"4", b"5"],
                                                       [b"6"]]


def test_a_failed_job_is_told_and_the_sends_behind_it_are_dropped(box):
    outbox, publisher, answered, failed = box
    put(outbox, b"1")
    wait_for(lambda: len(publisher.jobs) == 1)
    put(outbox, b"2")
    publisher.jobs[0].answer.set_exception(FanoutFailed("fanout to news failed: timeout"))
    outbox.flush()
    assert failed == [(b"1", "fanout to news failed: timeout")]
    assert answered == [] and len(publisher.jobs) == 1
    put(outbox, b"3")  # the connection is ending: nothing more goes
    assert len(publisher.jobs) == 1 and not outbox.busy


def test_a_job_that_cannot_start_fails_the_same_way(box):
    outbox, publisher, _, failed = box

    def refuse(client, send):
        raise ConnectionError("no gearmand")

    publisher.start = refuse
    put(outbox, b"1")
    outbox.flush()
    assert failed == [(b"1", "no gearmand")]
