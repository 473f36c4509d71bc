"""The warden's round costs what changed (issue 49): idle subscriptions are
not read at all; a queue that got copies is judged until its tally is
empty, then left alone again."""

import json

import pytest
import redis

from gearhorn.gearman import Copy
from gearhorn.rules.limits import DROP_HEAD, Limits
from gearhorn.rules.messages import Subscription
from gearhorn.store.deadletters import DeadLetterIndex
from gearhorn.store.headers import HeaderStore
from gearhorn.store.tally import TallyWriter
from gearhorn.worker import counts as counts_module
from gearhorn.worker import warden as warden_module
from gearhorn.worker.reaper import Load, Reaper
from gearhorn.worker.round_report import BACKLOGS_KEPT
from gearhorn.worker.warden import Warden, WardenSettings

pytestmark = pytest.mark.timeout(120)

IDLE = 500
# A round that reads gearmand's status: copies within their limits wait for one.
T = warden_module.STATUS_EVERY


class Counted:
    """Redis commands sent (each command of a pipeline counted) and
    gearmand ``status`` reads, while on."""

    def __init__(self, monkeypatch, loads: dict[str, Load]) -> None:
        self.redis = 0
        self.status = 0
        self.loads = loads
        plain, piped = redis.Redis.execute_command, redis.client.Pipeline.execute

        def command(client, *args, **options):
            if not isinstance(client, redis.client.Pipeline):
                self.redis += 1
            return plain(client, *args, **options)

        def pipeline(pipe, *args, **options):
            self.redis += len(pipe.command_stack)
            return piped(pipe, *args, **options)

        def status(servers, tls=None):
            self.status += 1
            return {q: Load(load.depth, load.running, load.workers)
                    for q, load in self.loads.items()}

        monkeypatch.setattr(redis.Redis, "execute_command", command)
        monkeypatch.setattr(redis.client.Pipeline, "execute", pipeline)
        monkeypatch.setattr(warden_module, "gearmand_loads", status)

    def reset(self) -> None:
        self.redis = self.status = 0


NO_LIMITS = Limits()


def warden_of(registry, defaults: Limits = NO_LIMITS):
    reaper = Reaper((), HeaderStore(registry.redis, registry.keys, 60),
                    DeadLetterIndex(registry.redis, registry.keys))
    return Warden(WardenSettings(servers=(("127.0.0.1", 1),), defaults=defaults),
                  registry, reaper)


def unread_wide_topic(registry, warden, calls):
    """200 queues given one copy each, nobody reading them, judged once
    (the round that reads gearmand's status next); (the queues, the writer)."""
    warden.round(now=1000.0)
    queues = [f"idle.{t}_c{c}" for t in range(20) for c in range(10)]
    writer = TallyWriter(registry.redis, registry.keys)
    writer.add([Copy(q, "u", b"x" * 10) for q in queues], now_ms=1_000_100)
    writer.flush()
    calls.loads = {q: Load(depth=1) for q in queues}
    assert len(warden.round(now=1000.0 + T)) == 200
    return queues, writer


@pytest.fixture
def idle(registry):
    pipe_size = 500
    for start in range(0, IDLE, pipe_size):
        for n in range(start, start + pipe_size):
            registry.subscribe(Subscription(f"idle.{n // 10}", f"c{n % 10}"))
    return registry


def test_an_idle_round_reads_no_subscription(idle, monkeypatch):
    warden = warden_of(idle)
    calls = Counted(monkeypatch, {})
    assert warden.lead()
    warden.round(now=1000.0)  # the one scan of a Redis it has not seen
    calls.reset()
    for second in range(1, 4):
        assert warden.round(now=1000.0 + second) == {}
    # A handful of commands a round, whatever the count; the full scan it
    # replaces read every record and every tally (over 2 * IDLE). Nothing
    # moved: gearmand's status (a line per function) is not read either...
    assert calls.redis <= 3 * 12, calls.redis
    assert calls.status == 0
    # ... but every STATUS_EVERY seconds, for what only gearmand shows.
    warden.round(now=1000.0 + warden_module.STATUS_EVERY + 1)
    assert calls.status == 1


def test_a_queue_that_got_copies_is_judged_until_consumed(idle, monkeypatch):
    warden = warden_of(idle)
    calls = Counted(monkeypatch, {})
    warden.round(now=1000.0)
    busy = "idle.7_c3"
    writer = TallyWriter(idle.redis, idle.keys)
    writer.add([Copy(busy, "u1", b"x" * 10), Copy(busy, "u2", b"y" * 10)], now_ms=1_000_500)
    writer.flush()
    calls.loads = {busy: Load(depth=2)}
    calls.reset()
    assert warden.round(now=1001.0) == {}  # within its limits: judged with the next status
    verdicts = warden.round(now=1000.0 + T)
    assert list(verdicts) == [busy]
    assert verdicts[busy].depth == 2
    assert calls.redis < 40
    calls.loads = {}  # consumed: only gearmand's status shows it
    assert warden.round(now=1001.0 + T) == {}
    later = 1000.0 + 2 * T
    assert list(warden.round(now=later)) == [busy]  # its counts moved
    assert warden.round(now=later + 1) == {}  # empty now: not looked at again
    assert idle.redis.smembers(idle.keys.watched) == set()


def test_a_queue_with_expires_is_looked_at_every_round(idle, monkeypatch):
    idle.subscribe(Subscription("idle.3", "c1", Limits(expires=60)))
    warden = warden_of(idle)
    Counted(monkeypatch, {})
    warden.round(now=1000.0)
    assert list(warden.round(now=1001.0)) == ["idle.3_c1"]


def test_a_tally_from_before_the_set_is_found_by_the_first_scan(idle, monkeypatch):
    """A Redis written by a version without ``<p>watched``: its tallies are
    found once, by the scan, then judged."""
    queue = "idle.4_c2"
    writer = TallyWriter(idle.redis, idle.keys)
    writer.add([Copy(queue, "u", b"z")], now_ms=999_000)
    writer.flush()
    idle.redis.delete(idle.keys.watched)
    warden = warden_of(idle)
    Counted(monkeypatch, {queue: Load(depth=1)})
    assert queue in warden.round(now=1000.0)


def test_a_round_that_lost_its_lease_stops_judging(idle, monkeypatch):
    """A long round (a burst of new subscriptions) renews the lease as it
    goes; once another process holds it, this one stops: two wardens
    judging one queue would both take its surplus."""
    monkeypatch.setattr(warden_module, "LEASE_CHECK", 100)
    warden = warden_of(idle)
    Counted(monkeypatch, {})
    assert warden.lead()
    warden.round(now=1000.0)
    for n in range(300):
        idle.subscribe(Subscription("burst", f"c{n}"))
    idle.redis.set(idle.keys.warden, "another process")
    assert warden.round(now=1001.0) == {}
    # Left for the process that holds the lease now.
    assert idle.redis.scard(idle.keys.renewed) == 300


def test_a_queue_whose_counts_did_not_move_is_not_judged_again(idle, monkeypatch):
    """A wide topic whose subscribers do not read: its queues hold copies
    round after round, the same verdict each time."""
    warden = warden_of(idle)
    calls = Counted(monkeypatch, {})
    queues, _ = unread_wide_topic(idle, warden, calls)
    assert warden.round(now=1000.0 + 2 * T) == {}  # nothing moved
    backlogs = json.loads(idle.redis.get(idle.keys.backlogs))["queues"]
    assert len(backlogs) == BACKLOGS_KEPT  # still reported
    calls.loads[queues[5]] = Load(depth=0)  # consumed
    assert list(warden.round(now=1000.0 + 3 * T)) == [queues[5]]


def test_a_queue_with_a_ttl_is_judged_again_when_a_copy_comes_due(idle, monkeypatch):
    idle.subscribe(Subscription("ttl", "c", Limits(message_ttl=5)))
    warden = warden_of(idle)
    calls = Counted(monkeypatch, {})
    warden.round(now=1000.0)
    writer = TallyWriter(idle.redis, idle.keys)
    writer.add([Copy("ttl_c", "u", b"x")], now_ms=1_000_000)
    writer.flush()
    calls.loads = {"ttl_c": Load(depth=1)}
    assert list(warden.round(now=1001.0)) == ["ttl_c"]
    assert warden.round(now=1002.0) == {}
    assert list(warden.round(now=1006.0)) == ["ttl_c"]  # its copy is 6 s old


def test_new_limits_get_a_steady_queue_judged_again(idle, monkeypatch):
    warden = warden_of(idle)
    calls = Counted(monkeypatch, {})
    warden.round(now=1000.0)
    queue = "idle.9_c9"
    writer = TallyWriter(idle.redis, idle.keys)
    writer.add([Copy(queue, f"u{n}", b"x") for n in range(8)], now_ms=1_000_100)
    writer.flush()
    calls.loads = {queue: Load(depth=8)}
    assert list(warden.round(now=1000.0 + T)) == [queue]
    assert warden.round(now=1000.0 + 2 * T) == {}  # steady
    idle.subscribe(Subscription("idle.9", "c9", Limits(max_length=3, overflow=DROP_HEAD)))
    verdicts = warden.round(now=1001.0 + 2 * T)  # subscribed anew: judged at once
    assert verdicts[queue].drop == 5


def test_copies_over_a_limit_end_a_quiet_spell(idle, monkeypatch):
    """More copies tallied than a drop-head queue may hold: gearmand may hold
    them all, so the round reads its status and drops the surplus now."""
    idle.subscribe(Subscription("idle.2", "c2", Limits(max_length=3, overflow=DROP_HEAD)))
    warden = warden_of(idle)
    calls = Counted(monkeypatch, {})
    warden.round(now=1000.0)
    assert warden.round(now=1001.0) == {}
    calls.reset()
    writer = TallyWriter(idle.redis, idle.keys)
    writer.add([Copy("idle.2_c2", f"u{n}", b"x") for n in range(5)], now_ms=1_001_500)
    writer.flush()
    calls.loads = {"idle.2_c2": Load(depth=5)}
    verdicts = warden.round(now=1002.0)
    assert list(verdicts) == ["idle.2_c2"]
    assert verdicts["idle.2_c2"].drop == 2
    assert calls.status == 1


def test_copies_within_their_limits_wait_for_the_next_status(idle, monkeypatch):
    """A steady stream of fanouts to a few topics, every queue within the
    defaults' 10,000 copies: no round reads gearmand's status for them
    (a line per function it knows) until STATUS_EVERY has passed."""
    warden = warden_of(idle, Limits(max_length=10_000, max_bytes=16 << 20, overflow=DROP_HEAD))
    calls = Counted(monkeypatch, {})
    warden.round(now=1000.0)
    writer = TallyWriter(idle.redis, idle.keys)
    for second in range(1, int(T)):
        writer.add([Copy(f"idle.2_c{c}", f"u{second}", b"x") for c in range(10)],
                   now_ms=1_000_000 + second * 1000)
        writer.flush()
        calls.loads = {f"idle.2_c{c}": Load(depth=second) for c in range(10)}
        assert warden.round(now=1000.0 + second) == {}
    assert calls.status == 1
    assert len(warden.round(now=1000.0 + T)) == 10
    assert calls.status == 2


def test_stream_readers_coming_and_going_wake_no_round(idle, monkeypatch):
    """A STOMP topic reader (the real-time default) has no queue: a browser
    tab opening does not make the warden read gearmand's status."""
    warden = warden_of(idle)
    calls = Counted(monkeypatch, {})
    warden.round(now=1000.0)
    warden.round(now=1001.0)
    calls.reset()
    idle.subscribe(Subscription("idle.1", "+reader1"))
    assert warden.round(now=1002.0) == {}
    assert calls.status == 0


def test_a_lease_taken_anew_forgets_what_it_knew(idle, monkeypatch):
    """Another process judged meanwhile: no queue counts as steady."""
    warden = warden_of(idle)
    Counted(monkeypatch, {"idle.5_c5": Load(depth=1)})
    writer = TallyWriter(idle.redis, idle.keys)
    writer.add([Copy("idle.5_c5", "u", b"x")], now_ms=999_900)
    writer.flush()
    assert warden.lead()
    assert "idle.5_c5" in warden.round(now=1000.0)
    idle.redis.delete(idle.keys.warden)  # the lease went, and another took and left it
    assert warden.lead()
    later = 1001.0 + warden_module.STATUS_EVERY
    assert "idle.5_c5" in warden.round(now=later)


def test_a_lease_another_took_is_neither_renewed_nor_led(idle):
    """The lease ran out and another process took it: this one stops, and
    leaves the other's lease to run as the other set it."""
    warden = warden_of(idle)
    assert warden.lead()
    idle.redis.set(idle.keys.warden, "another", px=60_000)
    assert not warden.lead()
    assert idle.redis.get(idle.keys.warden) == b"another"
    assert idle.redis.pttl(idle.keys.warden) > 3_000  # not cut to this one's ttl
    idle.redis.delete(idle.keys.warden)
    assert warden.lead() and warden.lead()  # taken anew, then renewed


def test_copies_elsewhere_do_not_make_a_round_read_steady_queues(idle, monkeypatch):
    """A wide topic's unread queues hold copies while another topic gets
    fanouts every second: a round reads the sums of what was tallied, not
    of every queue holding copies (200 here; 100,000 after a wide fanout)."""
    warden = warden_of(idle)
    calls = Counted(monkeypatch, {})
    _, writer = unread_wide_topic(idle, warden, calls)
    busy = "idle.30_c1"
    for turn in range(2, 6):  # each round reads gearmand's status
        writer.add([Copy(busy, f"b{turn}", b"y")], now_ms=1_000_000 + int(turn * T * 1000))
        writer.flush()
        calls.loads[busy] = Load(depth=turn - 1)
        calls.reset()
        assert list(warden.round(now=1000.0 + turn * T)) == [busy]
        assert calls.redis < 40, calls.redis  # the old rounds read 200 sums each


def test_a_queue_first_seen_in_gearmand_gets_its_sums_read_before_a_status(idle, monkeypatch):
    """Sums read after gearmand's counts would take a copy tallied in
    between for a consumed one, and forget the oldest entry, still queued.
    A queue this process never judged is read before the next status."""
    queue = "idle.6_c6"
    writer = TallyWriter(idle.redis, idle.keys)
    writer.add([Copy(queue, "u1", b"x")], now_ms=999_000)
    writer.flush()
    # Known only to gearmand: no round took it from a set (another process
    # did, then lost the lease).
    idle.redis.delete(idle.keys.watched, idle.keys.tallied, idle.keys.renewed)
    idle.redis.set(idle.keys.warden_scanned, "1")
    warden = warden_of(idle)
    calls = Counted(monkeypatch, {queue: Load(depth=1)})
    assert warden.lead()
    status = warden_module.gearmand_loads

    def status_then_a_copy(servers, tls=None):
        loads = status(servers, tls)
        writer.add([Copy(queue, "u2", b"y")], now_ms=1_000_500)  # queued after the count
        writer.flush()
        calls.loads = {queue: Load(depth=2)}
        return loads

    monkeypatch.setattr(warden_module, "gearmand_loads", status_then_a_copy)
    warden.round(now=1000.0)
    monkeypatch.setattr(warden_module, "gearmand_loads", status)
    verdicts = warden.round(now=1000.0 + T)
    assert verdicts[queue].oldest_ms == 999_000  # its first copy is still the oldest
    assert idle.redis.llen(idle.keys.tally(queue)) == 2


def test_a_slow_status_spaces_the_rounds_out_and_lengthens_the_lease(idle, monkeypatch):
    """A million functions in gearmand: a ``status`` read takes seconds. The
    rounds then read it at most a quarter of the time, and the lease
    outlasts a read (run out inside one, another process would take it)."""
    clock = [0.0]
    monkeypatch.setattr(counts_module, "monotonic", lambda: clock[0])
    calls = Counted(monkeypatch, {})
    counted = warden_module.gearmand_loads

    def slow_status(servers, tls=None):
        clock[0] += 2.0
        return counted(servers, tls)

    monkeypatch.setattr(warden_module, "gearmand_loads", slow_status)
    idle.subscribe(Subscription("idle.1", "c1", Limits(message_ttl=60)))  # judged each change
    warden = warden_of(idle)
    assert warden.lead()
    warden.round(now=1000.0)
    assert warden.lead()
    assert idle.redis.pttl(idle.keys.warden) > 5000  # three reads, not three intervals
    writer = TallyWriter(idle.redis, idle.keys)
    writer.add([Copy("idle.1_c1", "u", b"x")], now_ms=1_000_500)
    writer.flush()
    calls.loads = {"idle.1_c1": Load(depth=1)}
    calls.reset()
    assert warden.round(now=1003.0) == {}  # 3 s after a read of 2 s
    assert calls.status == 0
    assert list(warden.round(now=1006.5)) == ["idle.1_c1"]
    assert calls.status == 1


def test_a_wall_clock_set_back_does_not_stop_the_rounds(idle, monkeypatch):
    """NTP steps the clock back an hour: the last status read is then "in
    the future", and the rounds must not wait an hour for gearmand's counts."""
    warden = warden_of(idle)
    calls = Counted(monkeypatch, {})
    warden.round(now=5000.0)
    calls.reset()
    warden.round(now=5000.0 - 3600)
    assert calls.status == 1
