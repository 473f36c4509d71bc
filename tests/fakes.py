"""Test doubles shared by the unit tests: a Gearman client that records,
the STOMP session's transport, dispatcher and backend, and byte streams cut
every which way. ``FakeBroker`` is checked against each protocol of
``stomp.backend.Backend`` (tests/unit/test_fakes.py), so a session test
cannot pass against a backend method that no longer exists.
"""

from __future__ import annotations

import dataclasses
import random
import types

from gearhorn import gearman
from gearhorn.config import Config
from gearhorn.rules.auth import OPEN
from gearhorn.stomp.protocol.frames import FrameParser
from gearhorn.stomp.protocol.sendheaders import PLAIN, TopicSend
from gearhorn.stomp.queues.dispatchers import Delivery
from gearhorn.stomp.sessions.backend import Backend
from gearhorn.stomp.sessions.session import Session
from gearhorn.stomp.topics.startoffsets import Kept


class RecordingClient:
    """Stands in for gearmand: records copies, answers foreground jobs."""

    def __init__(self, answers=None):
        self.background, self.foreground = [], []
        self.precedences = []
        # function -> Outcome, or a list of Outcomes given one per attempt
        self.answers = answers or {}

    def submit_background(self, copies, precedence="normal"):
        self.background += copies
        self.precedences.append(precedence)
        return len(copies)

    def submit_foreground(self, copies, timeout, precedence="normal"):
        self.foreground += copies
        self.precedences.append(precedence)
        return [self._answer(c.function) for c in copies]

    def start_foreground(self, copies, precedence="normal"):
        outcomes = self.submit_foreground(copies, 0, precedence)
        return Answered(outcomes)

    def _answer(self, function):
        answer = self.answers.get(function, gearman.Outcome("complete", b"ok"))
        if isinstance(answer, list):
            return answer.pop(0) if len(answer) > 1 else answer[0]
        return answer


class Answered:
    """gearman.Placed for RecordingClient: the outcomes are known at once."""

    def __init__(self, outcomes):
        self.outcomes = outcomes

    def wait(self, timeout):
        return self.outcomes


def run_now(run):
    """An Outbox's spawn in tests without gevent: its jobs run inline."""
    run()


def session_without_sockets(backend, transport, settings=None):
    session = Session(backend, transport, settings)
    session.sends.outbox.spawn = run_now
    return session


class FakeTransport:
    def __init__(self):
        self.parser = FrameParser()
        self.parser.version = "1.2"
        self.frames, self.callbacks, self.inline = [], [], []
        self.closed = False
        self.backlog = 0

    def send(self, data, on_sent=None, on_dropped=None, inline=False):
        self.frames += self.parser.feed(data)
        self.callbacks.append((on_sent, on_dropped))
        self.inline.append(inline)

    def close(self):
        self.closed = True


class FakeDispatcher:
    def __init__(self, function):
        self.function = function
        self.consumers, self.acked, self.given_back, self.returned = [], [], [], []
        self.rejected = []

    def ack(self, delivery):
        self.acked.append(delivery.body)

    def give_back(self, deliveries):
        self.given_back += [d.body for d in deliveries]

    def reject(self, deliveries):
        self.rejected += [d.body for d in deliveries]

    def remove(self, consumer, unacked, give_back=True):
        self.consumers.remove(consumer)
        self.returned += [d.body for d in unacked]

    def push(self, body, consumer=None, headers=None, deliveries=1):
        job = gearman.GrabbedJob(b"H:%d" % len(body), self.function, "u", body)
        delivery = Delivery(job, None, self, headers)
        delivery.deliveries = deliveries
        (consumer or self.consumers[0]).deliver(delivery)
        return delivery


class FakeReader:
    """What a session holds of a stream subscription's reader."""

    def __init__(self, consumer):
        self.consumers = [consumer]
        self.settled_count = 0

    def remove(self, consumer, unacked, give_back=True):
        self.consumers.remove(consumer)

    def settled(self):
        self.settled_count += 1


class FakeBroker:
    """Every collaborator of a session's Backend at once, recording what it is asked."""

    def __init__(self):
        self.config = Config()
        self.sent, self.published, self.topics = [], [], []
        self.dispatchers = {}

    principal = OPEN

    def authenticate(self, login, passcode):
        self.logins = getattr(self, "logins", []) + [login]
        return self.principal if passcode != "Wr0ngPass" else None

    def new_client(self):
        return gearman.Client(self.config.gearman_servers)

    def attached(self, queue):
        self.ledger = getattr(self, "ledger", []) + [("attached", queue, "")]

    def delivered(self, queue, unique, redelivered):
        self.ledger = getattr(self, "ledger", []) + [("delivered", queue, unique)]

    def acked(self, queue, unique):
        self.ledger = getattr(self, "ledger", []) + [("acked", queue, unique)]

    def attach(self, function, consumer, shared=True):
        d = self.dispatchers.setdefault(function, FakeDispatcher(function))
        d.consumers.append(consumer)
        return d

    def send_to_queue(self, client, function, bodies, options=PLAIN):
        self.sent += [(function, body) for body in bodies]
        self.options = getattr(self, "options", []) + [options]
        self.calls = getattr(self, "calls", 0) + 1

    def prepare(self, topic, bodies, options=PLAIN):
        return TopicSend(topic, list(bodies), options)

    def append(self, send):
        pass  # no history here: nothing is announced, nothing to append

    def abandon(self, send):
        pass

    def start(self, client, send):
        result = self.publish(client, send.topic, send.bodies, send.options)
        return types.SimpleNamespace(wait=lambda: result)

    def publish(self, client, topic, bodies, options=PLAIN):
        self.published += [(topic, body) for body in bodies]
        self.options = getattr(self, "options", []) + [options]
        self.calls = getattr(self, "calls", 0) + 1
        return {"topic": topic, "copies": len(bodies),
                "duplicate": options.headers.get("x-deduplication-header") == "seen"}

    def request(self, function, body, options, reply_queue, done=None):
        self.requests = getattr(self, "requests", []) + [(function, body, options, reply_queue)]
        self.done = getattr(self, "done", []) + [done]

    def bound_queue(self, function, limits):
        self.topics.append(("bound", function, limits))

    def subscribe_topic(self, pattern, client_id, durable=False, limits=None, linger=None):
        self.topics.append(("+", pattern, client_id))

    def temp_queue_opened(self, function):
        self.topics.append(("temp+", function))

    def temp_queue_exists(self, function):
        return ("temp+", function) in self.topics and ("temp-", function) not in self.topics

    def temp_queue_closed(self, function):
        self.topics.append(("temp-", function))

    def unsubscribe_topic(self, pattern, client_id):
        self.topics.append(("-", pattern, client_id))

    def drop_queue(self, function):
        self.topics.append(("drop", function))

    # A history per topic: "news" keeps offsets 3 to 9 of epoch e1.
    histories = {"news": Kept("e1", 3, 9)}

    def keeps_history(self, topic):
        return topic in self.histories

    def always_kept(self, topic):  # configured: a plain SUBSCRIBE to it is a live reader
        return topic in self.histories

    def linger(self, topic):
        return 300

    def kept(self, topic):
        return self.histories[topic]

    def offset_at(self, topic, at):
        return 5

    def read_stream(self, topic, consumer, after, epoch, recovered, live=False, last=None):
        self.streams = getattr(self, "streams", []) + [(topic, after, epoch, recovered, live)]
        return FakeReader(consumer)

    # The fsync barrier: each wait records what was handed to gearmand and
    # how many frames the session had written by then (``frames``: the
    # transport's list, when a test sets it), so a test sees that a RECEIPT
    # came after the wait covering its SEND.
    disk_fails = None  # an exception the next wait raises
    frames = None

    def wait(self):
        self.disk_waits = getattr(self, "disk_waits", 0) + 1
        self.disk_log = getattr(self, "disk_log", []) + [
            (len(self.sent) + len(self.published), len(self.frames or ()))]
        if self.disk_fails is not None:
            raise self.disk_fails

    def answer(self, dest):
        if dest.control == "count-msgs":
            return {"num-messages": "7"}
        return {"num-subscribers": "2" if dest.target == "queue" else "3"}

    def backend(self) -> Backend:
        """This fake in every part a session's backend has."""
        return Backend(**{part.name: self for part in dataclasses.fields(Backend)})


def chunkings(wire: bytes, seed: int | None = None, splits: int = 40, most_cuts: int = 8):
    """Whole, byte by byte, and ``splits`` random splits of at most
    ``most_cuts`` cuts (seeded by the length unless ``seed`` is given)."""
    yield [wire]
    yield [wire[i:i + 1] for i in range(len(wire))]
    rng = random.Random(len(wire) if seed is None else seed)
    for _ in range(splits):
        if len(wire) < 2:
            break
        count = min(len(wire) - 1, rng.randint(1, most_cuts))
        cuts = sorted(rng.sample(range(1, len(wire)), count))
        yield [wire[a:b] for a, b in zip([0] + cuts, cuts + [len(wire)], strict=True)]
