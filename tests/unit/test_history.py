"""Topic history: offsets per topic, an epoch, trimming, and what a fanout
writes to it."""

import json

import pytest

from gearhorn.config import Config
from gearhorn.errors import BadRequest
from gearhorn.rules.historypolicy import HistoryPolicy, HistoryPolicyError
from gearhorn.rules.messages import Subscription, parse_history
from gearhorn.rules.naming import stream_client_id
from gearhorn.store.history import History
from gearhorn.store.subscribers import SubscriberCache
from gearhorn.worker.wiring import build_service
from tests.fakes import RecordingClient

pytestmark = pytest.mark.timeout(10)


@pytest.fixture
def history(registry):
    return History(registry.redis, registry.keys, HistoryPolicy(1000, 3600))


def test_offsets_count_per_topic_and_reads_start_after_since(history):
    history.append([("news", [("m1", b"a", None), ("m2", b"b", None)]),
                    ("sports", [("m3", b"x", None)])])
    history.append([("news", [("m4", "c\u00e9".encode(), None)])])
    found = history.read("news")
    assert [(m["offset"], m["message_id"], m["payload"]) for m in found["messages"]] == [
        (1, "m1", "a"), (2, "m2", "b"), (3, "m4", "c\u00e9")]
    assert (found["first"], found["last"], found["recovered"]) == (1, 3, True)
    assert [m["offset"] for m in history.read("news", since=2)["messages"]] == [3]
    assert history.read("sports")["messages"][0]["offset"] == 1
    assert history.read("news", since=1, limit=1)["messages"][0]["offset"] == 2
    assert found["epoch"] and found["epoch"] == history.read("news")["epoch"]


def test_bytes_that_are_not_text_come_back_in_base64(history):
    history.append([("bin", [("m1", b"\xff\x00", None)])])
    (message,) = history.read("bin")["messages"]
    assert message["payload_base64"] == "/wA=" and "payload" not in message


def test_trimmed_or_lost_history_is_not_recovered(registry):
    small = History(registry.redis, registry.keys, HistoryPolicy(1, 3600))
    for n in range(300):  # MAXLEN ~ trims whole nodes: far past the size
        small.append([("t", [(f"m{n}", b"x", None)])])
    found = small.read("t", since=1)
    assert found["last"] == 300 and found["first"] > 2 and not found["recovered"]
    assert small.read("t", since=299)["recovered"]
    epoch = found["epoch"]
    assert not small.read("t", since=299, epoch="another")["recovered"]
    registry.redis.flushall()  # Redis wiped: a new epoch, offsets from 1 again
    small.append([("t", [("m-new", b"y", None)])])
    again = small.read("t", since=299, epoch=epoch)
    assert again["epoch"] != epoch and not again["recovered"] and again["last"] == 1
    nothing = small.read("never")
    assert (nothing["epoch"], nothing["messages"], nothing["recovered"]) == (None, [], False)


def test_every_fanout_path_writes_its_messages_in_order(registry):
    client = RecordingClient()
    svc = build_service(Config(history_size=100), registry, SubscriberCache(registry), client)
    svc.handle("subscribe_fanout", b'{"topic": "news", "client_id": "a"}')
    jobs = [json.dumps({"topic": "news", "payloads": ["1", "2"], "background": True}),
            json.dumps({"topic": "news", "payload": "3"}),
            json.dumps({"topic": "news", "payload": "4", "headers": {"x-k": "v"},
                        "background": True})]
    for job in jobs:
        svc.handle("fanout", job.encode())
    found = json.loads(svc.handle("topic_history", b'{"topic": "news", "since": 1}'))
    assert [m["payload"] for m in found["messages"]] == ["2", "3", "4"]
    assert found["recovered"] and found["last"] == 4


def test_history_off_writes_nothing(registry):
    svc = build_service(Config(), registry, SubscriberCache(registry), RecordingClient())
    svc.handle("fanout", b'{"topic": "news", "payload": "1", "background": true}')
    assert not registry.redis.exists(registry.keys.history("news"))


@pytest.mark.parametrize("job, reason", [
    ({"topic": "t", "since": -1}, "since must be a whole number from 0"),
    ({"topic": "t", "limit": 0}, "limit must be a whole number from 1"),
    ({"topic": "t", "epoch": 5}, "epoch must be a string"),
    ({"topic": "t*"}, "invalid topic"),
])
def test_a_bad_history_query_is_refused_in_one_line(job, reason):
    with pytest.raises(BadRequest, match=reason):
        parse_history(json.dumps(job).encode())


def test_history_per_topic_or_prefix(registry):
    policy = HistoryPolicy.parse("chat.*=50/60, chat.quiet=0, news=5", 0, 3600)
    history = History(registry.redis, registry.keys, policy)
    history.append([("chat.room", [("m1", b"a", None)]), ("chat.quiet", [("m2", b"b", None)]),
                    ("sports", [("m3", b"c", None)]), ("news", [("m4", b"d", None)])])
    kept = {t: history.read(t)["last"] for t in ("chat.room", "chat.quiet", "sports", "news")}
    assert kept == {"chat.room": 1, "chat.quiet": 0, "sports": 0, "news": 1}
    assert 0 < registry.redis.ttl(registry.keys.history("chat.room")) <= 60


@pytest.mark.parametrize("text", ["news", "news=x", "new*s=1", "news=-1", "news=1/0"])
def test_bad_history_topics_are_refused(text):
    with pytest.raises(HistoryPolicyError):
        HistoryPolicy.parse(text, 0, 3600)


def test_headers_position_and_offset_at_a_time(history, monkeypatch):
    import gearhorn.store.history as module

    for n, at in enumerate([100.0, 200.0, 300.0], 1):
        monkeypatch.setattr(module.time, "time", lambda at=at: at)
        history.append([("news", [(f"m{n}", b"x", {"content-type": "text/plain"} if n == 2
                                   else None)])])
    (second,) = history.read("news", since=1, limit=1)["messages"]
    assert second["headers"] == {"content-type": "text/plain"}
    epoch, (stored, *_) = history.entries("news", 1, 10)
    assert epoch and stored[1:] == ("m2", b"x", {"content-type": "text/plain"})
    epoch, first, last = history.position("news")
    assert epoch and (first, last) == (1, 3)
    assert [history.offset_at("news", t, page=2) for t in (0, 150, 300, 301)] == [1, 2, 3, 4]
    assert history.position("never") == (None, 1, 0)


def test_stream_subscribers_are_listed_but_get_no_copies(registry):
    client = RecordingClient()
    svc = build_service(Config(history_size=10), registry, SubscriberCache(registry), client)
    svc.handle("subscribe_fanout", b'{"topic": "news", "client_id": "a"}')
    registry.subscribe(Subscription("news", stream_client_id(), bridge="b1"))
    found = json.loads(svc.handle("fanout", b'{"topic": "news", "payload": "1"}'))
    assert found["copies"] == 1 and [c.function for c in client.foreground] == ["news_a"]
    assert json.loads(svc.handle("topic_presence", b'{"topic": "news"}'))["subscribers"] == 2
    with pytest.raises(BadRequest, match="kept for the bridge"):
        svc.handle("subscribe_fanout", b'{"topic": "news", "client_id": "+me"}')


def news_fanouts(registry, client, count):
    """A fanout service keeping history, one subscriber of "news", and
    ``count`` background fanout jobs to it (payloads "0", "1", ...)."""
    from gearhorn.worker.jobs import Job

    svc = build_service(Config(history_size=100), registry, SubscriberCache(registry), client)
    svc.handle("subscribe_fanout", b'{"topic": "news", "client_id": "a"}')
    return svc, [Job("fanout", json.dumps({"topic": "news", "payload": str(n),
                                           "background": True}).encode(), f"u{n}")
                 for n in range(count)]


def test_a_group_run_again_after_gearmand_failed_is_in_history_once(registry):
    from gearhorn import gearman
    from gearhorn.worker.jobs import ServiceUnavailable

    class FailsOnce(RecordingClient):
        failed = False

        def submit_background(self, copies, precedence="normal"):
            if not self.failed:
                self.failed = True
                raise gearman.GearmanError("connection reset")
            return super().submit_background(copies, precedence)

    svc, jobs = news_fanouts(registry, FailsOnce(), 3)
    with pytest.raises(ServiceUnavailable):
        list(svc.run(jobs))
    assert [len(group) for group in svc.run(jobs)] == [3]
    found = json.loads(svc.handle("topic_history", b'{"topic": "news"}'))
    assert [m["payload"] for m in found["messages"]] == ["0", "1", "2"]


def test_fanouts_run_again_in_other_company_are_each_in_history_once(registry):
    """gearmand hands failed jobs out again in any grouping, and other
    fanouts to the topic may come between: no message twice, none lost."""
    svc, jobs = news_fanouts(registry, RecordingClient(), 5)
    list(svc.run(jobs[0:3]))
    list(svc.run(jobs[3:4]))  # another producer's, in between
    list(svc.run(jobs[1:3]))  # run again without the first
    list(svc.run(jobs[0:5]))  # and with it and one more
    found = json.loads(svc.handle("topic_history", b'{"topic": "news"}'))
    assert [m["payload"] for m in found["messages"]] == ["0", "1", "2", "3", "4"]
    assert [m["offset"] for m in found["messages"]] == [1, 2, 3, 4, 5]


def test_message_ids_are_kept_for_the_repeat_window_and_bounded(history, monkeypatch):
    from gearhorn.store import history as module

    monkeypatch.setattr(module, "REPEAT_IDS", 50)
    for n in range(120):
        history.append([("t", [(f"m{n}", b"x", None)])], once_each=True)
    key = history.keys.history_ids("t")
    assert set(history.redis.zrange(key, 0, -1)) == {f"m{n}".encode() for n in range(70, 120)}
    assert history.append([("t", [("m119", b"x", None)])], once_each=True)[0][1:] == (0, 0)
    assert 0 < history.redis.pttl(key) <= module.REPEAT_WINDOW * 1000
    history.redis.zadd(key, {"m119": 1})  # appended long ago: out of the window now
    history.append([("t", [("m120", b"x", None)])], once_each=True)
    assert history.redis.zscore(key, "m119") is None
    assert history.append([("t", [("m119", b"x", None)])], once_each=True)[0][1:] == (122, 122)


class Heard:
    """An observer that keeps what it is told of fanouts."""

    def __init__(self):
        self.fanouts = []

    def fanned_out(self, topic, per_message, width, failed=(), seconds=None):
        self.fanouts.append((topic, list(per_message), width))


class Readers:
    """The bridge's stream readers, as HistoryFirst tells them of each SEND."""

    def __init__(self, take=False):
        self.told, self.take = [], take  # take: live readers here take SENDs early

    def sending(self, topic, messages):
        self.told.append(("sending", topic, [m[0] for m in messages]))
        return self.take

    def appended(self, topic, where, messages):
        self.told.append(("appended", topic, where, [m[0] for m in messages]))

    def not_appended(self, topic, messages):
        self.told.append(("not appended", topic, [m[0] for m in messages]))

    def at(self, topic):
        return None  # no feed here: offsets come from Redis


def test_a_send_whose_subscribers_all_read_the_history_needs_no_job(history, registry):
    """The bridge appends a SEND and looks its subscribers up in the same
    round trip: while every one is a stream subscription, no fanout job is
    needed and the bridge records the message itself; a Gearman or prefix
    subscriber brings the job back."""
    from gearhorn.stomp.protocol.sendheaders import PLAIN, SendOptions
    from gearhorn.stomp.topics.appending import HistoryFirst

    heard, readers = Heard(), Readers()
    first = HistoryFirst(history, SubscriberCache(registry), readers, heard)
    registry.subscribe(Subscription("news", stream_client_id()))
    send = first.append("news", [b"a", b"b"], PLAIN)
    assert not send.needs_job and len(send.message_ids) == 2
    assert [m["message_id"] for m in history.read("news")["messages"]] == send.message_ids
    epoch = history.read("news")["epoch"]
    assert readers.told == [("sending", "news", send.message_ids),
                            ("appended", "news", (epoch, 1, 2), send.message_ids)]
    assert heard.fanouts == [("news", [(mid, ()) for mid in send.message_ids], 0)]
    registry.subscribe(Subscription("news", "alice"))
    assert first.append("news", [b"c"], PLAIN).needs_job
    registry.unsubscribe(Subscription("news", "alice"))
    assert not first.append("news", [b"d"], PLAIN).needs_job
    registry.subscribe(Subscription("ne*", "bob"))
    assert first.append("news", [b"e"], PLAIN).needs_job
    assert len(heard.fanouts) == 2
    assert not first.takes("news", SendOptions(delay=5.0))  # the worker's to schedule
    assert not first.takes("news", SendOptions(headers={"x-deduplication-header": "o-1"}))


def test_an_announced_send_is_stored_later_under_its_ids_or_abandoned(history):
    """The outbox's two steps (gearhorn/stomp/sessions/outbox.py): announced, a SEND
    is with the live readers but not in the history; stored, it is there
    under the ids announced; abandoned, the readers stop waiting for it."""
    from gearhorn.stomp.protocol.sendheaders import PLAIN
    from gearhorn.stomp.topics.appending import HistoryFirst

    readers = Readers(take=True)
    first = HistoryFirst(history, None, readers)
    kept = first.announce("news", [b"a"], PLAIN)
    assert kept.to_append and kept.taken_early
    assert history.read("news")["messages"] == []
    dropped = first.announce("news", [b"b"], PLAIN)
    first.store(kept)
    first.abandon(dropped)
    first.abandon(dropped)  # once told is enough
    assert not kept.to_append and not dropped.to_append
    assert [m["message_id"] for m in history.read("news")["messages"]] == kept.message_ids
    assert [entry[0] for entry in readers.told] == [
        "sending", "sending", "appended", "not appended"]
    assert readers.told[-1] == ("not appended", "news", dropped.message_ids)
    assert not HistoryFirst(history, None, Readers()).announce("news", [b"c"],
                                                             PLAIN).taken_early


def test_a_send_whose_append_fails_is_taken_back_from_the_readers_told_of_it(history):
    """Live readers may have had the SEND before its append: when the append
    fails they are told, so they stop waiting to see it in the history."""
    import redis as redis_module

    from gearhorn.stomp.protocol.sendheaders import PLAIN
    from gearhorn.stomp.topics.appending import HistoryFirst

    readers = Readers()
    first = HistoryFirst(history, None, readers)

    def broken(calls):
        raise redis_module.ConnectionError("Redis went away")
    history.direct.run_scripts = broken
    with pytest.raises(redis_module.ConnectionError):
        first.append("news", [b"a"], PLAIN)
    (sending, taken_back) = readers.told
    assert sending[0] == "sending" and taken_back == ("not appended", "news", sending[2])


# -- real-time topics: a history kept only while read ---------------------------------


@pytest.fixture
def realtime(registry):
    return History(registry.redis, registry.keys, HistoryPolicy(0, 3600, realtime=(5, 300)))


def read_by(registry, topic):
    """A stream reader registered as the bridge registers one."""
    reader = Subscription(topic, stream_client_id())
    registry.subscribe(reader, 300)
    return reader


def test_a_realtime_topic_nobody_reads_keeps_nothing(realtime, registry):
    assert realtime.append([("rt", [("m1", b"a", None)])]) == [("", 0, 0)]
    assert not registry.redis.exists(registry.keys.history("rt"))
    assert not registry.redis.exists(registry.keys.history_meta("rt"))
    assert realtime.live == {"rt": False}


def test_a_reader_keeps_it_and_the_first_append_after_it_is_made_on_the_answer(
        realtime, registry):
    realtime.append([("rt", [("m1", b"a", None)])])  # believed unread from here on
    read_by(registry, "rt")
    epoch, first, last = realtime.append([("rt", [("m2", b"b", None)])])[0]
    assert (first, last) == (1, 1) and epoch == realtime.position("rt")[0]
    assert realtime.live == {"rt": True}  # the next one goes straight in
    assert realtime.plan([("rt", [("m3", b"c", None)])]).asked == []
    assert registry.redis.ttl(registry.keys.history_meta("rt")) == -1  # kept while read


def test_the_last_reader_leaving_keeps_it_the_ttl_then_a_new_epoch(realtime, registry):
    reader = read_by(registry, "rt")
    epoch = realtime.append([("rt", [("m1", b"a", None)])])[0][0]
    registry.unsubscribe(reader)
    meta = registry.keys.history_meta("rt")
    assert 0 < registry.redis.ttl(meta) <= 300  # it lingers for a resume
    assert realtime.append([("rt", [("m2", b"b", None)])])[0][1:] == (2, 2)  # still kept
    registry.redis.delete(meta)  # the ttl is up
    assert realtime.append([("rt", [("m3", b"c", None)])]) == [("", 0, 0)]  # not kept
    read_by(registry, "rt")  # a reader comes back: a new epoch, nothing of the old
    new = realtime.position("rt")
    assert new[0] != epoch and new[1:] == (1, 0)


def test_a_realtime_history_keeps_its_size_exactly_and_nothing_older_than_its_ttl(
        registry, monkeypatch):
    import time as time_module

    short = History(registry.redis, registry.keys, HistoryPolicy(0, 3600, realtime=(5, 60)))
    read_by(registry, "rt")
    short.append([("rt", [(f"m{i}", b"x", None) for i in range(8)])])
    found = short.read("rt")
    assert (found["first"], found["last"]) == (4, 8)  # 5 kept, exactly
    now = time_module.time()
    monkeypatch.setattr(time_module, "time", lambda: now + 61)  # the five are old now
    short.append([("rt", [("late", b"y", None)])])
    assert [m["message_id"] for m in short.read("rt")["messages"]] == ["late"]


def test_entries_read_as_a_new_epoch_begins_are_read_again_in_it(history, registry):
    """Offsets mean nothing without their epoch: messages read while a new
    epoch began (the epoch read before them is not the one after) are not
    handed out under the old name, but read again."""
    history.append([("news", [("m1", b"old", None)])])
    old = history.position("news")[0]
    real_pipeline, reads = registry.redis.pipeline, []

    def new_epoch():
        registry.redis.pipeline = real_pipeline
        registry.redis.delete(registry.keys.history("news"), registry.keys.history_meta("news"))
        history.append([("news", [("n1", b"new", None)])])
        registry.redis.pipeline = pipeline

    def pipeline(transaction=True):
        pipe = real_pipeline(transaction=transaction)
        execute = pipe.execute

        def execute_with_a_new_epoch_between(**kwargs):
            replies = execute(**kwargs)
            reads.append(replies[0])
            if len(reads) == 1:  # after the epoch, before the messages: a new epoch
                new_epoch()
                replies[1:] = [registry.redis.xrange(registry.keys.history("news")),
                               registry.redis.hget(registry.keys.history_meta("news"), "epoch")]
            return replies
        pipe.execute = execute_with_a_new_epoch_between
        return pipe

    registry.redis.pipeline = pipeline
    epoch, found = history.entries("news", 0, 10)
    assert reads[0].decode() == old and len(reads) == 2 and epoch != old
    assert [(offset, body) for offset, _, body, _ in found] == [(1, b"new")]
