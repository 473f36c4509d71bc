"""A process's held copies (gearhorn/store/holding.py) with its gearmand
connections faked: what it hands where, and again, after which answer."""

from __future__ import annotations

import types

import fakeredis
import pytest

from gearhorn import gearman
from gearhorn.rules.naming import GIVEN_BACK
from gearhorn.store import holding
from gearhorn.store.heldcopies import HeldCopies
from gearhorn.store.holders import Holders
from gearhorn.store.keys import Keys

pytestmark = pytest.mark.timeout(30)


class FakeHolder:
    """One fake connection: what was handed on it, at what precedence."""

    made: list[FakeHolder] = []

    def __init__(self, host, port, answered, on_lost, tls=None, vanished=None, client_id=""):
        self.port, self.answered, self.on_lost = port, answered, on_lost
        self.handed: list[tuple[str, str]] = []  # (unique, precedence)
        self.broken = ""
        self.conn = types.SimpleNamespace(open=lambda: None, host=host, port=port)
        FakeHolder.made.append(self)

    def hold(self, copies, precedence="normal", ask_after=False):
        self.handed += [(c.unique, precedence) for c in copies]
        self.copies = list(copies)
        return {}

    def live(self):
        return [u for u, _ in self.handed]

    def close(self, reason="", expected=False):
        self.broken = reason

    def probe(self, every, timeout=1.5):
        pass


class FakeClient:
    def __init__(self, ports, home=0):
        self.connections = [types.SimpleNamespace(host="127.0.0.1", port=p) for p in ports]
        self._home = home

    def home(self, queue):
        return self._home


@pytest.fixture
def holder(monkeypatch):
    FakeHolder.made = []
    monkeypatch.setattr(holding, "Holder", FakeHolder)

    def make(ports=(1,), home=0):
        redis = fakeredis.FakeRedis()
        held = holding.HoldingClient(FakeClient(ports, home), HeldCopies(redis, Keys()),
                                     Holders(redis, Keys()), "w1", ttl=6, interval=2)
        held.lease.register()
        return held
    return make


def copies(*uniques):
    return [gearman.Copy("news_alice", u, u.encode()) for u in uniques]


def test_copies_a_bridge_gives_back_are_handed_again_first_in_line_and_in_order(holder):
    held = holder()
    held.submit_background(copies("m1:alice", "m2:alice", "m3:alice"))
    (conn,) = FakeHolder.made
    assert conn.handed == [("m1:alice^0", "normal"), ("m2:alice^0", "normal"),
                           ("m3:alice^0", "normal")]
    for copy in conn.copies[:2]:  # the bridge's client left m1 and m2 unacked
        held._answered_by(copy, gearman.Outcome("exception", GIVEN_BACK))
    held._forget()
    held.later.hand_given_back()
    assert conn.handed[3:] == [("m1:alice^1", "high"), ("m2:alice^1", "high")]
    assert held.store.count("news_alice") == 3  # given back is not answered: all kept


def test_an_answer_other_than_given_back_forgets_the_copy(holder):
    held = holder()
    held.submit_background(copies("m1:alice", "m2:alice"))
    (conn,) = FakeHolder.made
    held._answered_by(conn.copies[0], gearman.Outcome("exception", b"a worker's own error"))
    held._answered_by(conn.copies[1], gearman.Outcome("complete"))
    held._forget()
    held.later.hand_given_back()
    assert held.store.count("news_alice") == 0 and len(conn.handed) == 2


def test_while_a_copys_home_is_away_it_goes_to_a_server_that_is_up(holder):
    held = holder(ports=(1, 2), home=0)
    held.gearmands.lose(0)  # the home server's connection broke
    held.submit_background(copies("m1:alice"))
    assert [(h.port, h.handed) for h in FakeHolder.made] == [(2, [("m1:alice^0", "normal")])]
    held.gearmands.lose(1)  # every server away: the copy waits in Redis
    held.submit_background(copies("m2:alice"))
    assert sum(len(h.handed) for h in FakeHolder.made) == 1
    assert held.store.count("news_alice") == 2


def test_a_server_back_gets_only_the_copies_no_connection_holds(holder):
    held = holder(ports=(1, 2), home=0)
    held.gearmands.lose(0)
    held.gearmands.lose(1)
    held.submit_background(copies("m1:alice"))  # waits: nobody is up
    held.gearmands.lost.discard(1)
    held.submit_background(copies("m2:alice"))  # to server 2, while 1 is away
    held._hand_again()  # server 1 takes a connection again
    back = [h for h in FakeHolder.made if h.port == 1]
    assert [u for h in back for u, _ in h.handed] == ["m1:alice^1"]  # not m2: 2 holds it


def answer_in_thread(held, copy, outcome):
    """The receiver's answer, from another thread (as a holder's reader)."""
    import threading
    thread = threading.Thread(target=held._answered_by, args=(copy, outcome))
    thread.start()
    return thread


def test_a_foreground_fanout_waits_for_its_held_copies_answers_in_order(holder):
    held = holder()
    placed = held.start_foreground(copies("m1:alice", "m2:alice"))
    (conn,) = FakeHolder.made
    assert [u for u, _ in conn.handed] == ["m1:alice^0", "m2:alice^0"]
    threads = [answer_in_thread(held, conn.copies[1], gearman.Outcome("complete", b"two")),
               answer_in_thread(held, conn.copies[0], gearman.Outcome("failed"))]
    outcomes = placed.wait(10)
    for thread in threads:
        thread.join()
    assert [(o.status, o.data) for o in outcomes] == [("failed", b""), ("complete", b"two")]
    held._forget()
    assert held.store.count("news_alice") == 0 and not held._waiting


def test_a_held_foreground_copy_not_answered_in_time_stays_held(holder):
    held = holder()
    (outcome,) = held.submit_foreground(copies("m1:alice"), timeout=0.01)
    assert outcome.status == "timeout"
    assert held.store.count("news_alice") == 1 and not held._waiting
    (conn,) = FakeHolder.made
    held._answered_by(conn.copies[0], gearman.Outcome("complete"))  # it came later
    held._forget()
    assert held.store.count("news_alice") == 0


def test_a_foreground_copy_handed_again_still_reaches_its_fanout(holder):
    held = holder()
    placed = held.start_foreground(copies("m1:alice"))
    (first,) = FakeHolder.made
    first.broken = "gearmand restarted"
    first.on_lost(first.copies, "gearmand restarted")
    held._hand_again()  # the server takes a connection again: the next generation
    second = FakeHolder.made[-1]
    assert [u for u, _ in second.handed] == ["m1:alice^1"]
    thread = answer_in_thread(held, second.copies[0], gearman.Outcome("complete", b"ok"))
    (outcome,) = placed.wait(10)
    thread.join()
    assert (outcome.status, outcome.data) == ("complete", b"ok")


def test_a_foreground_copy_tried_again_after_a_failure_is_held_again(holder):
    held = holder()
    placed = held.start_foreground(copies("m1:alice"))
    (conn,) = FakeHolder.made
    held._answered_by(conn.copies[0], gearman.Outcome("failed"))
    assert placed.wait(10)[0].status == "failed"
    # The retry comes before the holding thread forgot the answered record:
    # it is forgotten first, so the new record is written and handed.
    again = held.start_foreground(copies("m1:alice"))
    assert [u for u, _ in conn.handed] == ["m1:alice^0", "m1:alice^0"]
    held._answered_by(conn.copies[0], gearman.Outcome("complete"))
    assert again.wait(10)[0].status == "complete"


def test_a_held_foreground_copy_gearmand_refuses_is_told_at_once_and_stays_held(holder):
    held = holder()
    placed = held.start_foreground(copies("m1:alice"))
    (conn,) = FakeHolder.made
    held._answered_by(conn.copies[0], gearman.Outcome("refused", reason="queue full"))
    (outcome,) = placed.wait(10)  # not the fanout's whole timeout
    assert (outcome.status, outcome.reason) == ("refused", "queue full")
    held._forget()
    assert held.store.count("news_alice") == 1  # handed again in a while
    held.later.hand_due()
    assert conn.handed[-1] == ("m1:alice^1", "normal")


def test_a_holder_stopping_waits_for_a_taker_only_while_one_lives(holder):
    """A pool stopping at once: each holder retires and waits for another to
    take its copies over, but not for one that is itself retiring (each then
    waited a whole ttl: ten-second teardowns in the suite)."""
    import threading

    redis = fakeredis.FakeRedis()
    keys = Keys()

    def made(name):
        held = holding.HoldingClient(FakeClient((1,)), HeldCopies(redis, keys),
                                     Holders(redis, keys), name, ttl=60, interval=2)
        held.lease.register()
        return held
    first, second = made("w1"), made("w2")
    assert Holders(redis, keys).others_alive(first.holder_id) == 1
    stopping = threading.Thread(target=first.stop)
    stopping.start()
    stopping.join(0.5)
    assert stopping.is_alive()  # the second lives: it may take the first's copies over
    second.stop()  # retires too, and waits for nobody
    stopping.join(30)
    assert not stopping.is_alive()  # not the 60 s ttl
    assert Holders(redis, keys).others_alive(first.holder_id) == 0


def keep_that_breaks(held, monkeypatch, writes: bool):
    """The store's next keep fails as a Redis node going mid-call does: with
    its records written (``writes``) or not."""
    import redis
    keep = held.store.keep

    def broken(some):
        monkeypatch.setattr(held.store, "keep", keep)
        if writes:
            keep(some)
        raise redis.ConnectionError("the node went mid-call")
    monkeypatch.setattr(held.store, "keep", broken)


@pytest.mark.parametrize("written_before", [True, False])
def test_a_fanout_retried_after_its_write_broke_makes_one_job_per_copy(
        holder, monkeypatch, written_before):
    """The CI failure of 2026-12-07: a cluster master killed mid-keep, the
    fanout retried, and every copy handed under two generations."""
    import redis
    held = holder()
    keep_that_breaks(held, monkeypatch, writes=written_before)
    with pytest.raises(redis.ConnectionError):
        held.submit_background(copies("m1:alice", "m2:alice"))
    held.submit_background(copies("m1:alice", "m2:alice"))  # the worker's retry
    held.later.hand_due()
    handed = [u for h in FakeHolder.made for u, _ in h.handed]
    assert sorted(handed) == ["m1:alice^0", "m2:alice^0"]
    assert held.store.count("news_alice") == 2


def test_a_copy_the_retry_handed_and_its_receiver_answered_is_not_handed_again(
        holder, monkeypatch):
    """The live STOMP subscriber of the same CI test: the retried fanout's
    copy was answered, its record not yet dropped (Redis was failing over),
    when the holder handed its unhanded copies."""
    import redis
    held = holder()
    keep_that_breaks(held, monkeypatch, writes=False)
    with pytest.raises(redis.ConnectionError):
        held.submit_background(copies("m1:alice"))
    held.submit_background(copies("m1:alice"))  # the retry writes and hands it
    (conn,) = FakeHolder.made
    held._answered_by(conn.copies[0], gearman.Outcome("complete"))  # not forgotten yet
    held.later.hand_due()
    assert [u for u, _ in conn.handed] == ["m1:alice^0"]
