"""topic_presence: the count, a page of subscribers with where each is, and
prefix subscriptions counted by pattern."""

import json

import pytest

from gearhorn.errors import BadRequest
from gearhorn.rules.messages import PresenceQuery, Subscription, parse_presence, presence_event
from gearhorn.store.presence import Presence

pytestmark = pytest.mark.timeout(10)


def test_subscribers_with_where_each_is_and_prefixes_by_pattern(registry):
    registry.subscribe(Subscription("news.eu", "alice"))
    registry.subscribe(Subscription("news.eu", "s1", bridge="b7"))
    registry.subscribe(Subscription("news.eu", "d-x", bridge="b7", durable=True))
    registry.subscribe(Subscription("news.*", "bob"))
    registry.subscribe(Subscription("sports.*", "carol"))
    found = Presence(registry).of(PresenceQuery("news.eu"))
    assert (found["subscribers"], found["direct"], found["cursor"]) == (4, 3, 0)
    assert found["patterns"] == [{"pattern": "news.*", "subscribers": 1}]
    where = {c["client_id"]: (c["via"], c["bridge"], c["durable"], c["queue"])
             for c in found["clients"]}
    assert where == {"alice": ("gearman", "", False, "news.eu_alice"),
                     "s1": ("stomp", "b7", False, "news.eu_s1"),
                     "d-x": ("stomp", "b7", True, "news.eu_d-x")}
    assert all(isinstance(c["since"], float) for c in found["clients"])


def test_pages_cover_every_subscriber_once(registry):
    for n in range(250):
        registry.subscribe(Subscription("big", f"c{n}"))
    presence, seen, cursor, pages = Presence(registry), [], 0, 0
    while True:
        page = presence.of(PresenceQuery("big", limit=40, cursor=cursor))
        assert page["subscribers"] == 250
        seen += [c["client_id"] for c in page["clients"]]
        cursor, pages = page["cursor"], pages + 1
        if not cursor:
            break
    assert sorted(seen) == sorted(f"c{n}" for n in range(250)) and pages >= 5


def test_after_an_unsubscribe_it_is_gone(registry):
    registry.subscribe(Subscription("t", "a"))
    registry.subscribe(Subscription("t", "b"))
    registry.unsubscribe(Subscription("t", "a"))
    found = Presence(registry).of(PresenceQuery("t"))
    assert found["subscribers"] == 1 and [c["client_id"] for c in found["clients"]] == ["b"]
    empty = Presence(registry).of(PresenceQuery("nobody"))
    assert (empty["subscribers"], empty["clients"], empty["cursor"]) == (0, [], 0)


@pytest.mark.parametrize("job, reason", [
    ({}, "topic"),
    ({"topic": "t", "limit": 0}, "limit must be a whole number from 1 to 10000, got 0"),
    ({"topic": "t", "limit": "9"}, 'got "9"'),
    ({"topic": "t", "cursor": -1}, "cursor must be a whole number from 0"),
    ({"topic": "bad topic"}, "invalid topic"),
])
def test_a_bad_query_is_refused_in_one_line(job, reason):
    with pytest.raises(BadRequest, match=reason):
        parse_presence(json.dumps(job).encode())


def test_the_registry_tells_real_changes_with_where_they_were_made(registry):
    heard = []
    registry.changed = lambda sub, joined: heard.append(
        (sub.topic, sub.client_id, joined, sub.bridge, sub.durable))
    registry.subscribe(Subscription("t", "s1", bridge="b7", durable=True))
    registry.subscribe(Subscription("t", "s1", bridge="b7", durable=True))  # no change
    registry.subscribe(Subscription("t.*", "p"))
    registry.unsubscribe(Subscription("t", "s1"))  # the janitor knows no more than this
    registry.unsubscribe(Subscription("t", "s1"))  # gone already
    assert heard == [("t", "s1", True, "b7", True), ("t.*", "p", True, "", False),
                     ("t", "s1", False, "b7", True)]


def test_a_presence_event_is_a_background_fanout_on_its_own_topic():
    job = json.loads(presence_event("gearhorn.presence.", Subscription(
        "news", "s1", bridge="b7"), True, 1700000000.5))
    assert (job["topic"], job["background"]) == ("gearhorn.presence.news", True)
    assert json.loads(job["payload"]) == {
        "event": "join", "topic": "news", "client_id": "s1", "via": "stomp", "bridge": "b7",
        "durable": False, "at": 1700000000.5}
    # A pattern's or an over-long name's event topic would be invalid: none.
    assert presence_event("p.", Subscription("news.*", "a"), False, 0) is None
    assert presence_event("p.", Subscription("n" * 127, "a"), False, 0) is None
