"""gearhorn from the Gearman client libraries most Gearman traffic comes
from: PHP's gearman extension, Perl's Gearman::Client and Gearman::Worker,
Node's ``gearman`` module, and Python's gear.

Each language subscribes, publishes as a background job and as a
foreground ``fanout`` with ``"background": true``, consumes exact bytes in
order (UTF-8, 100 KiB), runs the receivers of a foreground fanout that
gathers their answers, throws in a receiver (PHP ``sendException``, Perl
``die``, Node ``sendWorkException``), and is refused bad input and keeps
working. The scripts are tests/clients/gearman_client.{php,pl,py} and
tests/js/gearman_client.cjs; they print what they saw as JSON.

Go is not here: its Gearman clients come from the Go module proxy, which
neither this machine nor CI reaches (docs/clients.rst).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from gearhorn import gearman
from tests.needs import require_binary

from .helpers import unique_topic, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(os.path.dirname(HERE))


def php_argv():
    require_binary("php", "php-cli")
    probe = subprocess.run(["php", "-r", "exit(class_exists('GearmanClient') ? 0 : 1);"],
                           capture_output=True, timeout=60)
    if probe.returncode:
        from tests.needs import missing
        missing("PHP's gearman extension is not installed (apt-get install php-gearman)")
    return ["php", os.path.join(ROOT, "tests", "clients", "gearman_client.php")]


def perl_argv():
    require_binary("perl", "perl")
    probe = subprocess.run(["perl", "-MGearman::Client", "-e", "1"], capture_output=True,
                           timeout=60)
    if probe.returncode:
        from tests.needs import missing
        missing("Perl's Gearman::Client is not installed (apt-get install "
                "libgearman-client-perl)")
    return ["perl", os.path.join(ROOT, "tests", "clients", "gearman_client.pl")]


def node_argv():
    require_binary("node", "nodejs")
    script = os.path.join(ROOT, "tests", "js", "gearman_client.cjs")
    if not os.path.isdir(os.path.join(ROOT, "tests", "js", "node_modules", "gearman")):
        from tests.needs import missing
        missing("npm's gearman is not installed: run tools/ensure-env --test")
    return ["node", script]


def python_argv():
    return [sys.executable, os.path.join(ROOT, "tests", "clients", "gearman_client.py")]


LANGUAGES = {"php": php_argv, "perl": perl_argv, "node": node_argv, "python": python_argv}


class Library:
    """One language's script against one gearmand."""

    def __init__(self, name, gearmand):
        self.name = name
        self.argv = LANGUAGES[name]()
        self.where = [gearmand.host, str(gearmand.port)]
        self.gearmand = gearmand

    def run(self, mode, function, arg, timeout=90):
        out = subprocess.run([*self.argv, mode, *self.where, function, arg],
                             capture_output=True, text=True, timeout=timeout)
        assert out.returncode == 0, f"{self.name} {mode}: {out.stderr[-2000:]}"
        return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]

    def call(self, function, job):
        (answer,) = self.run("call", function, json.dumps(job))
        return answer

    def result(self, function, job):
        answer = self.call(function, job)
        assert answer["status"] == "complete", answer
        return json.loads(answer["data"])

    def receivers(self, function):
        """Workers gearmand knows for ``function``."""
        found = {f.name: f for f in gearman.status(self.gearmand.host, self.gearmand.port)}
        return found[function].workers if function in found else 0

    def queued(self, function):
        """Jobs gearmand holds for ``function``."""
        found = {f.name: f for f in gearman.status(self.gearmand.host, self.gearmand.port)}
        return found[function].queued if function in found else 0

    def worker(self, function, count):
        """A receiver in this language, in the background: its process."""
        return subprocess.Popen([*self.argv, "worker", *self.where, function, str(count)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(process, timeout=90):
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err[-2000:]
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def digest(text):
    data = text.encode()
    return {"length": len(data), "sha256": hashlib.sha256(data).hexdigest()}


@pytest.fixture(params=sorted(LANGUAGES))
def library(request, gearmand, start_pool):
    start_pool([gearmand], processes=2)
    return Library(request.param, gearmand)


def test_subscribe_publish_and_consume_exact_bytes_in_order(library):
    topic = unique_topic("lib")
    assert library.result("subscribe_fanout", {"topic": topic, "client_id": "c1"}) == {
        "topic": topic, "client_id": "c1", "subscribers": 1}
    big = ("é☃" + "x" * 97) * 1024  # 100 KiB of UTF-8, multi-byte characters too
    first = {"topic": topic, "payload": big}
    (created,) = library.run("background", "fanout", json.dumps(first))
    assert created["handle"]
    # A background fanout is answered once queued, and a pool of two may run
    # the next one first: order holds per worker process (docs/design/index.rst,
    # "Order"), so a producer that needs it across a pool waits for its copy.
    wait_for(lambda: library.queued(f"{topic}_c1") == 1, timeout=60)
    second = library.result("fanout", {"topic": topic, "payload": "second ✓",
                                       "background": True})
    assert second["copies"] == 1 and second["background"] is True
    seen = finished(library.worker(f"{topic}_c1", 2))
    assert seen == [digest(big), digest("second ✓")]


def test_a_receiver_that_throws_ends_its_copy_at_once_with_the_reason(library, report):
    """Before gearhorn asked gearmand for exceptions, gearmand 1.1.20 turned the
    receiver's WORK_EXCEPTION into ``WORK_FAIL "<handle>\\0"``, which matched
    no job: the producer waited for the whole fanout_timeout (20 s here)."""
    topic = unique_topic("throw")
    library.result("subscribe_fanout", {"topic": topic, "client_id": "c1"})
    receiver = library.worker(f"{topic}_c1", 1)
    wait_for(lambda: library.receivers(f"{topic}_c1"), 60, message="the receiver registered")
    answer = library.call("fanout", {"topic": topic, "payload": "throw:cache node is down"})
    assert answer["status"] == "complete", answer
    result, took = json.loads(answer["data"]), answer["seconds"]
    finished(receiver)
    assert result["completed"] == 0
    (failure,) = result["failed"]
    assert failure["status"] == "exception" and "cache node is down" in failure["reason"], failure
    assert failure["attempts"] == 1
    assert took < 10, f"{took:.1f}s: the answer waited for a timeout"
    report(f"{library.name}: the fanout of a throwing receiver answered in {took:.3f}s, "
           "as the producer's library measured it")


def test_gather_returns_every_receivers_answer(library):
    topic = unique_topic("gather")
    for who in ("a", "b"):
        library.result("subscribe_fanout", {"topic": topic, "client_id": who})
    receivers = [library.worker(f"{topic}_{who}", 1) for who in ("a", "b")]
    result = library.result("fanout", {"topic": topic, "payload": "how many?", "gather": True})
    for receiver in receivers:
        finished(receiver)
    want = f"{library.name}:{len(b'how many?')}:{hashlib.sha256(b'how many?').hexdigest()}"
    assert {who: a["data"] for who, a in result["answers"].items()} == {"a": want, "b": want}
    for answer in result["answers"].values():
        assert answer["status"] == "complete" and answer["progress"] == [1, 1]


def test_bad_input_is_refused_with_a_reason_and_the_service_keeps_working(library):
    refused = library.call("fanout", {"topic": "bad topic", "payload": "x"})
    assert refused["status"] == "failed", refused
    broken = library.run("call", "fanout", "{not json")[0]
    assert broken["status"] == "failed", broken
    topic = unique_topic("after")
    assert library.result("subscribe_fanout", {"topic": topic, "client_id": "c1"})[
        "subscribers"] == 1
