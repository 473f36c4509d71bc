"""What the warden last said about the queues, as the fanout workers need it:
which ``reject-publish`` queues are full, and whether the queue store is
over its guard (gearhorn/worker/warden.py writes both every round).

Read at most every ``refresh`` seconds (one round trip), so a fanout costs
nothing more, and at once after the warden announces a change on the
matchmaking channel (``{"op": "pressure"}``); on a Redis error the last
answer stands.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import redis

from gearhorn.store.keys import Keys
from gearhorn.store.redisconn import REDIS_ERRORS
from gearhorn.store.redisutil import text


class Pressure:
    def __init__(self, client: redis.Redis, keys: Keys, refresh: float = 0.25,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.redis = client
        self.keys = keys
        self.refresh = refresh
        self.clock = clock
        self.full: frozenset[str] = frozenset()
        self.over = ""  # why the queue store takes no more, or empty
        # reject-publish queues whose room a fanout claims first (store/rejectroom.py)
        self.bounded: frozenset[str] = frozenset()
        self._read_at: float | None = None

    def current(self) -> tuple[frozenset[str], str]:
        """(full queues, store over-guard reason), at most ``refresh`` s old."""
        now = self.clock()
        if self._read_at is None or now - self._read_at >= self.refresh:
            self._read_at = now
            pipe = self.redis.pipeline(transaction=False)
            pipe.smembers(self.keys.full)
            pipe.hget(self.keys.store, "over")
            pipe.hkeys(self.keys.room)
            try:
                full, over, room = pipe.execute()
            except REDIS_ERRORS:
                return self.full, self.over
            self.full = frozenset(text(q) for q in full)
            self.over = text(over or b"")
            self.bounded = frozenset(text(f) for f in room if b" " not in f)
        return self.full, self.over

    def read_again(self) -> frozenset[str]:
        """Read now (a look-up found new subscribers: one may be a
        reject-publish queue made a moment ago); the full queues."""
        self._read_at = None
        return self.current()[0]

    def announced(self, data: bytes | str) -> None:
        """A matchmaking message: after the warden's, read again."""
        if b'"pressure"' in (data if isinstance(data, bytes) else data.encode()):
            self._read_at = None

    def largest_backlogs(self, count: int = 3) -> str:
        """``q1 (n copies), ...`` from the warden's last round, for an error."""
        try:
            raw = self.redis.get(self.keys.backlogs)
        except REDIS_ERRORS:
            return "unknown (Redis unavailable)"
        queues = json.loads(raw)["queues"][:count] if raw else []
        return ", ".join(f"{q['queue']} ({q['depth']:,} copies)" for q in queues) or "none"
