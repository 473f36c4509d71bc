import json

from gearhorn.rules.messages import Subscription
from gearhorn.store.registry import Recipient, Registry


def queues(members):
    return sorted(r.queue for r in members.recipients)


def test_subscribe_counts_and_is_idempotent(registry):
    assert registry.subscribe(Subscription("news", "alice")) == 1
    assert registry.subscribe(Subscription("news", "bob")) == 2
    assert registry.subscribe(Subscription("news", "bob")) == 2
    assert registry.subscribers("news") == {"alice", "bob"}
    assert registry.topics() == {"news": 2}


def test_unsubscribe_removes_and_drops_empty_topics(registry, fake_redis):
    registry.subscribe(Subscription("news", "alice"))
    assert registry.unsubscribe(Subscription("news", "alice")) == 0
    assert registry.unsubscribe(Subscription("news", "alice")) == 0
    assert registry.topics() == {}
    assert not fake_redis.exists("t:topic:{news}")


def test_members_returns_none_while_the_token_is_current(registry):
    registry.subscribe(Subscription("news", "alice"))
    first = registry.members("news")
    assert queues(first) == ["news_alice"]
    assert registry.members("news", first) is None
    registry.subscribe(Subscription("news", "bob"))
    second = registry.members("news", first)
    assert second.token != first.token
    assert queues(second) == ["news_alice", "news_bob"]


def test_no_op_changes_keep_the_token(registry):
    registry.subscribe(Subscription("news", "alice"))
    cached = registry.members("news")
    registry.subscribe(Subscription("news", "alice"))
    registry.unsubscribe(Subscription("news", "nobody"))
    assert registry.members("news", cached) is None


def test_other_topics_do_not_change_the_token(registry):
    registry.subscribe(Subscription("news", "alice"))
    cached = registry.members("news")
    registry.subscribe(Subscription("sport", "bob"))
    assert registry.members("news", cached) is None


def test_prefix_subscribers_receive_matching_topics(registry):
    registry.subscribe(Subscription("news.*", "carol"))
    registry.subscribe(Subscription("news.sports", "alice"))
    members = registry.members("news.sports")
    assert set(members.recipients) == {
        Recipient("news.sports_alice", "alice"),
        Recipient("news.*_carol", "carol", "news.*"),
    }
    assert queues(registry.members("weather")) == []
    assert registry.topics() == {"news.*": 1, "news.sports": 1}


def test_prefix_change_invalidates_every_topic_token(registry):
    registry.subscribe(Subscription("news.sports", "alice"))
    cached = registry.members("news.sports")
    registry.subscribe(Subscription("n*", "dave"))
    assert queues(registry.members("news.sports", cached)) == ["n*_dave", "news.sports_alice"]


def test_a_topic_change_keeps_the_cached_prefix_subscribers(registry):
    registry.subscribe(Subscription("news.*", "carol"))
    cached = registry.members("news.sports")
    registry.subscribe(Subscription("news.sports", "alice"))
    fresh = registry.members("news.sports", cached)
    assert fresh.token.split(".")[1] == cached.token.split(".")[1]
    assert queues(fresh) == ["news.*_carol", "news.sports_alice"]


def test_topic_index_keeps_a_topic_that_gains_a_subscriber_while_emptied(registry, fake_redis):
    registry.subscribe(Subscription("news", "alice"))
    fake_redis.srem(registry.keys.topic("news"), "alice")  # alice left: the count was 0,
    fake_redis.sadd(registry.keys.topic("news"), "bob")  # and bob came before the second look
    registry._index_topic("news", 0)
    assert registry.topics() == {"news": 1}


def test_a_prefix_added_by_another_process_is_seen_at_the_next_lookup(registry, fake_redis):
    other = Registry(fake_redis, registry.keys)  # another worker process
    registry.subscribe(Subscription("news.sports", "alice"))
    cached = other.members("news.sports")
    registry.subscribe(Subscription("news.*", "dave"))
    assert queues(other.members("news.sports", cached)) == ["news.*_dave", "news.sports_alice"]
    registry.unsubscribe(Subscription("news.*", "dave"))
    assert queues(other.members("news.sports", cached)) == ["news.sports_alice"]


def test_every_change_is_announced(registry, fake_redis):
    pubsub = fake_redis.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe("chan")
    pubsub.get_message(timeout=1)
    registry.subscribe(Subscription("news", "alice"))
    registry.unsubscribe(Subscription("news", "alice"))
    notes = []
    for _ in range(10):
        message = pubsub.get_message(timeout=1)
        if message:
            notes.append(json.loads(message["data"]))
        if len(notes) == 2:
            break
    assert [(n["op"], n["topic"], n["client_id"]) for n in notes] == [
        ("subscribe", "news", "alice"), ("unsubscribe", "news", "alice")]
    assert notes[0]["version"] == "1" and notes[1]["version"] == "2"


def test_an_announcement_keeps_names_that_look_like_placeholders(registry, fake_redis):
    pubsub = fake_redis.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe("chan")
    pubsub.get_message(timeout=1)
    registry.subscribe(Subscription('odd%VERSION%"\\topic', "%VERSION%"))
    message = None
    for _ in range(10):
        message = message or pubsub.get_message(timeout=1)
    note = json.loads(message["data"])
    assert (note["topic"], note["client_id"], note["version"]) == (
        'odd%VERSION%"\\topic', "%VERSION%", "1")


def test_liveness_expires_without_anyone_removing_the_worker(registry):
    registry.heartbeat("w1", ttl=5, info={"pid": 1}, now=1000)
    registry.heartbeat("w2", ttl=5, now=1000)
    assert set(registry.live_workers(now=1004)) == {"w1", "w2"}
    assert registry.live_workers(now=1004)["w1"]["pid"] == "1"
    registry.heartbeat("w2", ttl=5, now=1004)
    assert set(registry.live_workers(now=1006)) == {"w2"}
    registry.retire("w2")
    assert registry.live_workers(now=1006) == {}


def test_members_of_several_topics_in_one_round_trip(registry, fake_redis, monkeypatch):
    other = Registry(fake_redis, registry.keys)  # another worker process
    registry.subscribe(Subscription("news", "alice"))
    registry.subscribe(Subscription("sport", "bob"))
    cached = other.members_of({"news": None, "sport": None, "quiet": None})
    assert {t: queues(m) for t, m in cached.items()} == {
        "news": ["news_alice"], "sport": ["sport_bob"], "quiet": []}
    registry.subscribe(Subscription("sport", "carol"))
    registry.subscribe(Subscription("n*", "dave"))  # a pattern the other has not read yet
    round_trips = []
    pipeline = other.redis.pipeline

    def counted(*args, **kwargs):
        round_trips.append(1)
        return pipeline(*args, **kwargs)

    monkeypatch.setattr(other.redis, "pipeline", counted)
    fresh = other.members_of(cached)
    assert {t: queues(m) for t, m in fresh.items()} == {
        "news": ["n*_dave", "news_alice"], "sport": ["sport_bob", "sport_carol"], "quiet": []}
    # one round trip for the three topics, one to read the patterns, one again
    assert len(round_trips) == 3
    round_trips.clear()
    assert other.members_of(fresh) == {"news": None, "sport": None, "quiet": None}
    assert len(round_trips) == 1
