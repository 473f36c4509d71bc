"""A queue dispatcher moves the messages it gives up on to the dead-letter
queue in the order it gave them up, however long each move takes."""

from types import SimpleNamespace

import gevent
import gevent.event
import pytest

from gearhorn.stomp.queues.dispatchers import QueueDispatcher

pytestmark = pytest.mark.timeout(30)


def given_up(handle):
    return SimpleNamespace(tracked=False, job=SimpleNamespace(handle=handle))


def test_dead_letters_are_moved_in_the_order_they_were_given_up(caplog):
    slow_first = gevent.event.Event()  # Redis slow for the first one only
    moved = []

    def dead_letter(delivery, reason):
        if delivery.job.handle == "H1":
            slow_first.wait(10)
        if delivery.job.handle == "H3":
            raise RuntimeError("a bug in one move")
        moved.append((delivery.job.handle, reason))

    dispatcher = QueueDispatcher("q", (), "c", lambda d: None, dead_letter=dead_letter)
    for handle in ("H1", "H2", "H3", "H4"):
        dispatcher._dead_letter_later(given_up(handle), "rejected")
    gevent.sleep(0.05)
    assert moved == []  # H2 waits behind H1
    slow_first.set()
    with gevent.Timeout(10):
        while len(moved) < 3:
            gevent.sleep(0.01)
    assert moved == [("H1", "rejected"), ("H2", "rejected"), ("H4", "rejected")]
    assert "q: dead-lettering H3" in caplog.text  # the bug is logged, naming its job
    dispatcher._dead_letter_later(given_up("H5"), "expired")  # a new mover, after the last
    with gevent.Timeout(10):
        while len(moved) < 4:
            gevent.sleep(0.01)
    assert moved[-1] == ("H5", "expired")
