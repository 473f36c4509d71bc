"""What every bridge knows of a queue message's past: whether some bridge
handed it to a STOMP client before, and the original of a message a bridge
gave back itself.

Why it is shaped so: docs/design/notes.rst, "gearhorn/store/redeliveries.py".
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import redis

from gearhorn.store.directcalls import DirectCalls
from gearhorn.store.keys import Keys
from gearhorn.store.redisutil import script


@dataclass(frozen=True, slots=True)
class Returned:
    """A message given back: its token, original unique key, and whether it
    had reached a client."""

    token: str
    unique: str
    delivered: bool


class Redeliveries:
    def __init__(self, client: redis.Redis, keys: Keys, ttl: float,
                 direct: DirectCalls | None = None) -> None:
        self.redis = client
        self.keys = keys
        self.ttl_ms = max(1, int(ttl * 1000))
        self._take = script(client, "redeliveries.lua")
        # One call per batch grabbed: past the pool (directcalls.py).
        self.direct = direct or DirectCalls.pooled(client)

    def originals(self, tokens: Sequence[str]) -> dict[str, Returned]:
        """The given-back messages among ``tokens`` whose record still exists."""
        if not tokens:
            return {}
        pipe = self.redis.pipeline(transaction=False)
        for token in tokens:
            pipe.get(self._returned(token))
        found = {}
        for token, raw in zip(tokens, pipe.execute(), strict=True):
            if raw is not None:
                record = json.loads(raw)
                found[token] = Returned(token, record["u"], bool(record["d"]))
        return found

    def take(self, function: str, uniques: Sequence[str],
             settled: Sequence[str] = ()) -> list[bool]:
        """Count a hand-out of each message; True for those handed out before.
        ``settled``: messages acknowledged since, forgotten in the same call
        (one script call: gearhorn/store/lua/redeliveries.lua)."""
        (before,) = self.direct.run_scripts([(self._take, [self.keys.handouts(function)],
                                              [self.ttl_ms, len(settled), *settled, *uniques])])
        return [bool(flag) for flag in before]

    def settled(self, function: str, uniques: Iterable[str]) -> None:
        """Acknowledged (or dead-lettered): gone for good, forget them."""
        uniques = list(uniques)
        if uniques:
            self.redis.hdel(self.keys.handouts(function), *uniques)

    def give_back(self, function: str, returned: Sequence[Returned],
                  never_delivered: Sequence[str]) -> None:
        """Record messages about to be submitted again as ``~<token>``, and
        undo the count of those taken but never delivered (written before the
        resubmission, so whoever grabs one finds its record)."""
        pipe = self.redis.pipeline(transaction=False)
        for r in returned:
            pipe.set(self._returned(r.token), json.dumps({"u": r.unique, "d": int(r.delivered)}),
                     px=self.ttl_ms)
        for unique in never_delivered:
            pipe.hincrby(self.keys.handouts(function), unique, -1)
        pipe.execute()

    def _returned(self, token: str) -> str:
        return self.keys.returned(token)
