"""A stream reader catching up from history (gearhorn/stomp/topics/streams.py),
on fakeredis: offsets in order, each once, and a history lost meanwhile
seen on the next page."""

import pytest

from gearhorn.rules.historypolicy import HistoryPolicy
from gearhorn.stomp.topics.streams import StreamReader
from gearhorn.store.history import History

pytestmark = pytest.mark.timeout(10)


class Feed:
    """The reader's feed: caught up as soon as history has nothing more."""

    topic = "news"

    def __init__(self, history):
        self.history = history
        self.joined = 0

    def join(self, reader):
        self.joined += 1
        return True

    def leave(self, reader):
        pass


class Consumer:
    def __init__(self):
        self.got = []

    def credit(self):
        return 2  # pages of two: the reader reads again and again

    def deliver(self, delivery):
        self.got.append((delivery.body, delivery.extra))


def append(history, *bodies):
    history.append([("news", [(f"id-{body}", body, None) for body in bodies])])


@pytest.fixture
def history(registry):
    return History(registry.redis, registry.keys, HistoryPolicy(100, 3600))


def test_it_reads_every_page_after_its_position_then_joins(history):
    append(history, b"1", b"2", b"3", b"4", b"5")
    epoch = history.position("news")[0]
    consumer, feed = Consumer(), Feed(history)
    reader = StreamReader(feed, consumer, 2, epoch, True)
    reader._catch_up()
    assert [body for body, _ in consumer.got] == [b"3", b"4", b"5"]
    assert consumer.got[0][1] == b"x-stream-offset:3\nx-stream-epoch:%s\n" % epoch.encode()
    assert feed.joined == 1 and reader.position == 5


def test_a_history_lost_while_it_catches_up_starts_it_over_in_the_new_epoch(history, registry):
    append(history, b"1", b"2", b"3")
    old = history.position("news")[0]
    registry.redis.delete(registry.keys.history("news"), registry.keys.history_meta("news"))
    append(history, b"a", b"b", b"c", b"d")  # a new epoch, offsets from 1 again
    new = history.position("news")[0]
    consumer = Consumer()
    reader = StreamReader(Feed(history), consumer, 2, old, True)
    reader._catch_up()
    # Not offsets 3 and 4 of the new epoch taken for the old one's: all of
    # the new epoch, and the client told on the first.
    assert [body for body, _ in consumer.got] == [b"a", b"b", b"c", b"d"]
    first = consumer.got[0][1]
    assert b"x-recovered:false" in first and new.encode() in first
    assert all(b"x-recovered" not in extra for _, extra in consumer.got[1:])


def test_what_a_subscription_was_given_is_kept_as_runs_of_offsets(monkeypatch):
    from gearhorn.stomp.topics import streamruns

    runs = []
    spans = streamruns.StreamRuns(runs.append)
    for offset in (1, 2, 3, 5, 6):
        spans.given("e1", offset)
    spans.given("e1", 9, told_gap=True)  # the client was told 7-8 are lost
    assert runs == ["e1:1-3", "e1:5-6"]
    spans.given("e2", 1)  # history wiped: a new epoch
    spans.end()
    spans.end()  # nothing more
    assert runs == ["e1:1-3", "e1:5-6", "e1:9-9:unrecovered", "e2:1-1"]
    monkeypatch.setattr(streamruns, "MOST_PER_RUN", 3)
    for offset in range(2, 9):
        spans.given("e2", offset)
    spans.end()
    assert runs[4:] == ["e2:2-4", "e2:5-7", "e2:8-8"]  # long runs are cut


class FailingConsumer(Consumer):
    """A subscription whose delivery raises (a bug, say)."""

    function = "news_bad"

    def __init__(self):
        super().__init__()
        self.failures = []

    def deliver(self, delivery):
        raise RuntimeError("a bug in deliver")

    def failed(self, reason):
        self.failures.append(reason)


def test_a_reader_whose_delivery_fails_ends_told_and_the_feed_goes_on(history, caplog):
    from gearhorn.stomp.topics.feeds import TopicFeed

    feed = TopicFeed(history, "news", on_idle=lambda feed: None)
    feed.stopped = True  # its XREAD loop is not what this test drives
    good, bad = Consumer(), FailingConsumer()
    readers = [StreamReader(feed, consumer, 0, None, True) for consumer in (bad, good)]
    for reader in readers:
        feed.added()
        feed.live.append(reader)
    feed.hand_over((1, "id-1", b"1", {}))
    feed.hand_over((2, "id-2", b"2", {}))
    assert [body for body, _ in good.got] == [b"1", b"2"]
    assert bad.failures == ["internal error while delivering this subscription's messages "
                            "(logged by the bridge)"]
    assert readers[0].closed and feed.live == [readers[1]]
    assert "delivery to news_bad failed" in caplog.text and "a bug in deliver" in caplog.text


def test_a_reader_whose_delivery_fails_while_catching_up_ends_told(history):
    append(history, b"1", b"2")
    bad = FailingConsumer()
    feed = Feed(history)
    reader = StreamReader(feed, bad, 0, history.position("news")[0], True)
    reader._catch_up()
    assert reader.closed and len(bad.failures) == 1 and feed.joined == 0


# -- live readers: a plain SUBSCRIBE takes this bridge's SENDs early --------------


class LiveConsumer(Consumer):
    function = "news_live"

    def __init__(self, credit=10):
        super().__init__()
        self.room = credit

    def credit(self):
        return self.room

    def bodies(self):
        return [body for body, _ in self.got]


def test_a_feed_whose_topic_got_a_new_epoch_past_its_offset_reads_that_epoch_from_one(
        history, registry):
    """A bridge paused past the topic's pen costs the topic its epoch
    (lua/history_append.lua); the new one's offsets start at 1 and may pass
    the feed's before it looks: its XREAD then finds the new epoch's 4 and
    5, which are not the old epoch's 4 and 5 (tests/integration/
    test_realtime.py's paused bridge: readers skipped 600 messages so)."""
    from gearhorn.stomp.topics.feeds import TopicFeed

    append(history, b"1", b"2", b"3")
    feed = TopicFeed(history, "news", on_idle=lambda feed: None)
    feed.stopped = True  # the test reads itself
    old, _, feed.last = history.position("news")
    feed.epoch = old
    registry.redis.delete(registry.keys.history("news"), registry.keys.history_meta("news"))
    append(history, b"a", b"b", b"c", b"d", b"e")
    new = history.position("news")[0]
    assert feed._read() == [] and (feed.epoch, feed.last) == (new, 0)
    assert [body for _, _, body, _ in feed._read()] == [b"a", b"b", b"c", b"d", b"e"]


def stopped_feed(history):
    """A feed whose XREAD loop is not running: the test hands over itself."""
    from gearhorn.stomp.topics.feeds import TopicFeed

    feed = TopicFeed(history, "news", on_idle=lambda feed: None)
    feed.stopped = True
    feed.last, feed.epoch = 0, "e1"
    return feed


def live_reader(feed, consumer, live=True, spans=None):
    reader = StreamReader(feed, consumer, feed.last, feed.epoch, True, spans, live=live)
    feed.added()
    assert feed.join(reader)
    return reader


def entries(*ids):
    return [(i, i.encode(), None) for i in ids]


def test_a_live_reader_takes_a_send_before_its_append_and_not_again_from_the_feed(history):
    from gearhorn.stomp.topics.streamruns import StreamRuns

    runs = []
    feed, live, stream = stopped_feed(history), LiveConsumer(), LiveConsumer()
    reader = live_reader(feed, live, spans=StreamRuns(runs.append))
    live_reader(feed, stream, live=False)
    feed.sending(entries("a"))
    assert live.got == [(b"a", b"")]  # at once, and with no offset: it has none yet
    assert stream.got == []  # a stream subscriber waits for the offset
    feed.hand_over((1, "a", b"a", {}))  # the append, passed on the feed
    feed.hand_over((2, "z", b"z", {}))  # another bridge's
    assert live.bodies() == [b"a", b"z"] and live.got[1][1] == b""
    assert [extra.split(b"\n")[0] for _, extra in stream.got] == [b"x-stream-offset:1",
                                                                 b"x-stream-offset:2"]
    reader.close()
    assert runs == ["e1:1-2"]  # the ledger has both, in offset order
    assert reader.early == set() and feed.in_flight == {}


def test_a_send_a_live_reader_could_not_take_holds_back_the_later_ones(history):
    feed, consumer = stopped_feed(history), LiveConsumer(credit=0)
    reader = live_reader(feed, consumer)
    feed.sending(entries("a"))  # no credit: owed, through the feed
    consumer.room = 10
    feed.sending(entries("b"))  # must not overtake "a"
    assert consumer.got == [] and reader.owed == {"a", "b"}
    feed.hand_over((1, "a", b"a", {}))
    feed.hand_over((2, "b", b"b", {}))
    assert consumer.bodies() == [b"a", b"b"] and reader.owed == set()
    feed.sending(entries("c"))  # owing nothing, it takes the next early again
    assert consumer.bodies() == [b"a", b"b", b"c"]


def test_a_reader_that_joins_while_sends_are_in_flight_owes_them(history):
    feed, first, late = stopped_feed(history), LiveConsumer(), LiveConsumer()
    live_reader(feed, first)
    feed.sending(entries("a"))  # appended, not yet passed on the feed
    joined = live_reader(feed, late)
    feed.sending(entries("b"))
    assert late.got == [] and joined.owed == {"a", "b"}
    feed.hand_over((1, "a", b"a", {}))
    feed.hand_over((2, "b", b"b", {}))
    assert late.bodies() == [b"a", b"b"] and first.bodies() == [b"a", b"b"]


def test_a_send_whose_append_failed_is_owed_no_more(history):
    feed, consumer = stopped_feed(history), LiveConsumer(credit=0)
    reader = live_reader(feed, consumer)
    feed.sending(entries("a"))
    consumer.room = 10
    feed.forget(["a"])  # its append failed: it will never be passed
    assert reader.owed == set() and feed.in_flight == {}
    feed.sending(entries("b"))
    assert consumer.bodies() == [b"b"]


def test_a_closed_live_reader_stays_until_what_it_took_early_is_passed(history):
    from gearhorn.stomp.topics.streamruns import StreamRuns

    runs = []
    feed, consumer = stopped_feed(history), LiveConsumer()
    reader = live_reader(feed, consumer, spans=StreamRuns(runs.append))
    feed.sending(entries("a", "b"))
    reader.close()
    assert reader in feed.live and runs == []  # its offsets are still to come
    feed.hand_over((1, "a", b"a", {}))
    feed.hand_over((2, "b", b"b", {}))
    assert reader not in feed.live and runs == ["e1:1-2"] and consumer.bodies() == [b"a", b"b"]


def test_after_a_send_a_worker_appended_none_is_taken_early_until_it_is_passed(history):
    from gearhorn.stomp.topics.feeds import TopicFeeds

    streams = TopicFeeds(history)
    feed = streams.feeds["news"] = stopped_feed(history)
    consumer = LiveConsumer()
    live_reader(feed, consumer)
    append(history, b"w")  # a deduplicated SEND: the worker appends it
    streams.worker_appended("news")
    streams.sending("news", entries("b"))
    assert consumer.got == []  # "w" first, from the feed
    feed.hand_over((1, "id-w", b"w", {}))
    feed.hand_over((2, "b", b"b", {}))
    streams.sending("news", entries("c"))
    assert consumer.bodies() == [b"w", b"b", b"c"]


def test_what_a_reader_read_ahead_of_the_feed_is_not_owed_once_the_feed_passes_it(history):
    feed, first, ahead = stopped_feed(history), LiveConsumer(), LiveConsumer()
    live_reader(feed, first)
    feed.sending(entries("a"))  # in flight
    reader = StreamReader(feed, ahead, 1, "e1", True, live=True)  # read "a" from history
    feed.added()
    assert feed.join(reader) and reader.owed == {"a"}
    feed.hand_over((1, "a", b"a", {}))  # behind its position: skipped, and owed no more
    assert reader.owed == set() and ahead.got == []
    feed.sending(entries("b"))
    assert ahead.bodies() == [b"b"]


# -- a reader behind the feed ------------------------------------------------------


def test_a_reader_without_credit_stays_on_the_feed_and_gets_all_in_order(history):
    import gevent

    feed, consumer = stopped_feed(history), LiveConsumer(credit=0)
    reader = live_reader(feed, consumer, live=False)
    for offset in range(1, 6):
        feed.hand_over((offset, f"m{offset}", b"%d" % offset, {}))
    assert consumer.got == [] and reader in feed.live  # held here, not dropped
    assert len(reader.lagging) == 5
    consumer.room = 100
    reader.settled()  # credit back
    gevent.sleep(0)  # the drain runs
    feed.hand_over((6, "m6", b"6", {}))  # after the held ones, never before
    gevent.wait([reader._draining] if reader._draining else [], timeout=5)
    assert consumer.bodies() == [b"1", b"2", b"3", b"4", b"5", b"6"]
    assert reader.position == 6 and not reader.lagging


def test_a_reader_too_far_behind_leaves_the_feed_to_catch_up_from_history(
        history, monkeypatch):
    from gearhorn.stomp.topics import streams

    monkeypatch.setattr(streams, "LAG_MESSAGES", 3)
    feed, consumer = stopped_feed(history), LiveConsumer(credit=0)
    reader = live_reader(feed, consumer, live=False)
    for offset in range(1, 5):
        feed.hand_over((offset, f"m{offset}", b"x", {}))
    assert reader not in feed.live and not reader.lagging  # off the feed, nothing held
    assert reader.position == 0 and reader._catching_up is not None  # from history
    reader.close()
