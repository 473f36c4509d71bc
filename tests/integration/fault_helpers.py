"""What the fault tests share (tests/integration/test_faults.py,
test_redis_cluster.py): a steady producer, draining, a marker, a durable
STOMP subscriber."""

import contextlib
import json
import os
import threading
import time

from gearhorn import gearman
from gearhorn.client import Producer

from .helpers import drain_jobs, nothing_held, queue_depth
from .stomp_helpers import BridgeProcess, StompClient

MESSAGES = 5_000
SUBSCRIBERS = 10
# The Gearman subscribers here read only after the broadcast: their queues
# hold every message (the default cap, 10,000 copies, would drop the first).
UNBOUNDED = {"GEARHORN_QUEUE_MAX_LENGTH": "0", "GEARHORN_QUEUE_MAX_BYTES": "0"}


def depth(server, function):
    try:
        return queue_depth(server, function)
    except OSError:
        return 0  # gearmand is restarting


def drain(server, function, redis_url=None):
    """The bodies of every job of ``function``; with ``redis_url``, also
    every copy held there for it (handed again after a crash)."""
    until = nothing_held(redis_url, function) if redis_url else None
    return [job.data.decode() for job in drain_jobs(server, function, until=until)]


@contextlib.contextmanager
def stomp_subscriber(servers, log_dir, topic):
    """A bridge and a durable STOMP subscriber of ``topic`` on it."""
    settings = getattr(servers, "worker_env", dict)()  # where gearmand keeps its queue
    bridge = BridgeProcess([servers.gearmand], servers.redis_url, str(log_dir), env=settings)
    client = StompClient(bridge.port, **{"client-id": "faults-stomp"})
    try:
        client.subscribe(f"/topic/{topic}", "d", durable="true")
        yield bridge, client
    finally:
        client.close()
        bridge.stop()


def publish_marker(gearmand, topic, marker="end"):
    """A last message down the same path as the others: a subscriber that
    got it got everything before it."""
    with Producer([(gearmand.host, gearmand.port)]) as producer:
        producer.publish(topic, marker, background=True)
    return marker.encode()


def children(pid):
    """Process ids whose parent is ``pid``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fp:
                    fields = fp.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


class SteadyProducer(threading.Thread):
    """Submits ``fanout`` jobs (background, each with its own unique key) in
    batches; a batch that gearmand does not accept is sent again until it is
    (gearmand coalesces what it already had), as a careful producer does."""

    def __init__(self, servers, topic, count, batch=100, pause=0.1):
        super().__init__(daemon=True)
        self.client = gearman.Client(servers)
        self.jobs = [gearman.Copy("fanout", f"m{i}", json.dumps(
            {"topic": topic, "payload": f"m{i}", "background": True}).encode())
            for i in range(count)]
        self.batch = batch
        self.pause = pause  # between batches, so the faults strike mid-stream
        self.retries = 0
        self.submitted = 0
        self.error = None

    def run(self):
        try:
            for start in range(0, len(self.jobs), self.batch):
                while True:
                    try:
                        self.client.submit_background(self.jobs[start:start + self.batch])
                        self.submitted = start + self.batch
                        time.sleep(self.pause)
                        break
                    except gearman.GearmanError:
                        self.retries += 1
                        time.sleep(0.1)
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            self.client.close()
