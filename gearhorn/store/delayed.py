"""Delayed delivery: messages kept in Redis until due, then sent.

Why it is shaped so: docs/design/notes.rst, "gearhorn/store/delayed.py".
"""

from __future__ import annotations

import base64
import json
import logging
import math
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

import redis

from gearhorn.gearman import GearmanError
from gearhorn.runtime.background import Backoff, Outage, StoppableThread
from gearhorn.store import delaylayout
from gearhorn.store.delaylayout import Layout
from gearhorn.store.keys import Keys
from gearhorn.store.redisconn import REDIS_ERRORS
from gearhorn.store.redisutil import run_scripts, script

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DelayedItem:
    """A message waiting for its time: a fanout to ``topic`` or a job on ``queue``."""

    due: float  # epoch seconds
    message_ids: tuple[str, ...]
    bodies: tuple[bytes, ...]
    topic: str = ""
    queue: str = ""
    unique: str | None = None
    priority: str = "normal"
    header_ids: tuple[str, ...] = ()  # per message; headers are in the HeaderStore

    def to_json(self) -> str:
        return json.dumps({
            "due": self.due, "ids": list(self.message_ids), "topic": self.topic,
            "queue": self.queue, "unique": self.unique, "priority": self.priority,
            "hids": list(self.header_ids),
            "bodies": [base64.b64encode(b).decode() for b in self.bodies]},
            separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> DelayedItem:
        obj = json.loads(text)
        return cls(obj["due"], tuple(obj["ids"]),
                   tuple(base64.b64decode(b) for b in obj["bodies"]), obj["topic"],
                   obj["queue"], obj["unique"], obj["priority"], tuple(obj["hids"]))



class Scheduler:
    """Keeps delayed messages in Redis and hands out the due ones.

    Messages spread over ``lanes`` by message id; a lane is one hash slot
    (its shards and cursor share a tag), so a burst due at one moment is
    spread over a cluster's nodes instead of landing on one key.
    """

    def __init__(self, client: redis.Redis, keys: Keys, shard_seconds: float = 10.0,
                 lease_seconds: float = 60.0, lanes: int = 1) -> None:
        self.redis = client
        self.keys = keys
        # Configured; the store's own is used (gearhorn/store/delaylayout.py).
        self.configured = Layout(max(1, int(shard_seconds * 1000)), lanes)
        self._layout: Layout | None = None
        self.lease_ms = max(1, int(lease_seconds * 1000))
        self._schedule = script(client, "schedule.lua")
        self._release = script(client, "release.lua")

    @property
    def layout(self) -> Layout:
        """The store's layout, read (or recorded) at first use."""
        if self._layout is None:
            self._layout = delaylayout.recorded(self.redis, self.keys, self.configured)
        return self._layout

    @property
    def width_ms(self) -> int:
        return self.layout.width_ms

    @property
    def lanes(self) -> int:
        return self.layout.lanes

    def lane(self, item: DelayedItem) -> int:
        return zlib.crc32(item.message_ids[0].encode()) % self.lanes if item.message_ids else 0

    def schedule(self, item: DelayedItem) -> bool:
        """Keep ``item`` until due; False if it is due already (send it now)."""
        due_ms = int(item.due * 1000)
        shard, lane = due_ms // self.width_ms, self.lane(item)
        return bool(self._schedule(keys=[self.keys.due(lane, shard), self.keys.due_cursor(lane)],
                                   args=[due_ms, item.to_json(), shard, self.keys.channel]))

    def take(self, limit: int = 1000, max_shards: int = 1000,
             now: float | None = None) -> list[tuple[bytes, DelayedItem]]:
        """Due messages (raw member, item), each leased to this caller alone."""
        return self.take_next(limit, max_shards, now)[0]

    def take_next(self, limit: int = 1000, max_shards: int = 1000, now: float | None = None
                  ) -> tuple[list[tuple[bytes, DelayedItem]], float | None]:
        """Due messages (raw member, item), each leased to this caller alone,
        and the seconds until the next message of the shards looked at is due
        (None when they are empty: the next is at least a shard away).

        Looks, in every lane, at the shards from its cursor to the one after
        the current one by this machine's clock (a clock up to one shard
        behind Redis's is covered), at most ``max_shards`` in one call; the
        script moves the cursor over empty shards, so a long outage is
        caught up call by call. Two round trips for all lanes.
        """
        layout = self.layout
        pipe = self.redis.pipeline(transaction=False)
        # Recorded again (if missing: Redis was wiped) before a process
        # configured otherwise starts and records its own.
        delaylayout.record(pipe, self.keys, layout)
        for lane in range(layout.lanes):
            pipe.get(self.keys.due_cursor(lane))
        current = int((time.time() if now is None else now) * 1000) // layout.width_ms
        calls = []
        for lane, cursor in enumerate(pipe.execute()[1:]):
            if cursor is None:
                continue
            first = int(cursor)
            shards = range(first, max(first, min(current + 1, first + max_shards - 1)) + 1)
            keys = [self.keys.due_cursor(lane), *(self.keys.due(lane, s) for s in shards)]
            calls.append((self._release, keys, [limit, self.lease_ms, layout.width_ms,
                                                first]))
        if not calls:
            return [], None
        replies = run_scripts(self.redis, calls)
        waits = [next_in for _, next_in in replies if next_in >= 0]
        return ([(member, DelayedItem.from_json(member)) for raw, _ in replies for member in raw],
                min(waits) / 1000 if waits else None)

    def done(self, taken: list[tuple[bytes, DelayedItem]]) -> None:
        """Forget messages that were sent."""
        if not taken:
            return
        pipe = self.redis.pipeline(transaction=False)
        for member, item in taken:
            pipe.zrem(self.shard_key(item), member)
        pipe.execute()

    def due_again(self, taken: list[tuple[bytes, DelayedItem]]) -> None:
        """End the lease of messages that could not be sent: due at once again."""
        pipe = self.redis.pipeline(transaction=False)
        for member, item in taken:
            pipe.zadd(self.shard_key(item), {member: int(item.due * 1000)})
        pipe.execute()

    def shard_key(self, item: DelayedItem) -> str:
        return self.keys.due(self.lane(item), int(item.due * 1000) // self.width_ms)

    def pending(self) -> int:
        """Messages kept and not yet sent (scans the shard keys of every node;
        for tools and tests)."""
        total = 0
        for key in self.redis.scan_iter(match=self.keys.due("*", "[0-9]*"), count=10_000):
            total += self.redis.zcard(key)
        return total


class Releaser(StoppableThread):
    """Sends due messages with ``send`` until stopped (one per worker process).

    It sleeps until the first due time it knows of: the shards it looked at
    give it (lua/release.lua), and a message scheduled earlier than that is
    announced on the matchmaking channel (lua/schedule.lua), which the
    worker's listener hands to :meth:`announced`. Polling every 0.1 s woke
    every worker ten times a second with Redis round trips, idle or not.
    ``longest`` bounds the sleep, so a message whose announcement was missed
    (the channel was down) goes out at most that late; so does half a
    shard, so each shard is looked at while it is the next one and its
    first message's time is known in time.

    A message whose ``send`` fails stays leased; when the lease ends it is
    due again and some worker tries once more, so nothing is dropped.
    """

    def __init__(self, scheduler: Scheduler, send: Callable[[DelayedItem], None],
                 longest: float = 1.0, batch: int = 1000) -> None:
        super().__init__("gearhorn-releaser")
        self.scheduler = scheduler
        self.send = send
        self.longest = longest
        self.batch = batch
        self.released = 0
        self.woken = threading.Event()
        self._lock = threading.Lock()
        self._wake_at = math.inf  # monotonic; lowered by what it learns, never raised

    def announced(self, data: bytes | str) -> None:
        """A matchmaking message: wake up in time for a message it announces.

        It only moves the wake-up earlier; the look happens then. (Looking
        at each announcement instead would let a producer scheduling ever
        earlier messages keep every worker looking, a round trip each.)
        """
        raw = data if isinstance(data, bytes) else data.encode()
        if b'"due"' not in raw:
            return
        try:
            message = json.loads(raw)
            if message.get("op") != "due":
                return  # another announcement (a topic named "due", say)
            due_in = float(message["in_ms"]) / 1000
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("ignoring malformed due announcement %r", raw[:200])
            return
        self.wake_by(time.monotonic() + due_in)

    def look_now(self) -> None:
        """Look at once (the channel was away: announcements may be lost)."""
        self.wake_by(-math.inf)

    def wake_by(self, at: float) -> None:
        """Look no later than ``at`` (monotonic seconds)."""
        with self._lock:
            if at < self._wake_at:
                self._wake_at = at
                self.woken.set()

    def run(self) -> None:
        backoff = Backoff(0.1)
        outage = Outage(log, "redis or gearmand (delayed messages)")
        while not self.stopping.is_set():
            with self._lock:
                self._wake_at = math.inf  # what is announced from now on counts
            try:
                taken, next_in = self.release_due_next()
                backoff.succeeded()
                outage.succeeded()
                # At least a millisecond: Redis's clock may be a little
                # behind ours at the message's due time.
                # At most half a shard: each shard is then looked at while
                # it is the next one, and its first message's time known.
                longest = min(self.longest, self.scheduler.width_ms / 2000)
                pause = longest if next_in is None else max(0.001, min(next_in, longest))
            except (*REDIS_ERRORS, GearmanError) as exc:
                pause = backoff.failed()
                outage.failed(exc)
                taken = 0
            if taken < self.batch:
                self.wake_by(time.monotonic() + pause)
                self._sleep()

    def _sleep(self) -> None:
        """Until the wake-up time, which announcements may move earlier."""
        while not self.stopping.is_set():
            with self._lock:
                left = self._wake_at - time.monotonic()
                self.woken.clear()
            if left <= 0:
                return
            self.woken.wait(left)

    def stop(self, timeout: float | None = None) -> None:
        self.stopping.set()
        self.woken.set()
        super().stop(timeout)

    def release_due(self) -> int:
        """Send what is due now; returns how many were taken."""
        return self.release_due_next()[0]

    def release_due_next(self) -> tuple[int, float | None]:
        """Send what is due now; returns how many were taken, and the
        seconds until the next message known is due (None: none known)."""
        taken, next_in = self.scheduler.take_next(self.batch)
        sent = []
        try:
            for member, item in taken:
                self.send(item)
                sent.append((member, item))
        finally:
            self.scheduler.done(sent)
            self.released += len(sent)
            if len(sent) < len(taken):
                self.scheduler.due_again(taken[len(sent):])
        return len(taken), next_in
