"""A stream reader catching up from history (gearhorn/stomp/streams.py),
on fakeredis: offsets in order, each once, and a history lost meanwhile
seen on the next page."""

import pytest

from gearhorn.historypolicy import HistoryPolicy
from gearhorn.stomp.streams import StreamReader
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
    from gearhorn.stomp import spans as spans_module

    runs = []
    spans = spans_module.Spans(runs.append)
    for offset in (1, 2, 3, 5, 6):
        spans.given("e1", offset)
    spans.given("e1", 9, told_gap=True)  # the client was told 7-8 are lost
    assert runs == ["e1:1-3", "e1:5-6"]
    spans.given("e2", 1)  # history wiped: a new epoch
    spans.end()
    spans.end()  # nothing more
    assert runs == ["e1:1-3", "e1:5-6", "e1:9-9:unrecovered", "e2:1-1"]
    monkeypatch.setattr(spans_module, "MOST_PER_RUN", 3)
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
    from gearhorn.stomp.streams import TopicFeed

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
