"""The warden's round and the rooms of reject-publish queues (store/rejectroom.py):
a subscription made while a round runs keeps the room it opened."""

import pytest

from gearhorn.rules.limits import REJECT_PUBLISH, Limits
from gearhorn.rules.messages import Subscription
from gearhorn.store.deadletters import DeadLetterIndex
from gearhorn.store.headers import HeaderStore
from gearhorn.store.rejectroom import RoomKeeper
from gearhorn.worker.reaper import Reaper
from gearhorn.worker.warden import Warden, WardenSettings

pytestmark = pytest.mark.timeout(60)

CAPPED = Limits(max_length=5, overflow=REJECT_PUBLISH)


def warden_of(registry):
    reaper = Reaper((), HeaderStore(registry.redis, registry.keys, 60),
                    DeadLetterIndex(registry.redis, registry.keys))
    return Warden(WardenSettings(servers=()), registry, reaper)


def test_a_subscription_made_during_a_round_keeps_its_room(registry):
    """The race a side-by-side suite found: the round read the subscriptions,
    a reject-publish subscription opened its room, and the round's end took
    every room it had not judged away, so a burst filled the queue past its
    limit (300 copies in a max_length 5 queue)."""
    warden = warden_of(registry)
    read = registry.renewed  # a round's read of the subscriptions made since the last

    def subscribed_meanwhile(most):
        found = read(most)
        registry.subscribe(Subscription("news", "late", CAPPED))  # after the round's read
        return found

    registry.renewed = subscribed_meanwhile
    warden.round(now=1000.0)
    room = RoomKeeper(registry.redis, registry.keys)
    assert room.claim(["news_late"], [1] * 8) == [5]  # its room, not "no limit"
    registry.renewed = read
    warden.round(now=1001.0)  # the next round judges it (room was claimed)
    assert room.claim(["news_late"], [1]) == [0]


def test_a_queue_no_longer_reject_publish_loses_its_room(registry):
    registry.subscribe(Subscription("news", "capped", CAPPED))
    warden = warden_of(registry)
    room = RoomKeeper(registry.redis, registry.keys)
    warden.round(now=1000.0)
    assert "news_capped" in room.bounded()
    registry.unsubscribe(Subscription("news", "capped"))
    warden.round(now=1001.0)
    assert room.bounded() == frozenset()
    assert room.claim(["news_capped"], [1] * 8) == [8]  # no room field: no limit
