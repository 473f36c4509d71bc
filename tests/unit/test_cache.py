import json

from gearhorn.rules.messages import Subscription
from gearhorn.store.subscribers import SubscriberCache


def names(recipients):
    return sorted(r.client_id for r in recipients)


def test_cache_hits_until_a_change_then_sees_it(registry):
    cache = SubscriberCache(registry)
    registry.subscribe(Subscription("news", "alice"))
    assert names(cache.recipients("news")) == ["alice"]
    assert names(cache.recipients("news")) == ["alice"]
    assert (cache.hits, cache.misses) == (1, 1)
    # No invalidation message is delivered here: the token alone keeps it right.
    registry.subscribe(Subscription("news", "bob"))
    assert names(cache.recipients("news")) == ["alice", "bob"]
    registry.unsubscribe(Subscription("news", "alice"))
    assert names(cache.recipients("news")) == ["bob"]


def test_two_caches_agree_after_every_change(registry):
    a, b = SubscriberCache(registry), SubscriberCache(registry)
    for i in range(50):
        registry.subscribe(Subscription("t", f"c{i}"))
        assert names(b.recipients("t")) == names(a.recipients("t"))
        assert len(a.recipients("t")) == i + 1


def test_announcements_invalidate(registry):
    cache = SubscriberCache(registry)
    registry.subscribe(Subscription("news", "alice"))
    registry.subscribe(Subscription("sport", "alice"))
    cache.recipients("news")
    cache.recipients("sport")
    cache.handle_announcement(json.dumps({"op": "subscribe", "topic": "news"}))
    assert len(cache) == 1
    cache.handle_announcement(json.dumps({"op": "subscribe", "topic": "n*"}))
    assert len(cache) == 0
    cache.recipients("news")
    cache.handle_announcement(b"garbage")
    assert len(cache) == 1


def test_cache_is_bounded(registry):
    cache = SubscriberCache(registry, max_entries=3)
    for i in range(10):
        cache.recipients(f"t{i}")
    assert len(cache) == 3


def test_listener_drops_entries_announced_on_the_channel(registry, fake_redis):
    import time

    from gearhorn.store.subscribers import InvalidationListener

    cache = SubscriberCache(registry)
    listener = InvalidationListener(fake_redis, "chan", cache)
    listener.start()
    try:
        assert listener.subscribed.wait(30)
        registry.subscribe(Subscription("news", "alice"))
        cache.recipients("news")
        assert len(cache) == 1
        registry.subscribe(Subscription("news", "bob"))
        deadline = time.monotonic() + 30
        while len(cache) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(cache) == 0
    finally:
        listener.stop()
        listener.join(5)


def test_listener_tells_of_every_resubscription(registry, fake_redis):
    # After one the releaser looks for due messages again: announcements
    # made while the channel was away are lost (gearhorn/store/delayed.py).
    import time

    from gearhorn.store.subscribers import InvalidationListener

    subscriptions = []
    listener = InvalidationListener(fake_redis, "chan", SubscriberCache(registry),
                                    on_subscribed=lambda: subscriptions.append(1))
    server = fake_redis.connection_pool.connection_kwargs["server"]
    listener.start()
    try:
        assert listener.subscribed.wait(30) and subscriptions == [1]
        server.connected = False  # Redis away
        deadline = time.monotonic() + 30
        while listener.subscribed.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not listener.subscribed.is_set()
        server.connected = True
        assert listener.subscribed.wait(30)
        assert subscriptions == [1, 1]
    finally:
        listener.stop()
        listener.join(5)
