"""Topic history: each topic's last messages, with an offset per topic and
an epoch that changes when its history is lost (Centrifugo's model).

Kept ``history_size`` messages (about: the stream is trimmed with ``~``) and
``history_ttl`` seconds after the topic's last message, in the topic's
hash slot: ``<p>history:{T}`` (a stream whose entry ids are the offsets)
and ``<p>history-meta:{T}`` (the last offset and the epoch). Written by the
workers, one script call per topic and group of fanouts
(``lua/history_append.lua``); read by ``topic_history``.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Sequence

import redis

from gearhorn.store.keys import Keys
from gearhorn.store.redisutil import run_scripts, script, text


class History:
    def __init__(self, client: redis.Redis, keys: Keys, size: int, ttl: float) -> None:
        self.redis = client
        self.keys = keys
        self.size = size
        self.ttl = max(1, int(ttl))
        self._append = script(client, "history_append.lua")

    @property
    def enabled(self) -> bool:
        return self.size > 0

    def append(self, fanouts: Sequence[tuple[str, Sequence[tuple[str, bytes]]]]) -> None:
        """Each (topic, [(message id, payload), ...]), in order, in one round
        trip: one script call per topic (a group of fanouts to one topic is
        one call), each topic's messages in the order given."""
        if not self.enabled or not fanouts:
            return
        by_topic: dict[str, list[object]] = {}
        for topic, messages in fanouts:
            args = by_topic.setdefault(topic, [])
            for message_id, payload in messages:
                args += [message_id, payload]
        now = str(int(time.time() * 1000))
        run_scripts(self.redis, [
            (self._append, [self.keys.history(topic), self.keys.history_meta(topic)],
             [self.size, self.ttl, uuid.uuid4().hex[:12], now, *args])
            for topic, args in by_topic.items()])

    def read(self, topic: str, since: int = 0, limit: int = 100,
             epoch: str | None = None) -> dict[str, object]:
        """Messages after offset ``since`` (0: from the oldest kept), at most
        ``limit``; ``recovered`` is False when some after ``since`` are gone
        (trimmed or expired), when ``epoch`` (the one the caller saw) is not
        the topic's now, or when the topic has no history at all."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(self.keys.history_meta(topic))
        pipe.xrange(self.keys.history(topic), min="-", max="+", count=1)
        pipe.xrange(self.keys.history(topic), min=f"{since + 1}-0", max="+", count=limit)
        meta, oldest, entries = pipe.execute()
        meta = {text(k): text(v) for k, v in meta.items()}
        last = int(meta.get("offset", 0))
        first = _offset(oldest[0][0]) if oldest else last + 1
        messages = [_message(entry_id, fields) for entry_id, fields in entries]
        return {"topic": topic, "epoch": meta.get("epoch"), "first": first, "last": last,
                "recovered": bool(meta) and since + 1 >= first
                and epoch in (None, meta.get("epoch")), "messages": messages}


def _offset(entry_id: bytes | str) -> int:
    return int(text(entry_id).split("-", 1)[0])


def _message(entry_id: bytes | str, fields: dict) -> dict[str, object]:
    fields = {text(k): v for k, v in fields.items()}
    payload = fields.get("p", b"")
    message: dict[str, object] = {"offset": _offset(entry_id), "message_id": text(fields["m"]),
                                  "at": int(text(fields["t"])) / 1000}
    try:
        message["payload"] = payload.decode("utf-8") if isinstance(payload, bytes) else payload
    except UnicodeDecodeError:
        message["payload_base64"] = base64.b64encode(payload).decode()
    return message
