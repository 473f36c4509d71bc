import gevent
import pytest

from gearhorn.stomp.queues.registrations import Registrations

pytestmark = pytest.mark.timeout(30)


def test_heartbeats_go_on_after_one_fails_unexpectedly(registry):
    """A heartbeat that raises something else than a Redis error (a bug) must
    not end the heartbeats: without them the janitor takes the bridge for
    dead and removes its subscriptions."""
    registrations = Registrations(registry, "b", ttl=5, heartbeat_interval=0.01)
    beats = []

    def heartbeat(now=None):
        beats.append(now)
        if len(beats) == 1:
            raise RuntimeError("Set changed size during iteration")

    registrations.liveness.heartbeat = heartbeat
    registrations.start()
    try:
        with gevent.Timeout(20):
            while len(beats) < 3:
                gevent.sleep(0.01)
    finally:
        registrations.stop_heartbeats()
    assert registry.redis.exists("t:bridge-info:b")  # told after the failed beat too


def test_a_heartbeat_fault_that_repeats_is_logged_once(registry, caplog):
    """A bug that fails every beat logs its traceback once, not every few
    seconds for as long as the bridge runs; the first beat that works again
    says so."""
    registrations = Registrations(registry, "b", ttl=5, heartbeat_interval=0.01)
    beats = []

    def heartbeat(now=None):
        beats.append(now)
        if len(beats) <= 5:
            raise RuntimeError("Set changed size during iteration")

    registrations.liveness.heartbeat = heartbeat
    caplog.set_level("INFO", logger="gearhorn.stomp.queues.registrations")
    registrations.start()
    try:
        with gevent.Timeout(20):
            while not any("works again" in r.getMessage() for r in caplog.records):
                gevent.sleep(0.01)
    finally:
        registrations.stop_heartbeats()
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].exc_info[0] is RuntimeError
    assert any("after 5 failed passes" in r.getMessage() for r in caplog.records)
