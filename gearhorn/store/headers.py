"""Where message headers travel: beside the job, in Redis.

A Gearman job carries bytes only, and Gearman consumers of a queue must get
the raw payload. So a message with headers (STOMP SEND headers, or a
fanout's ``"headers"``) keeps them under ``<p>headers:<header id>`` for
``headers_ttl`` seconds, written once per message however many copies it
has, and every copy's unique key starts with ``@<header id>``
(:func:`gearhorn.rules.naming.copy_unique`). The bridge reads the headers of the
jobs it grabs, one MGET per grab; a job without the mark costs nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

import redis

from gearhorn.rules.naming import header_id_of
from gearhorn.store.keys import Keys


class HeaderStore:
    def __init__(self, client: redis.Redis, keys: Keys, ttl: float) -> None:
        self.redis = client
        self.keys = keys
        self.ttl = max(1, int(ttl))

    def put(self, header_id: str, headers: Mapping[str, str]) -> None:
        self.redis.set(self.keys.headers(header_id), json.dumps(headers), ex=self.ttl)

    def for_uniques(self, uniques: Iterable[str]) -> dict[str, dict[str, str]]:
        """The headers of every job (by unique key) whose key carries a header id."""
        wanted = {u: h for u in uniques if (h := header_id_of(u)) is not None}
        if not wanted:
            return {}
        ids = sorted(set(wanted.values()))
        # GETs in a pipeline, not MGET: the keys are in many hash slots.
        pipe = self.redis.pipeline(transaction=False)
        for header_id in ids:
            pipe.get(self.keys.headers(header_id))
        found = dict(zip(ids, pipe.execute(), strict=True))
        result = {}
        for unique, header_id in wanted.items():
            raw = found.get(header_id)
            if raw is not None:
                result[unique] = json.loads(raw)
        return result
