"""With copies = held the warden counts a queue's copies from gearhorn's
own records (issue 63): exact, whether gearmand is up, restarted empty or
holds jobs others sent, and without gearmand's ``status`` (a line per
function it knows) unless a copy must be taken or consumers looked for."""

import pytest

from gearhorn.gearman import Copy
from gearhorn.rules.limits import DROP_HEAD, REJECT_PUBLISH, Limits
from gearhorn.rules.messages import Subscription
from gearhorn.store.deadletters import DeadLetterIndex
from gearhorn.store.headers import HeaderStore
from gearhorn.store.heldcopies import HeldCopies, HeldCopy, handed_unique
from gearhorn.store.tally import TallyReader, TallyWriter
from gearhorn.worker import warden as warden_module
from gearhorn.worker.reaper import Load, Reaper
from gearhorn.worker.warden import Warden, WardenSettings

pytestmark = pytest.mark.timeout(120)

T = warden_module.STATUS_EVERY
QUEUE = "news_alice"


class Gearmand:
    """gearmand's ``status`` as the warden reads it: what it says, and how
    often it was asked."""

    def __init__(self, monkeypatch) -> None:
        self.loads: dict[str, Load] = {}
        self.reads = 0
        monkeypatch.setattr(warden_module, "gearmand_loads", self.status)

    def status(self, servers, tls=None) -> dict[str, Load]:
        self.reads += 1
        return {q: Load(load.depth, load.running, load.workers, dict(load.waiting))
                for q, load in self.loads.items()}


@pytest.fixture
def gearmand(monkeypatch):
    return Gearmand(monkeypatch)


def warden_of(registry, held: bool) -> Warden:
    reaper = Reaper((), HeaderStore(registry.redis, registry.keys, 60),
                    DeadLetterIndex(registry.redis, registry.keys))
    warden = Warden(WardenSettings(servers=(("127.0.0.1", 1),), held=held), registry, reaper)
    assert warden.lead()
    return warden


def held_copies(registry, count: int, at_ms: int, queue: str = QUEUE) -> None:
    """``count`` copies made by a fanout: their records, then their tally."""
    copies = [HeldCopy(queue, f"u{at_ms}.{n}", b"x" * 10, "holder-1") for n in range(count)]
    assert len(HeldCopies(registry.redis, registry.keys).keep(copies)) == count
    writer = TallyWriter(registry.redis, registry.keys)
    writer.add([Copy(queue, c.unique, c.data) for c in copies], now_ms=at_ms)
    writer.flush()


def answered(registry, count: int, queue: str = QUEUE) -> None:
    """The first ``count`` records of ``queue`` answered by its receiver."""
    records = HeldCopies(registry.redis, registry.keys)
    keys = sorted(k.decode() for k in registry.redis.hkeys(registry.keys.copies(queue)))
    records.forget([(queue, handed_unique(key, 0)) for key in keys[:count]])


@pytest.mark.parametrize("held", [True, False], ids=["held", "gearmand"])
def test_copies_a_restarted_gearmand_lost_are_still_counted_with_their_age(
        registry, gearmand, held):
    """gearmand came back empty (memory queue) while the holder hands the
    copies again: gearmand's count (0) would make every tally entry look
    consumed, so their TTL would no longer be kept; the records still
    hold all three, and the oldest is still the oldest."""
    registry.subscribe(Subscription("news", "alice", Limits(message_ttl=3600)))
    warden = warden_of(registry, held)
    warden.round(now=1000.0)
    held_copies(registry, 3, at_ms=1_000_500)
    verdicts = warden.round(now=1000.0 + T)  # gearmand says nothing of the queue
    if held:
        assert verdicts[QUEUE].depth == 3
        assert verdicts[QUEUE].oldest_ms == 1_000_500
        assert registry.redis.llen(registry.keys.tally(QUEUE)) == 1
    else:  # what copies = gearmand can know: nothing queued, the tally forgotten
        assert verdicts[QUEUE].depth == 0
        assert registry.redis.llen(registry.keys.tally(QUEUE)) == 0


def test_a_round_with_changes_counts_the_records_not_gearmands_status(registry, gearmand):
    warden = warden_of(registry, held=True)
    warden.round(now=1000.0)
    assert gearmand.reads == 1  # the first round reads both
    registry.subscribe(Subscription("news", "alice", Limits(message_ttl=3600)))
    held_copies(registry, 2, at_ms=1_000_500)
    verdicts = warden.round(now=1001.0)  # subscribed since: judged now
    assert verdicts[QUEUE].depth == 2
    answered(registry, 1)
    registry.subscribe(Subscription("news", "alice", Limits(message_ttl=7200)))  # renewed
    verdicts = warden.round(now=1002.0)
    assert verdicts[QUEUE].depth == 1  # one consumed: its entry's copy
    assert gearmand.reads == 1
    warden.round(now=1000.0 + T)  # and every STATUS_EVERY for what only gearmand knows
    assert gearmand.reads == 2


def test_a_copy_to_take_reads_gearmands_status_once_a_round(registry, gearmand):
    """Taking copies from a queue's head needs the servers they wait on."""
    registry.subscribe(Subscription("news", "alice", Limits(max_length=2, overflow=DROP_HEAD)))
    registry.subscribe(Subscription("news", "bob", Limits(max_length=1, overflow=DROP_HEAD)))
    warden = warden_of(registry, held=True)
    warden.round(now=1000.0)
    held_copies(registry, 5, at_ms=1_000_500)
    held_copies(registry, 3, at_ms=1_000_500, queue="news_bob")
    server = ("127.0.0.1", 1)
    gearmand.loads = {QUEUE: Load(5, 0, 0, {server: 5}), "news_bob": Load(3, 0, 0, {server: 3})}
    taken = []
    warden.enforcing.reaper.take = lambda queue, count, waiting, reason: taken.append(
        (queue, count, dict(waiting))) or []
    verdicts = warden.round(now=1001.0)
    assert gearmand.reads == 2
    assert (verdicts[QUEUE].drop, verdicts["news_bob"].drop) == (3, 2)
    assert sorted(taken) == [(QUEUE, 3, {server: 5}), ("news_bob", 2, {server: 3})]


def test_a_full_reject_publish_queue_is_marked_from_its_records(registry, gearmand):
    registry.subscribe(Subscription("news", "alice",
                                    Limits(max_length=3, overflow=REJECT_PUBLISH)))
    warden = warden_of(registry, held=True)
    warden.round(now=1000.0)
    held_copies(registry, 3, at_ms=1_000_500)
    registry.subscribe(Subscription("news", "alice",
                                    Limits(max_length=3, overflow=REJECT_PUBLISH)))
    verdicts = warden.round(now=1001.0)
    assert verdicts[QUEUE].full
    assert registry.redis.sismember(registry.keys.full, QUEUE)
    answered(registry, 2)
    registry.subscribe(Subscription("news", "alice",
                                    Limits(max_length=3, overflow=REJECT_PUBLISH)))
    verdicts = warden.round(now=1002.0)
    assert not verdicts[QUEUE].full and verdicts[QUEUE].room == 2
    assert not registry.redis.sismember(registry.keys.full, QUEUE)
    assert gearmand.reads == 1


def test_a_queue_with_expires_is_looked_at_with_gearmands_consumers(registry, gearmand):
    registry.subscribe(Subscription("news", "alice", Limits(expires=60)))
    warden = warden_of(registry, held=True)
    warden.round(now=1000.0)
    held_copies(registry, 1, at_ms=1_000_500)
    gearmand.loads = {QUEUE: Load(1, 0, 1)}  # a consumer is there
    warden.round(now=1001.0)
    assert gearmand.reads == 2
    assert registry.redis.get(registry.keys.consumed(QUEUE)) == b"1001.0"


def test_a_queue_judged_before_is_judged_again_from_its_records(registry, gearmand):
    """A queue remembered from an earlier round, not tallied since, whose
    oldest copy's TTL comes due: its count is its records', not none."""
    registry.subscribe(Subscription("news", "alice", Limits(message_ttl=1)))
    warden = warden_of(registry, held=True)
    warden.round(now=1000.0)
    held_copies(registry, 2, at_ms=1_000_500)
    server = ("127.0.0.1", 1)
    registry.subscribe(Subscription("news", "alice", Limits(message_ttl=1)))
    assert warden.round(now=1001.0)[QUEUE].takes == 0  # young yet
    gearmand.loads = {QUEUE: Load(2, 0, 0, {server: 2})}
    taken = []
    warden.enforcing.reaper.take = lambda queue, count, waiting, reason: taken.append(
        (queue, count, reason)) or []
    verdicts = warden.round(now=1002.0)  # due: judged, and read from gearmand to take
    assert verdicts[QUEUE].expire == 2
    assert taken == [(QUEUE, 2, None)]


def test_entries_forgotten_twice_take_no_newer_one_with_them(registry):
    """Two wardens judged the same entries consumed: one whose lease ran
    out mid-round and the one that took it. Trimmed twice by count, the
    second would take the entry of a copy still queued with them."""
    held_copies(registry, 1, at_ms=1_000_500)
    answered(registry, 1)
    reader = TallyReader(registry.redis, registry.keys)
    [consumed] = reader.read(reader.sums([QUEUE]))[QUEUE].window
    assert reader.forget(QUEUE, [consumed])
    held_copies(registry, 2, at_ms=1_000_900)  # still queued
    assert not reader.forget(QUEUE, [consumed])  # the late warden's
    [left] = reader.read(reader.sums([QUEUE]))[QUEUE].window
    assert (left.at_ms, left.count, left.size) == (1_000_900, 2, 20)
    assert reader.sums([QUEUE]) == {QUEUE: (2, 20)}
