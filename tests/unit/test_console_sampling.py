"""The console samples gearmand's status every second only while someone
watches it; unwatched, every 10 s (a sample lists every function gearmand
knows: 16% of a core at 100,000 queues when it sampled every second)."""

import time

import gevent
import pytest

from gearhorn.web import app

pytestmark = pytest.mark.timeout(60)


class CountingCollector:
    def __init__(self) -> None:
        self.samples = 0

    def collect(self) -> dict:
        self.samples += 1
        return {"at": time.time(), "topics": []}


def wait_until(condition, within=30.0):
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "not within the deadline"
        gevent.sleep(0.01)


def test_sampling_follows_the_watchers(monkeypatch):
    monkeypatch.setattr(app, "REFRESH_SECONDS", 0.01)
    monkeypatch.setattr(app, "UNWATCHED_SECONDS", 600.0)
    collector = CountingCollector()
    console = app.Console(collector)
    runner = gevent.spawn(console.run)
    try:
        wait_until(lambda: collector.samples == 1)
        gevent.sleep(0.3)  # thirty refreshes' time: none while nobody watches
        assert collector.samples == 1
        watching = console.events()
        assert next(watching).startswith(b"event: history")
        assert next(watching).startswith(b"event: snapshot")
        wait_until(lambda: collector.samples >= 10)  # every refresh now
        watching.close()  # the browser tab closed
        gevent.sleep(0.05)
        settled = collector.samples
        gevent.sleep(0.3)
        assert collector.samples <= settled + 1
    finally:
        runner.kill()
