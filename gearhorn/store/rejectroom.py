"""Room in ``reject-publish`` queues, claimed before copies are made, so a
burst of fanouts cannot pass a queue's limit between two warden rounds
(RabbitMQ's ``x-overflow: reject-publish`` never does).

Why it is shaped so: docs/design/notes.rst, "gearhorn/store/rejectroom.py".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import redis

from gearhorn.store.keys import Keys
from gearhorn.store.redisutil import script, text

# The room of a queue limited by bytes only, in copies.
UNLIMITED = 1 << 60

Room = tuple[str, int, int | None]  # queue, copies it may take, bytes (None: no limit)


def open_room(pipe: redis.client.Pipeline, keys: Keys, queue: str, max_length: int | None,
              max_bytes: int | None) -> None:
    """A new reject-publish subscription's room, unless it has one already."""
    pipe.hsetnx(keys.room, queue, max_length or UNLIMITED)
    if max_bytes:
        pipe.hsetnx(keys.room, f"{queue} bytes", max_bytes)


def room_fields(queue: str) -> tuple[str, ...]:
    """Every field of ``<p>room`` that belongs to ``queue``."""
    return (queue, f"{queue} bytes", f"{queue} claimed", f"{queue} claimed-bytes")


class RoomKeeper:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.redis, self.key = client, keys.room
        self._claim = script(client, "room_claim.lua")
        self._set = script(client, "room_set.lua")

    def bounded(self) -> frozenset[str]:
        """The reject-publish queues the warden knows (their claims matter)."""
        return frozenset(text(f) for f in self.redis.hkeys(self.key) if b" " not in f)

    def claim(self, queues: Sequence[str], sizes: Sequence[int]) -> list[int]:
        """How many of a fanout's messages (of ``sizes`` bytes, in order)
        each queue takes: the first ones that fit its room."""
        if not queues:
            return []
        args = [len(sizes), *sizes, *queues]
        return [int(k) for k in self._claim(keys=[self.key], args=args)]

    def snapshot(self) -> tuple[dict[str, tuple[int, int]], frozenset[str]]:
        """What workers claimed ever, per queue, and the queues that have a
        room: where the warden's round starts (before it reads the
        subscriptions, so a room opened after this is not one it forgets)."""
        found: dict[str, list[int]] = {}
        queues = set()
        for field, value in self.redis.hgetall(self.key).items():
            queue, _, kind = text(field).partition(" ")
            queues.add(queue)
            if kind in ("claimed", "claimed-bytes"):
                found.setdefault(queue, [0, 0])[kind == "claimed-bytes"] = int(value)
        return {q: (c, b) for q, (c, b) in found.items()}, frozenset(queues)

    def set(self, rooms: Iterable[Room], at_start: dict[str, tuple[int, int]],
            forget: Iterable[str] = ()) -> None:
        """Each reject-publish queue's room after a round; the queues in
        ``forget`` (no longer reject-publish, or gone) lose theirs."""
        args: list[object] = []
        for queue, room, room_bytes in rooms:
            claimed, claimed_bytes = at_start.get(queue, (0, 0))
            args += [queue, room, "" if room_bytes is None else room_bytes, claimed,
                     claimed_bytes]
        self._set(keys=[self.key], args=[len(args) // 5, *args, *forget])
