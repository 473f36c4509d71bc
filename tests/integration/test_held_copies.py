"""copies = held: gearhorn keeps every copy in Redis and gearmand only
dispatches it, so a gearmand started with no queue options, killed with -9
mid-run and started again, loses no acknowledged copy; neither does a
worker process killed while it holds copies (another one takes them
over). With copies = gearmand, the same gearmand crash loses the copies it
had queued: the difference this mode makes.

Every acknowledged fanout's id is looked up in every subscriber's queue,
drained by a plain Gearman worker as any consumer would; duplicates are
allowed (a copy a receiver held when its holder went comes again)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading

import pytest
import redis

from gearhorn.client import Producer
from gearhorn.config import Config
from gearhorn.rules.naming import durable_client_id
from gearhorn.store import redisconn
from gearhorn.store.keys import Keys
from gearhorn.supervision import servers
from tests.needs import require_binary

from .helpers import PoolProcess, drain_jobs, nothing_held, queue_depth, unique_topic, wait_for
from .spark_helpers import reconcile
from .stomp_helpers import BridgeProcess, StompClient

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SUBSCRIBERS = ["alice", "bob", "carol"]
HELD = {"GEARHORN_COPIES": "held", "GEARHORN_QUEUE_MAX_LENGTH": "0",
        "GEARHORN_QUEUE_MAX_BYTES": "0", "GEARHORN_HEARTBEAT_INTERVAL": "0.3",
        "GEARHORN_WORKER_TTL": "2"}


class Restartable:
    """A gearmand with no queue options, killed and started again on its port."""

    def __init__(self, data_dir):
        self.data_dir = data_dir
        self.server = servers.start_gearmand(data_dir=data_dir)

    def kill_and_start(self):
        self.server.kill()
        self.server = servers.start_gearmand(self.server.port, self.data_dir)

    def stop(self):
        self.server.stop()


@pytest.fixture
def gearmand_again(tmp_path):
    running = Restartable(str(tmp_path / "gearmand"))
    yield running
    running.stop()


class Publishing:
    """Background fanouts at full speed; the ids gearhorn acknowledged."""

    def __init__(self, server, topic):
        self.server, self.topic = server, topic
        self.acked: list[str] = []
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def count(self):
        with self.lock:
            return len(self.acked)

    def stop(self):
        self.stopping.set()
        self.thread.join(60)

    def _run(self):
        i = 0
        while not self.stopping.is_set():
            producer = Producer([(self.server.host, self.server.port)], timeout=30)
            try:
                while not self.stopping.is_set():
                    ident = f"m{i}"
                    i += 1
                    result = producer.publish(self.topic, ident, background=True)
                    if result.get("copies") == len(SUBSCRIBERS):
                        with self.lock:
                            self.acked.append(ident)
            except Exception:  # noqa: BLE001 - gearmand went away: not acknowledged
                self.stopping.wait(0.2)
            finally:
                producer.client.close()


def answers_in_ledger(client):
    """The held copies' answers flushed to the ledger so far."""
    return sum(value.count(b"answered\t") for shard in range(Config().ledger_shards)
               for _, fields in client.xrange(Keys().ledger(shard)) for value in fields.values())


def delivered(server, topic):
    """What each subscriber's queue holds now, drained as a consumer would."""
    return {who: {j.data.decode() for j in drain_jobs(server, f"{topic}_{who}")}
            for who in SUBSCRIBERS}


def all_delivered(server, topic, acked, timeout=180):
    """Drain every subscriber's queue until each has had every ``acked`` id
    (duplicates allowed); what each got. An AssertionError names what is
    missing."""
    got = {who: set() for who in SUBSCRIBERS}

    def done():
        for who, found in delivered(server, topic).items():
            got[who] |= found
        return all(acked <= found for found in got.values())
    try:
        wait_for(done, timeout, interval=0.5, message="every acknowledged copy everywhere")
    except AssertionError:
        missing = {w: sorted(acked - got[w], key=lambda m: int(m[1:]))[:8] for w in got}
        raise AssertionError(f"missing after {timeout}s: {missing}") from None
    return got


def subscribe_all(server, topic):
    with Producer([(server.host, server.port)]) as producer:
        for who in SUBSCRIBERS:
            producer.subscribe(topic, who)


def run_through_a_gearmand_crash(gearmand_again, redis_url, tmp_path, env):
    server = gearmand_again.server
    pool = PoolProcess([server], redis_url, processes=2, log_dir=str(tmp_path), env=env)
    topic = unique_topic("held")
    try:
        pool.wait_ready()
        subscribe_all(server, topic)
        load = Publishing(server, topic)
        wait_for(lambda: load.count() >= 300, 120, message="300 fanouts acknowledged")
        gearmand_again.kill_and_start()
        before = load.count()
        wait_for(lambda: load.count() >= before + 100, 120,
                 message="fanouts acknowledged after the restart")
        load.stop()
        acked = set(load.acked)
        return acked, pool, topic
    except BaseException:
        pool.stop()
        raise


@pytest.mark.cluster_too  # a queue's records in one hash slot, its holder index apart
def test_a_plain_gearmand_killed_mid_run_loses_no_acknowledged_copy(
        gearmand_again, redis_url, tmp_path, report):
    require_binary("java", "default-jre-headless")  # for the reconciliation at the end
    acked, pool, topic = run_through_a_gearmand_crash(gearmand_again, redis_url, tmp_path,
                                                      HELD)
    server = gearmand_again.server
    records = redisconn.connect(redis_url)
    try:
        try:
            all_delivered(server, topic, acked)
        except AssertionError as exc:
            left = {w: records.hlen(Keys().copies(f"{topic}_{w}")) for w in SUBSCRIBERS}
            raise AssertionError(f"{exc}; records left {left}") from None
        wait_for(lambda: all(records.hlen(Keys().copies(f"{topic}_{w}")) == 0
                             for w in SUBSCRIBERS), 60,
                 message="every answered copy forgotten")
        wait_for(lambda: answers_in_ledger(records) >= len(acked) * len(SUBSCRIBERS), 60,
                 message="every answer in the ledger")
        # Plain Gearman subscribers are tracked now: the reconciliation
        # proves their delivery instead of counting what gearmand still holds.
        problems, untracked = reconcile(redis_url, tmp_path / "report", server)
    finally:
        pool.stop()
        records.close()
    assert (problems, untracked) == ([], {})
    report(f"copies = held: {len(acked):,} fanouts acknowledged across a kill -9 of a plain "
           f"gearmand; all reached all {len(SUBSCRIBERS)} subscribers, their records were "
           f"dropped once taken, and the reconciliation of the ledger is clean")


def test_with_copies_in_gearmand_the_same_crash_loses_acknowledged_copies(
        gearmand_again, redis_url, tmp_path, report):
    """The code before held copies, on the same run: what it cost."""
    env = {**HELD, "GEARHORN_COPIES": "gearmand"}
    acked, pool, topic = run_through_a_gearmand_crash(gearmand_again, redis_url, tmp_path, env)
    try:
        got = delivered(gearmand_again.server, topic)
    finally:
        pool.stop()
    lost = {who: len(acked - found) for who, found in got.items()}
    assert all(lost.values()), f"nothing lost without held copies? {lost}"
    report(f"copies = gearmand: {len(acked):,} acknowledged, lost per subscriber {lost}")


@pytest.mark.parametrize("copies", ["held", "gearmand"])
def test_a_foreground_fanouts_copies_not_yet_taken_outlive_a_gearmand_crash(
        copies, gearmand_again, redis_url, tmp_path, report):
    """A foreground fanout whose receivers are away answers ``timeout`` with
    ``"queued": true``. Held, those copies outlive a kill -9 of gearmand
    and reach their receivers; kept by gearmand alone, they are gone."""
    server = gearmand_again.server
    env = {**HELD, "GEARHORN_COPIES": copies, "GEARHORN_FANOUT_TIMEOUT": "1"}
    pool = PoolProcess([server], redis_url, processes=2, log_dir=str(tmp_path), env=env)
    topic = unique_topic("heldfg")
    try:
        pool.wait_ready()
        subscribe_all(server, topic)
        sent = {f"g{i}" for i in range(20)}
        with Producer([(server.host, server.port)], timeout=60) as producer:
            results = [producer.publish(topic, ident) for ident in sorted(sent)]
        for result in results:
            assert result["completed"] == 0, result
            assert sorted((f["client_id"], f["status"], f["queued"]) for f in result["failed"]
                          ) == [(who, "timeout", True) for who in SUBSCRIBERS], result
        gearmand_again.kill_and_start()
        server = gearmand_again.server
        if copies == "held":
            all_delivered(server, topic, sent)
            records = redisconn.connect(redis_url)
            wait_for(lambda: all(records.hlen(Keys().copies(f"{topic}_{w}")) == 0
                                 for w in SUBSCRIBERS), 60, message="the taken copies forgotten")
            records.close()
        else:
            got = delivered(server, topic)
            assert not any(got.values()), f"gearmand kept foreground jobs? {got}"
    finally:
        pool.stop()
    report(f"copies = {copies}: {len(sent)} foreground fanouts answered timeout (queued) "
           f"for {len(SUBSCRIBERS)} subscribers away, then gearmand killed -9: "
           + ("every copy delivered after it" if copies == "held" else "all lost"))


def test_a_worker_killed_while_it_holds_copies_loses_none(
        gearmand_again, redis_url, tmp_path, report):
    server = gearmand_again.server
    pool = PoolProcess([server], redis_url, processes=2, log_dir=str(tmp_path), env=HELD)
    topic = unique_topic("heldw")
    try:
        pool.wait_ready()
        subscribe_all(server, topic)
        with Producer([(server.host, server.port)]) as producer:
            acked = {f"m{i}" for i in range(200)
                     if producer.publish(topic, f"m{i}", background=True)["copies"] == 3}
        assert len(acked) == 200
        first = f"{topic}_{SUBSCRIBERS[0]}"
        wait_for(lambda: queue_depth(server, first) == 200, 60, message="all 200 held")
        _, victim = next(iter(pool.live().items()))
        os.kill(int(victim["pid"]), signal.SIGKILL)  # its holding connections go with it
        all_delivered(server, topic, acked)
    finally:
        pool.stop()
    report(f"copies = held: a worker killed -9 with copies held; all {len(acked)} reached "
           f"every subscriber (the other worker took them over)")


def test_a_durable_stomp_subscriber_gets_every_copy_held_across_a_gearmand_crash(
        gearmand_again, redis_url, tmp_path, report):
    """The bridge takes held copies as any Gearman worker does, and its
    ACKs are the answers that drop their records."""
    server = gearmand_again.server
    pool = PoolProcess([server], redis_url, processes=2, log_dir=str(tmp_path), env=HELD)
    bridge = BridgeProcess([server], redis_url, str(tmp_path), env=HELD)
    topic = unique_topic("heldst")
    try:
        pool.wait_ready()
        away = StompClient(bridge.port, **{"client-id": "held-stomp"})
        away.subscribe(f"/topic/{topic}", "d", durable="true")
        away.close()  # away: its queue fills with held copies
        with Producer([(server.host, server.port)]) as producer:
            acked = {f"m{i}" for i in range(100)
                     if producer.publish(topic, f"m{i}", background=True)["copies"] == 1}
        gearmand_again.kill_and_start()
        back = StompClient(bridge.port, **{"client-id": "held-stomp"})
        try:
            back.subscribe(f"/topic/{topic}", "d", durable="true")

            def got():
                with back.listener.lock:
                    return {m.body.decode() for m in back.listener.messages}
            # Handed again after the crash, copies come in no promised order.
            with contextlib.suppress(AssertionError):  # said below, with what is missing
                back.wait(lambda: acked <= got(), 120, "every acknowledged copy")
            got = got()
        finally:
            back.close()
        assert not acked - got, f"the STOMP subscriber lost {sorted(acked - got)[:5]}"
        records = redis.Redis.from_url(redis_url)
        queue = f"{topic}_{durable_client_id('held-stomp')}"
        wait_for(lambda: records.hlen(Keys().copies(queue)) == 0, 60,
                 message="the ACKed copies forgotten")
        records.close()
    finally:
        bridge.stop()
        pool.stop()
    report(f"copies = held: a durable STOMP subscriber got all {len(acked)} copies held across "
           f"a kill -9 of gearmand; its ACKs dropped their records")


def test_queue_sends_are_held_by_the_bridge_across_gearmand_and_bridge_crashes(
        gearmand_again, redis_url, tmp_path, report):
    """A SEND to a ``/queue/`` is a copy the bridge holds: RECEIPTed after
    its record's fsync, handed again after a kill -9 of a plain gearmand,
    and taken over by the pool once the bridge holding it is killed too."""
    server = gearmand_again.server
    pool = PoolProcess([server], redis_url, processes=2, log_dir=str(tmp_path), env=HELD)
    first = BridgeProcess([server], redis_url, str(tmp_path), env=HELD)
    queue = unique_topic("heldq")
    second = None
    try:
        pool.wait_ready()
        producer = StompClient(first.port)
        sent = {f"q{i}".encode() for i in range(100)}
        for body in sorted(sent):  # every fifth with headers of its own to carry
            extra = {"correlation-id": body.decode()} if body.endswith(b"5") else {}
            producer.send(f"/queue/{queue}", body, **extra)  # waits for its RECEIPT
        producer.close()
        records = redis.Redis.from_url(redis_url)
        assert records.hlen(Keys().copies(queue)) == len(sent), "each SEND held once"
        gearmand_again.kill_and_start()
        first.process.kill()  # the holder of every one of them
        first.process.wait()
        second = BridgeProcess([gearmand_again.server], redis_url, str(tmp_path), env=HELD)
        consumer = StompClient(second.port)
        consumer.subscribe(f"/queue/{queue}", "1")
        got = consumer.every(sent)
        consumer.close()
        bodies = {m.body for m in got}
        assert not sent - bodies, f"lost {sorted(sent - bodies)[:5]}"
        headed = {m.body: m.headers.get("correlation-id") for m in got if m.body.endswith(b"5")}
        assert headed == {b: b.decode() for b in sent if b.endswith(b"5")}
        wait_for(lambda: records.hlen(Keys().copies(queue)) == 0, 60,
                 message="the delivered copies forgotten")
        records.close()
    finally:
        if second is not None:
            second.stop()
        first.stop()
        pool.stop()
    report(f"copies = held: {len(sent)} RECEIPTed SENDs to a /queue/ held by their bridge: all "
           f"delivered after a kill -9 of gearmand and then of that bridge (the pool took "
           f"them over), headers and all")


def test_with_two_gearmand_one_killed_hands_again_only_its_copies(tmp_path, redis_url, report):
    """Each queue's copies are held on its home gearmand; one of two killed
    -9 and started again: its copies are handed again there, and none held
    on the other is handed twice."""
    first, second = (Restartable(str(tmp_path / f"gearmand{n}")) for n in (1, 2))
    both = [first.server, second.server]
    pool = PoolProcess(both, redis_url, processes=2, log_dir=str(tmp_path), env=HELD)
    topic = unique_topic("held2")
    # Two subscribers homed on each gearmand.
    candidates = [f"s{i}" for i in range(40)]
    subscribers = ([w for w in candidates if pool_home(both, f"{topic}_{w}") == 0][:2]
                   + [w for w in candidates if pool_home(both, f"{topic}_{w}") == 1][:2])
    try:
        pool.wait_ready()
        with Producer([(s.host, s.port) for s in both]) as producer:
            for who in subscribers:
                producer.subscribe(topic, who)
            acked = {f"m{i}" for i in range(150) if producer.publish(
                topic, f"m{i}", background=True)["copies"] == len(subscribers)}
        first.kill_and_start()
        got = {who: [] for who in subscribers}

        def all_delivered():
            for server in (first.server, second.server):
                for who in subscribers:
                    got[who] += [(j.data.decode(), j.unique)
                                 for j in drain_jobs(server, f"{topic}_{who}")]
            return all(acked <= {data for data, _ in found} for found in got.values())
        wait_for(all_delivered, 180, interval=0.5, message="every copy at every subscriber")
        handed_again = {who: sum(1 for _, unique in found if not unique.endswith("^0"))
                        for who, found in got.items()}
    finally:
        pool.stop()
        first.stop()
        second.stop()
    assert len(acked) == 150
    homes = {who: pool_home(both, f"{topic}_{who}") for who in subscribers}
    for who in subscribers:  # only the killed gearmand's queues were handed again
        assert (handed_again[who] > 0) == (homes[who] == 0), (who, homes, handed_again)
    report(f"copies = held, 2 gearmand: the first killed; copies handed again per subscriber "
           f"{handed_again} (home server {homes}), all {len(acked)} delivered")


def pool_home(servers_, queue):
    """Which of ``servers_`` (by index in this list) is ``queue``'s home."""
    from gearhorn import gearman

    client = gearman.Client([(s.host, s.port) for s in servers_])
    try:
        return client.home(queue)
    finally:
        client.close()


def test_copies_gearmand_refuses_wait_in_redis_and_go_once_it_takes_them(
        gearmand, redis_url, tmp_path):
    """A queue at gearmand's ``maxqueue`` answers ERROR to a held copy: the
    fanout was acknowledged (its record is in Redis), so the copy is handed
    again, a while later, until gearmand takes it."""
    from gearhorn.gearman import admin

    pool = PoolProcess([gearmand], redis_url, processes=1, log_dir=str(tmp_path), env=HELD)
    topic = unique_topic("full")
    queue = f"{topic}_alice"
    try:
        pool.wait_ready()
        with Producer([(gearmand.host, gearmand.port)]) as producer:
            producer.subscribe(topic, "alice")
            producer.publish(topic, "m0", background=True)  # the queue exists: it can be bounded
            assert admin(gearmand.host, gearmand.port, f"maxqueue {queue} 1") == ["OK"]
            for i in range(1, 5):
                assert producer.publish(topic, f"m{i}", background=True)["copies"] == 1
            # A foreground fanout is told of the refusal (not its timeout);
            # its copy is held like the others.
            (failed,) = producer.publish(topic, "m5")["failed"]
            assert (failed["status"], failed["queued"]) == ("refused", True), failed
        wait_for(lambda: "refused by gearmand" in pool.log(full=True), 60,
                 message="the refusals logged")
        assert queue_depth(gearmand, queue) == 1
        records = redisconn.connect(redis_url)
        assert records.hlen(Keys().copies(queue)) == 6  # all six kept
        assert admin(gearmand.host, gearmand.port, f"maxqueue {queue} 0") == ["OK"]  # no bound
        got = {j.data for j in drain_jobs(gearmand, queue, until=nothing_held(redis_url, queue))}
        assert got == {f"m{i}".encode() for i in range(6)}
        records.close()
    finally:
        pool.stop()
