from gearhorn.rules.limits import Limits
from gearhorn.rules.messages import Subscription
from gearhorn.store.bridges import BridgeLiveness, queue_entry, topic_entry
from gearhorn.worker.janitor import Janitor


def test_what_a_dead_bridge_held_is_removed_once(registry):
    dropped = []
    alive = BridgeLiveness(registry, "b-alive", ttl=5)
    dead = BridgeLiveness(registry, "b-dead", ttl=5)
    for bridge, client in ((alive, "s1"), (dead, "s2")):
        bridge.heartbeat(now=1000)
        bridge.holds(topic_entry("news", client))
        registry.subscribe(Subscription("news", client))
    dead.holds(queue_entry("gearhorn.tmp.abc.r"))
    registry.subscribe(Subscription("news", "durable1"))  # listed by no bridge
    alive.heartbeat(now=1010)

    janitor = Janitor(registry, dropped.append)
    assert janitor.sweep(now=1007) == 1  # b-dead's heartbeat ran out at 1005
    assert registry.subscribers("news") == {"s1", "durable1"}
    assert sorted(dropped) == ["gearhorn.tmp.abc.r", "news_s2"]
    assert janitor.sweep(now=1007) == 0 and len(dropped) == 2  # nothing left, nothing twice


def test_a_clean_stop_leaves_nothing_to_sweep(registry):
    bridge = BridgeLiveness(registry, "b", ttl=5)
    bridge.heartbeat(now=1000)
    bridge.holds(topic_entry("news", "s1"))
    bridge.released(topic_entry("news", "s1"))
    bridge.retire()
    assert Janitor(registry, lambda f: None).sweep(now=2000) == 0
    assert not registry.redis.exists("t:bridge:b")


def test_a_bridge_swept_while_alive_registers_again(registry):
    bridge = BridgeLiveness(registry, "slow", ttl=5)
    bridge.heartbeat(now=1000)
    bridge.holds(topic_entry("news", "s1"))
    registry.subscribe(Subscription("news", "s1"))
    Janitor(registry, lambda f: None).sweep(now=1010)  # its heartbeats were late
    assert registry.subscribers("news") == set()
    bridge.heartbeat(now=1011)
    assert registry.subscribers("news") == {"s1"}
    assert registry.redis.smembers("t:bridge:slow") == {b"topic\tnews\ts1"}


def test_a_bridge_registers_again_with_the_limits_and_bridge_it_had(registry):
    bridge = BridgeLiveness(registry, "slow", ttl=5)
    bridge.heartbeat(now=1000)
    subscription = Subscription("news", "s1", Limits(max_length=7, overflow="drop-head"),
                                bridge="slow")
    bridge.holds(topic_entry("news", "s1"), subscription)
    registry.subscribe(subscription)
    Janitor(registry, lambda f: None).sweep(now=1010)
    bridge.heartbeat(now=1011)
    record, limits = registry.subscription("news_s1")
    assert limits == Limits(max_length=7, overflow="drop-head")
    assert record["bridge"] == "slow"


def test_subscriptions_coming_and_going_while_a_bridge_registers_again(registry):
    """Under gevent, sessions change what the bridge holds during the
    restore's Redis calls: it must neither fail nor bring back a
    subscription released meanwhile."""
    bridge = BridgeLiveness(registry, "slow", ttl=5)
    bridge.heartbeat(now=1000)
    for client in ("s1", "s2"):
        bridge.holds(topic_entry("news", client), Subscription("news", client))
        registry.subscribe(Subscription("news", client))
    bridge.holds(queue_entry("gearhorn.tmp.s1.r"))
    Janitor(registry, lambda f: None).sweep(now=1010)
    subscribe = registry.subscribe
    calls = []

    def meanwhile(subscription):
        calls.append(subscription.client_id)
        if len(calls) == 1:  # during the first one, as a session would
            bridge.holds(topic_entry("news", "s3"), Subscription("news", "s3"))
            subscribe(Subscription("news", "s3"))
            gone = "s2" if subscription.client_id == "s1" else "s1"
            bridge.releasing(topic_entry("news", gone))
            registry.unsubscribe(Subscription("news", gone))
            bridge.released(topic_entry("news", gone))
            bridge.releasing(topic_entry("news", subscription.client_id))
            registry.unsubscribe(subscription)  # lands before the restore's subscribe
            bridge.released(queue_entry("gearhorn.tmp.s1.r"))  # its connection closed
        return subscribe(subscription)

    registry.subscribe = meanwhile
    bridge.heartbeat(now=1011)
    assert calls[0] in ("s1", "s2") and len(calls) == 1  # the other was released: skipped
    registry.subscribe = subscribe
    bridge.released(topic_entry("news", calls[0]))
    assert registry.subscribers("news") == {"s3"}
    assert registry.redis.smembers("t:bridge:slow") == {b"topic\tnews\ts3"}
    assert registry.redis.smembers("t:temp-queues") == set()


def test_temp_queues_are_listed_while_they_live(registry):
    bridge = BridgeLiveness(registry, "b", ttl=5)
    bridge.heartbeat(now=1000)
    bridge.holds(queue_entry("gearhorn.tmp.s1.r"))
    bridge.holds(queue_entry("gearhorn.tmp.s2.r"))
    assert registry.redis.smembers("t:temp-queues") == {b"gearhorn.tmp.s1.r",
                                                        b"gearhorn.tmp.s2.r"}
    bridge.released(queue_entry("gearhorn.tmp.s1.r"))
    Janitor(registry, lambda f: None).sweep(now=2000)  # the bridge died
    assert registry.redis.smembers("t:temp-queues") == set()
