"""A topic's pen (lua/history_append.lua, lua/history_pen.lua): one caller
at a time gives the topic's offsets itself; the others wait until it is
given back, and a pen that lapsed unreturned costs the topic its epoch."""

import pytest

from gearhorn.rules.historypolicy import HistoryPolicy
from gearhorn.store import history as history_module
from gearhorn.store.history import LOST, NO_PEN, REFUSED, History, PenArgs

pytestmark = pytest.mark.timeout(10)

BRIDGE, OTHER = "bridge-1", "bridge-2"


@pytest.fixture
def history(registry):
    return History(registry.redis, registry.keys, HistoryPolicy(1000, 3600))


def entries(*names):
    return [(name, name.encode(), None) for name in names]


def append(history, names, pen=NO_PEN):
    """One append call, its reply as Redis gave it (no retry)."""
    (call,) = history.calls([("news", entries(*names))], pen=pen)
    (reply,) = history.direct.run_scripts([call])
    return reply


def stored(history):
    return [(m["offset"], m["message_id"]) for m in history.read("news")["messages"]]


def meta(history):
    return history.redis.hgetall(history.keys.history_meta("news"))


def test_the_holder_writes_the_offsets_it_gave_and_others_wait_for_it(history):
    """A bridge asks for the pen with an append and gets it; it gives the
    next offsets itself and writes them; a worker's append meanwhile is
    refused and marks the pen wanted, which the holder hears in its next
    reply; given back, the worker's append follows the holder's, and no
    pen is granted for a while (the topic has several writers)."""
    first = append(history, ["a"], PenArgs(BRIDGE, 0, 5000))
    epoch = first[0]
    assert first[1:] == [1, 1, b"held"]
    assert append(history, ["b", "c"], PenArgs(BRIDGE, 2, 5000))[1:] == [2, 3, b"held"]
    refused = append(history, ["w"])
    assert refused[1] == REFUSED and stored(history) == [(1, "a"), (2, "b"), (3, "c")]
    assert append(history, ["d"], PenArgs(BRIDGE, 4, 5000))[1:] == [4, 4, b"wanted"]
    assert history.give_back("news", BRIDGE, 5000)
    assert not history.give_back("news", BRIDGE, 5000)  # once
    assert append(history, ["w"])[1:] == [5, 5, b""]
    assert append(history, ["e"], PenArgs(BRIDGE, 0, 5000))[1:] == [6, 6, b""]  # calm
    assert history.read("news")["epoch"] == epoch.decode()
    assert stored(history)[-3:] == [(4, "d"), (5, "w"), (6, "e")]


def test_a_write_with_offsets_it_does_not_hold_is_refused_whole(history):
    """Offsets given by a caller without the pen, or not next in the
    history, are not written (LOST): what its readers had would not be
    what the history says."""
    append(history, ["a"], PenArgs(BRIDGE, 0, 5000))
    assert append(history, ["x"], PenArgs(BRIDGE, 5, 5000))[1] == LOST
    assert append(history, ["y"], PenArgs(OTHER, 2, 5000))[1] == REFUSED  # held by another
    assert stored(history) == [(1, "a")]


def test_a_pen_that_lapsed_unreturned_costs_the_topic_its_epoch(history):
    """The holder may have given offsets it never wrote (it died): the next
    caller starts a new epoch, so a reader's offsets never point at another
    message; the old holder's late write is LOST."""
    old_epoch = append(history, ["a"], PenArgs(BRIDGE, 0, 5000))[0]
    history.redis.hset(history.keys.history_meta("news"), "pen_until", 0)  # lapsed
    taken = append(history, ["b"], PenArgs(OTHER, 0, 5000))
    assert taken[0] != old_epoch and taken[1:] == [1, 1, b"held"]
    assert append(history, ["late"], PenArgs(BRIDGE, 2, 5000))[1] == REFUSED
    assert stored(history) == [(1, "b")]


def test_a_holder_whose_write_failed_starts_a_new_epoch(history):
    """given -1: the holder's write failed after its readers had the
    offsets; whatever Redis got, the topic starts again in a new epoch."""
    old_epoch = append(history, ["a"], PenArgs(BRIDGE, 0, 5000))[0]
    append(history, ["b"], PenArgs(BRIDGE, 2, 5000))
    again = append(history, ["c"], PenArgs(BRIDGE, -1, 5000))
    assert again[0] != old_epoch and again[1:] == [1, 1, b"held"]
    assert stored(history) == [(1, "c")]
    # Another caller's -1 does nothing to a pen it does not hold.
    assert append(history, ["d"], PenArgs(OTHER, -1, 0))[1] == REFUSED


def test_a_refused_append_is_made_again_until_the_pen_is_given_back(history, monkeypatch):
    """Plan.settle (the workers' appends, and a bridge's without the pen)
    waits, a growing pause at a time, until the holder gives it back."""
    append(history, ["a"], PenArgs(BRIDGE, 0, 5000))
    pauses = []

    def pause(seconds):
        pauses.append(seconds)
        if len(pauses) == 3:
            history.give_back("news", BRIDGE, 5000)
    monkeypatch.setattr(history_module.time, "sleep", pause)
    (where,) = history.append([("news", entries("w"))], once_each=True)
    assert where[1:] == (2, 2) and stored(history) == [(1, "a"), (2, "w")]
    assert pauses == sorted(pauses) and pauses[0] < pauses[-1]
    assert b"pen" not in meta(history)
