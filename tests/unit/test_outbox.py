"""A connection's topic SENDs in flight (gearhorn/stomp/sessions/outbox.py), under
gevent with a publisher whose jobs answer when the test says: one job at a
time, in order, the SENDs that waited leaving together, RECEIPTs after
their job, and a failed job ending it all."""

import time

import gevent
import gevent.event
import pytest

from gearhorn.stomp.protocol.frames import Frame
from gearhorn.stomp.protocol.sendheaders import PLAIN, SendOptions, TopicSend
from gearhorn.stomp.queues.publisher import FanoutFailed
from gearhorn.stomp.sessions.outbox import LINGER_MOST, Outbox

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
        self.appended, self.abandoned = [], []

    def append(self, send):
        if send.to_append:
            send.to_append = False
            self.appended.append(list(send.message_ids))

    def abandon(self, send):
        if send.to_append:
            send.to_append = False
            self.abandoned.append(list(send.message_ids))

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
                    max_bytes=1000, most_held=5, linger=1.0)
    outbox.pauses, outbox.woken = [], []  # each linger, and whether a SEND ended it

    def pause(event, seconds):
        outbox.pauses.append(seconds)
        outbox.woken.append(event.wait(seconds))  # True: set before the linger ran out

    outbox.pause = pause
    return outbox, publisher, answered, failed


def put(outbox, body, topic="news", options=PLAIN):
    outbox.put(TopicSend(topic, [body], options), [Frame("SEND", {}, body)])


def put_announced(outbox, *bodies, early=True):
    """A SEND to a topic with history, given its ids, its live readers told."""
    send = TopicSend("news", list(bodies), PLAIN, [f"id-{b.decode()}" for b in bodies],
                     to_append=True, taken_early=early)
    outbox.put(send, [Frame("SEND", {}, body) for body in bodies])


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


def test_a_lone_send_taken_early_is_appended_later_with_what_came_meanwhile(box):
    outbox, publisher, answered, _ = box
    put_announced(outbox, b"1")
    gevent.sleep(0.01)  # within the linger: not appended yet
    assert publisher.appended == [] and outbox.busy
    put_announced(outbox, b"2", early=False)  # behind one not appended: waits too
    put_announced(outbox, b"3", b"4")
    wait_for(lambda: publisher.appended)
    assert publisher.appended == [["id-1", "id-2", "id-3", "id-4"]]  # one append, in order
    assert outbox.pauses == [1.0]
    wait_for(lambda: publisher.jobs)
    publisher.jobs[0].answer.set({})
    outbox.flush()
    assert answered == [[b"1", b"2", b"3", b"4"]]


def test_the_next_send_ends_a_lingering_ones_wait(box):
    outbox, publisher, _, _ = box
    put_announced(outbox, b"1")
    gevent.sleep(0.01)
    assert publisher.appended == []
    put_announced(outbox, b"2")  # lone and taken early too: it does not wait again
    wait_for(lambda: publisher.appended)
    assert publisher.appended == [["id-1", "id-2"]]
    assert outbox.pauses == [1.0]
    assert outbox.woken == [True]  # ended by the SEND, not by the linger's 1.0 s


def test_a_lone_send_with_none_after_it_is_appended_when_the_linger_ends(box):
    outbox, publisher, _, _ = box
    began = time.monotonic()
    put_announced(outbox, b"1")
    wait_for(lambda: publisher.appended)
    assert publisher.appended == [["id-1"]] and time.monotonic() - began >= 0.99


def test_a_send_nobody_took_early_is_appended_at_once(box):
    outbox, publisher, answered, _ = box
    put_announced(outbox, b"1", early=False)
    assert publisher.appended == [["id-1"]]  # before the session reads on
    wait_for(lambda: publisher.jobs)
    publisher.jobs[0].answer.set({})
    outbox.flush()
    assert answered == [[b"1"]] and outbox.pauses == []


def test_a_few_sends_read_together_linger_as_a_lone_one(box):
    """A producer at a few thousand msg/s: its next SENDs do not wait for the append."""
    outbox, publisher, _, _ = box
    put_announced(outbox, *(b"%d" % n for n in range(1, LINGER_MOST + 1)))
    gevent.sleep(0.01)
    assert publisher.appended == []
    put_announced(outbox, b"9")
    wait_for(lambda: publisher.appended)
    assert publisher.appended == [[f"id-{n}" for n in (*range(1, LINGER_MOST + 1), 9)]]


def test_many_sends_read_together_are_appended_at_once_even_if_taken_early(box):
    """A busy producer's SENDs: the linger would cost throughput, not save latency."""
    outbox, publisher, _, _ = box
    put_announced(outbox, *(b"%d" % n for n in range(1, LINGER_MOST + 2)))
    assert publisher.appended == [[f"id-{n}" for n in range(1, LINGER_MOST + 2)]]
    wait_for(lambda: publisher.jobs)
    publisher.jobs[0].answer.set({})
    outbox.flush()
    assert outbox.pauses == []


def test_sends_dropped_after_a_failure_are_abandoned_not_appended(box):
    outbox, publisher, _, failed = box
    put_announced(outbox, b"1", early=False)
    wait_for(lambda: publisher.jobs)
    put_announced(outbox, b"2")  # lingers behind the failing job
    publisher.jobs[0].answer.set_exception(FanoutFailed("fanout to news failed: timeout"))
    outbox.flush()
    put_announced(outbox, b"3", early=False)  # after the failure
    assert failed == [(b"1", "fanout to news failed: timeout")]
    assert publisher.appended == [["id-1"]]
    assert publisher.abandoned == [["id-2"], ["id-3"]]


def test_an_append_that_fails_at_once_is_the_sessions_error(box):
    outbox, publisher, answered, failed = box

    def append(send):
        raise ConnectionError("redis is down")

    publisher.append = append
    with pytest.raises(ConnectionError):
        put_announced(outbox, b"1", early=False)
    assert not outbox.busy and publisher.jobs == []


def test_an_append_that_fails_later_fails_the_connection(box):
    outbox, publisher, answered, failed = box

    def append(send):
        raise ConnectionError("redis is down")

    publisher.append = append
    put_announced(outbox, b"1")
    outbox.flush()
    assert failed == [(b"1", "redis is down")] and answered == [] and publisher.jobs == []
