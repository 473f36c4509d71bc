"""A bridge giving held messages back (gearhorn/stomp/queues/giveback.py), on
fakeredis: which it gives back and what it undoes of their hand-outs."""

from __future__ import annotations

import fakeredis
import pytest

from gearhorn.gearman import GrabbedJob
from gearhorn.stomp.queues.dispatchers import Delivery
from gearhorn.stomp.queues.giveback import GiveBack
from gearhorn.store.keys import Keys
from gearhorn.store.redeliveries import Redeliveries

pytestmark = pytest.mark.timeout(30)


def delivery(unique, delivered):
    job = GrabbedJob(b"H:" + unique.encode(), "jobs", unique, b"body")
    d = Delivery(job, worker=None, dispatcher=None, unique=unique.rpartition("^")[0] or unique,
                 tracked=True)
    d.deliveries = int(delivered)
    return d


def test_held_copies_go_back_to_their_holders_and_untaken_ones_are_not_redelivered():
    client = fakeredis.FakeRedis()
    handouts = Redeliveries(client, Keys(), ttl=60)
    key = Keys().handouts("jobs")
    client.hset(key, mapping={"stomp:a": 1, "stomp:b": 1, "order-17": 1})  # each grabbed once
    sent, prefetched = delivery("stomp:a^0", True), delivery("stomp:b^1", False)
    other = delivery("order-17", False)  # another producer's job: gearmand's to requeue
    given = GiveBack(handouts)("jobs", [sent, prefetched, other])
    assert given == [sent, prefetched]  # in the order held
    # The one a client saw comes back redelivered; the one it never saw does not.
    assert {k.decode(): int(v) for k, v in client.hgetall(key).items()} == {
        "stomp:a": 1, "stomp:b": 0, "order-17": 0}
