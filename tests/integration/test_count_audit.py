"""The count-first audit's reads on a real Redis (and a Redis Cluster): the
writers' counts and ledger rows as two holders write them through the
project's Ledger, a copy answered in two hand-outs (once by the holder
taken for dead, once by its taker) found as a duplicate, a copy passed over
found as never_delivered, and nothing reported again after a restart."""

import pytest

from gearhorn.pipeline.audit import AuditSettings
from gearhorn.pipeline.countaudit import CountAudit
from gearhorn.rules.auditcounts import bucket_of
from gearhorn.rules.events import Event
from gearhorn.store import redisconn
from gearhorn.store.keys import Keys
from gearhorn.store.ledger import Ledger, now_ms

from .helpers import unique_topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SHARDS = 8


def holder(client, name):
    return Ledger(client, Keys(), source=name, shards=SHARDS)


def made(ledger, topic, client_id, message_id):
    """A copy kept by ``ledger``'s holder: counted made, its fanout's row."""
    queue, unique = f"{topic}_{client_id}", f"{message_id}:{client_id}"
    ledger.counts.enqueued(queue, bucket_of(now_ms()))
    ledger.published(topic, message_id, [(queue, unique)])
    return queue, unique


def next_ms():
    """Until the clock has moved on a few ms: copies enqueued after others."""
    start = now_ms()
    while now_ms() < start + 3:
        pass


def answered(ledger, queue, unique, generation, known=True):
    ledger.record(Event.ANSWERED, queue, unique, reason="complete", generation=generation)
    ledger.counts.settled(queue, bucket_of(now_ms()) if known else None, now_ms())


def rounds_until_done(audit):
    """Rounds until the streams are read and no closer look is left (each
    runs in a thread; the round after it ends tells what it found)."""
    while not audit.round():
        pass
    while audit.looking:
        audit.wait_for_looks(60)
        audit.round()


@pytest.mark.cluster_too
def test_a_copy_answered_in_two_hand_outs_and_one_passed_over_are_named_once(
        redis_url, tmp_path):
    client = redisconn.connect(redis_url)
    topic = unique_topic("counted")
    zombie, taker = holder(client, "zombie"), holder(client, "taker")
    twice, _ = made(zombie, topic, "a", "m0"), made(zombie, topic, "a", "m1")
    for unique in ("m0:a", "m1:a"):
        answered(zombie, twice[0], unique, 0)
    answered(taker, twice[0], twice[1], 1, known=False)  # handed again, run again
    passed_over = made(zombie, topic, "b", "m2")
    next_ms()
    made(zombie, topic, "b", "m3")
    next_ms()
    answered(zombie, passed_over[0], "m3:b", 0)
    for ledger in (zombie, taker):
        ledger.flush()

    settings = AuditSettings(str(tmp_path / "audit"), deadline_ms=1000, lateness_ms=500,
                             interval_s=1, from_start=True, shards=SHARDS)
    told = []
    later = lambda: now_ms() + 30_000  # noqa: E731 (every bucket written is due)
    audit = CountAudit(client, Keys(), settings, lambda state, found: told.extend(found),
                       clock=later)
    audit.begin()
    rounds_until_done(audit)
    assert sorted((f.kind, f.message_id, f.subscriber, f.unique) for f in told) == [
        ("duplicate", "m0", f"{topic}_a", "m0:a"),
        ("never_delivered", "m2", f"{topic}_b", "m2:b")]

    again = CountAudit(client, Keys(), settings, lambda state, found: told.extend(found),
                       clock=later)
    again.begin()
    rounds_until_done(again)
    assert len(told) == 2 and again.state.kind_totals()["duplicate"] == 1
