"""The bridge's side of a topic's pen (gearhorn/stomp/topics/offsetlease.py, appending.py):
once an append brings it the pen, the bridge gives its SENDs their offsets
and hands them to its readers before any write; writes them in order;
gives the pen back when quiet, or when a worker waits for it."""

import gevent
import pytest

from gearhorn.rules.historypolicy import HistoryPolicy
from gearhorn.stomp.protocol.sendheaders import PLAIN
from gearhorn.stomp.topics import offsetlease
from gearhorn.stomp.topics.appending import HistoryFirst
from gearhorn.store import history as history_module
from gearhorn.store.history import History

pytestmark = pytest.mark.timeout(20)


class Feed:
    """The bridge's readers of one topic, as a TopicFeed keeps its place:
    handed messages in offset order, or told of none."""

    def __init__(self):
        self.epoch, self.last, self.got = None, 0, []

    def sending(self, topic, messages):
        return False

    def appended(self, topic, where, messages):
        epoch, first, last = where
        if self.epoch is None:
            self.epoch = epoch
        if epoch == self.epoch and first == self.last + 1:
            self.got += [(offset, m[0]) for offset, m in enumerate(messages, first)]
            self.last = last

    def not_appended(self, topic, messages):
        pass

    def worker_appended(self, topic):
        pass

    def at(self, topic):
        return self.epoch, self.last


@pytest.fixture
def history(registry):
    return History(registry.redis, registry.keys, HistoryPolicy(1000, 3600))


def pen_ended(first):
    if "news" in first.pens:
        first.pens["news"].greenlet.join(10)
    assert "news" not in first.pens


def stored(history):
    return [(m["offset"], m["message_id"]) for m in history.read("news")["messages"]]


def pen_in_redis(history):
    return history.redis.hget(history.keys.history_meta("news"), "pen")


def test_the_bridge_gives_offsets_with_its_pen_before_writing_them(history):
    feed = Feed()
    first = HistoryFirst(history, None, feed, caller="bridge-1")
    one = first.append("news", [b"a"], PLAIN)  # from Redis; the pen comes with it
    assert feed.got == [(1, one.message_ids[0])] and "news" in first.pens
    two = first.announce("news", [b"b", b"c"], PLAIN)
    three = first.announce("news", [b"d"], PLAIN)
    # Handed to the readers with their offsets; nothing written yet.
    assert feed.got[1:] == [(2, two.message_ids[0]), (3, two.message_ids[1]),
                            (4, three.message_ids[0])]
    assert stored(history) == [(1, one.message_ids[0])]
    first.store(three)  # written in the order given: two's first
    first.store(two)
    assert stored(history) == feed.got
    assert pen_in_redis(history) == b"bridge-1"


def test_a_quiet_pen_is_given_back_and_the_next_send_asks_again(history):
    feed = Feed()
    first = HistoryFirst(history, None, feed, caller="bridge-1")
    first.append("news", [b"a"], PLAIN)
    pen = first.pens["news"]
    pen.greenlet.join(10)  # IDLE with nothing to write
    assert "news" not in first.pens and pen_in_redis(history) is None
    first.append("news", [b"b"], PLAIN)
    assert "news" in first.pens and [o for o, _ in stored(history)] == [1, 2]


def test_a_worker_waits_for_the_pen_and_its_message_follows_the_bridges(
        history, monkeypatch):
    """A worker's append is refused while the bridge holds the pen; the
    bridge hears it is wanted in its next write's reply, gives it back at
    once, and the worker's message follows every offset the bridge gave;
    then, the topic having two writers, the bridge gets no pen for a while."""
    monkeypatch.setattr(history_module.time, "sleep", gevent.sleep)
    monkeypatch.setattr(offsetlease, "IDLE", 30.0)  # only 'wanted' gives it back here
    feed = Feed()
    first = HistoryFirst(history, None, feed, caller="bridge-1")
    first.append("news", [b"a"], PLAIN)
    worker = gevent.spawn(history.append, [("news", [("w", b"w", None)])], True)
    gevent.sleep(0.05)
    assert not worker.ready()  # refused, trying again
    first.append("news", [b"b"], PLAIN)  # given by the pen; its write's reply says 'wanted'
    worker.join(10)
    assert worker.value[0][1:] == (3, 3)
    assert [o for o, _ in stored(history)] == [1, 2, 3] and stored(history)[2][1] == "w"
    pen_ended(first)
    later = first.append("news", [b"c"], PLAIN)
    assert "news" not in first.pens and stored(history)[-1] == (4, later.message_ids[0])


@pytest.mark.parametrize("error", ["redis", "bug"])
def test_a_failed_write_costs_the_topic_its_epoch_not_a_wrong_offset(history, error):
    """The readers had offsets the write may not have stored: the next
    append from the bridge starts a new epoch, so no offset a reader holds
    ever names another message. Whatever failed (a bug too), the SEND
    waiting for the write is told, never left waiting."""
    import redis as redis_module

    failure = (redis_module.ConnectionError("Redis went away") if error == "redis"
               else ValueError("a bug"))
    feed = Feed()
    first = HistoryFirst(history, None, feed, caller="bridge-1")
    first.append("news", [b"a"], PLAIN)
    old_epoch = history.read("news")["epoch"]
    given = first.announce("news", [b"b"], PLAIN)
    real = history.direct.run_scripts

    def broken(calls):
        raise failure
    history.direct.run_scripts = broken
    with pytest.raises(type(failure)):
        first.store(given)
    history.direct.run_scripts = real
    pen_ended(first)
    after = first.append("news", [b"c"], PLAIN)
    kept = history.read("news")
    assert kept["epoch"] != old_epoch
    assert [(m["offset"], m["message_id"]) for m in kept["messages"]] == [
        (1, after.message_ids[0])]


def test_a_stopping_bridge_writes_what_it_gave_and_gives_its_pens_back(history, monkeypatch):
    monkeypatch.setattr(offsetlease, "IDLE", 30.0)
    feed = Feed()
    first = HistoryFirst(history, None, feed, caller="bridge-1")
    first.append("news", [b"a"], PLAIN)
    given = first.announce("news", [b"b"], PLAIN)  # its readers have it; not written yet
    first.give_back_pens(timeout=10)
    assert not first.pens and pen_in_redis(history) is None
    assert stored(history)[-1] == (2, given.message_ids[0])
    first.store(given)  # its write is done already


def test_a_feed_does_not_read_a_topic_its_bridge_alone_writes(history, monkeypatch):
    """While the bridge holds the pen and its feed has all the pen gave, no
    one else appends and every message reaches the feed by hand: it waits
    for the pen's release instead of reading. It reads again once the pen
    is given back, broken, or past its grant by the bridge's clock."""
    from gearhorn.stomp.topics.feeds import TopicFeeds

    monkeypatch.setattr(offsetlease, "IDLE", 30.0)
    streams = TopicFeeds(history)
    first = HistoryFirst(history, None, streams, caller="bridge-1")
    streams.own_pens = first.pens
    history.append([("news", [("w", b"w", None)])])  # a worker's, before
    reader_feed = streams.feeds["news"] = _idle_feed(history, streams)
    first.append("news", [b"a"], PLAIN)  # the pen comes with it
    pen = first.pens["news"]
    assert reader_feed.last == 2 and reader_feed._own_pen() is pen
    given = first.announce("news", [b"b"], PLAIN)  # handed over: still all it gave
    assert reader_feed.last == 3 and reader_feed._own_pen() is pen
    pen.last += 1  # given, not yet handed to this feed: read
    assert reader_feed._own_pen() is None
    pen.last -= 1
    pen.until = 0.0  # past the grant by the bridge's clock
    assert reader_feed._own_pen() is None
    pen.until = float("inf")
    first.store(given)
    pen.finish()  # given back
    pen.greenlet.join(10)
    assert pen.released.is_set() and reader_feed._own_pen() is None


def _idle_feed(history, streams):
    """A feed where the topic's history stands, its read loop not running
    (what this test drives is its choice whether to read)."""
    from gearhorn.stomp.topics.feeds import TopicFeed

    epoch, _, last = history.position("news")
    feed = TopicFeed(history, "news", streams._idle, epoch, last, streams.own_pens)
    feed.stopped = True
    gevent.sleep(0)  # its loop sees it stopped, and ends
    feed.stopped = False
    return feed
