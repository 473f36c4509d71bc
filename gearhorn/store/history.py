"""Topic history: each topic's last messages, with an offset per topic and
an epoch that changes when its history is lost (Centrifugo's model).

Why it is shaped so: docs/design/notes.rst, "gearhorn/store/history.py".
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Sequence
from typing import NamedTuple

import redis

from gearhorn.rules.historypolicy import HistoryPolicy, Mode
from gearhorn.store.directcalls import DirectCalls
from gearhorn.store.keys import Keys
from gearhorn.store.redisutil import ScriptCall, script, text

# A worker's message run again (its fanout job handed out again) is not
# appended twice within this window, and among this many of its topic's
# newest: JetStream's default duplicate window, bounded for a busy topic.
REPEAT_WINDOW = 120.0
REPEAT_IDS = 10_000
# An append refused while another caller holds the topic's pen
# (lua/history_append.lua) is tried again after these pauses, growing; the
# holder gives it back once it hears it is wanted, or it lapses.
RETRY_FIRST, RETRY_MOST = 0.001, 0.05
REFUSED, LOST = -1, -2  # an append's first offset when it did not go in


class PenArgs(NamedTuple):
    """What an append says of the topic's pen: the caller's id ('' for none:
    a worker), the first offset it gave these messages itself (0: none; -1:
    its pen broke), and for how long it asks for the pen (ms, 0: not asked)."""

    caller: str = ""
    given: int = 0
    ask_ms: int = 0


NO_PEN = PenArgs()


class History:
    def __init__(self, client: redis.Redis, keys: Keys, policy: HistoryPolicy,
                 direct: DirectCalls | None = None) -> None:
        self.redis = client
        self.keys = keys
        self.policy = policy
        # The bridge's appends and feed reads go past the pool (directcalls.py);
        # everyone else's through the client's pool.
        self.direct = direct or DirectCalls.pooled(client)
        self._append = script(client, "history_append.lua")
        self._pen = script(client, "history_pen.lua")
        self._is_live = script(client, "history_live.lua")
        # Real-time topics found kept (True) or not (False) by this process's
        # last call: one it believes unread gets the one-key question, not
        # the append with every payload (:class:`Plan`).
        self.live: dict[str, bool] = {}

    @property
    def enabled(self) -> bool:
        return self.policy.enabled

    def append(self, fanouts: Sequence[tuple[str, Sequence[Entry]]], once_each: bool = False,
               pen: PenArgs = NO_PEN) -> list[tuple[str, int, int]]:
        """Each (topic, [(message id, payload, headers), ...]), in order, in
        one round trip: one script call per topic that keeps a history (a
        group of fanouts to one topic is one call), in the order given.
        Returns (epoch, first offset, last offset) of each call."""
        plan = self.plan(fanouts, once_each, pen)
        return plan.settle(self.direct.run_scripts(plan.calls) if plan.calls else [])

    def plan(self, fanouts: Sequence[tuple[str, Sequence[Entry]]],
             once_each: bool = False, pen: PenArgs = NO_PEN) -> Plan:
        """What :meth:`append` runs, for a caller that runs it with other
        scripts in one round trip (the look-ups of the workers and the
        bridge), then hands the replies to :meth:`Plan.settle`."""
        return Plan(self, fanouts, once_each, pen)

    def give_back(self, topic: str, caller: str, calm_ms: int) -> bool:
        """``caller`` has written every offset it gave with ``topic``'s pen:
        others append again (lua/history_pen.lua). Whether it held it."""
        return bool(self.direct.run_scripts([(self._pen, [self.keys.history_meta(topic)],
                                              [caller, calm_ms])])[0])

    def calls(self, fanouts: Sequence[tuple[str, Sequence[Entry]]],
              once_each: bool = False, pen: PenArgs = NO_PEN) -> list[ScriptCall]:
        """What :meth:`append` runs, for a caller that runs it with other
        scripts in one round trip (the workers' look-up: gearhorn/worker/fanout.py).
        Made again, they append nothing; with ``once_each``, no message
        appended in the last :data:`REPEAT_WINDOW` (and :data:`REPEAT_IDS`)
        is appended again, whatever the call's company (a worker's group of
        fanouts run again)."""
        by_topic: dict[str, list[object]] = {}
        for topic, messages in fanouts:
            if not self.policy.readable(topic):
                continue
            args = by_topic.setdefault(topic, [])
            for message_id, payload, headers in messages:
                args += [message_id, payload, json.dumps(headers) if headers else ""]
        now = str(int(time.time() * 1000))
        window = str(int(REPEAT_WINDOW * 1000)) if once_each else "0"
        return [(self._append, [self.keys.history(topic), self.keys.history_meta(topic),
                                self.keys.history_ids(topic)],
                 [*_size_ttl(mode := self.policy.mode(topic)), uuid.uuid4().hex[:12], now,
                  window, REPEAT_IDS, "1" if mode.while_read else "0", *pen, *args])
                for topic, args in by_topic.items()]

    def questions(self, topics: Sequence[str]) -> list[ScriptCall]:
        """Whether each real-time topic's history is kept now (read lately)."""
        return [(self._is_live, [self.keys.history_meta(topic)], []) for topic in topics]

    def linger(self, topic: str) -> int:
        """Seconds ``topic``'s history is kept after its last reader left."""
        return self.policy.mode(topic).ttl

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

    def offset_at(self, topic: str, at: float, page: int = 1000) -> int:
        """The offset of the first kept message published at or after ``at``
        (epoch seconds); one past the last if none was. Reads the stream a
        page at a time from the oldest: a history is bounded."""
        since_ms, start = at * 1000, "-"
        while entries := self.redis.xrange(self.keys.history(topic), min=start, max="+",
                                           count=page):
            for entry_id, fields in entries:
                if int(text(_text_keys(fields)["t"])) >= since_ms:
                    return _offset(entry_id)
            start = f"({text(entries[-1][0])}"
        return self.position(topic)[2] + 1

    def position(self, topic: str) -> tuple[str | None, int, int]:
        """(epoch, first kept offset, last offset) now; (None, 1, 0) for a
        topic with no history yet."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.hmget(self.keys.history_meta(topic), ["epoch", "offset"])
        pipe.xrange(self.keys.history(topic), min="-", max="+", count=1)
        (epoch, offset), oldest = pipe.execute()
        last = int(offset or 0)
        return (text(epoch) if epoch else None,
                _offset(oldest[0][0]) if oldest else last + 1, last)

    def entries(self, topic: str, after: int, count: int) -> tuple[str | None, list[Stored]]:
        """The topic's epoch, and up to ``count`` messages after offset
        ``after`` as stored. Offsets mean nothing without their epoch, so
        the epoch is read before and after the messages, in one round trip:
        the same both times (an epoch is never taken twice) says no new
        epoch lent the messages the old one's name; else it reads again.
        (Not a MULTI: redis-py's cluster transactions leave XRANGE's reply
        unparsed.)"""
        while True:
            pipe = self.redis.pipeline(transaction=False)
            pipe.hget(self.keys.history_meta(topic), "epoch")
            pipe.xrange(self.keys.history(topic), min=f"{after + 1}-0", max="+", count=count)
            pipe.hget(self.keys.history_meta(topic), "epoch")
            epoch, found, epoch_after = pipe.execute()
            if epoch == epoch_after:
                return (text(epoch) if epoch else None,
                        [_stored(entry_id, fields) for entry_id, fields in found])

    def epoch(self, topic: str) -> str | None:
        """The topic's epoch now (None: no history)."""
        epoch = self.redis.hget(self.keys.history_meta(topic), "epoch")
        return text(epoch) if epoch else None

    def wait(self, topic: str, after: int, block_ms: int, count: int) -> list[Stored]:
        """Messages after offset ``after``, waiting up to ``block_ms`` for one."""
        found = self.direct.xread({self.keys.history(topic): f"{after}-1"}, count, block_ms)
        return [_stored(entry_id, fields) for _, entries in found
                for entry_id, fields in entries]


Entry = tuple[str, bytes, dict[str, str] | None]  # message id, payload, headers
# A message as kept: offset, message id, payload, headers.
Stored = tuple[int, str, bytes, dict[str, str]]


def _stored(entry_id: bytes | str, fields: dict) -> Stored:
    fields = _text_keys(fields)
    headers = json.loads(fields["h"]) if "h" in fields else {}
    payload = fields.get("p", b"")
    return (_offset(entry_id), text(fields["m"]),
            payload if isinstance(payload, bytes) else payload.encode(), headers)


def _offset(entry_id: bytes | str) -> int:
    return int(text(entry_id).split("-", 1)[0])


def _text_keys(fields: dict) -> dict[str, object]:
    return {text(k): v for k, v in fields.items()}


def _message(entry_id: bytes | str, fields: dict) -> dict[str, object]:
    fields = _text_keys(fields)
    payload = fields.get("p", b"")
    message: dict[str, object] = {"offset": _offset(entry_id), "message_id": text(fields["m"]),
                                  "at": int(text(fields["t"])) / 1000}
    if "h" in fields:
        message["headers"] = json.loads(fields["h"])
    try:
        message["payload"] = payload.decode("utf-8") if isinstance(payload, bytes) else payload
    except UnicodeDecodeError:
        message["payload_base64"] = base64.b64encode(payload).decode()
    return message


class Plan:
    """The history calls of a group of fanouts. A real-time topic this
    process believes unread is asked whether it is kept (one key, no
    payload); when it is, its append is made after, in a round trip of its
    own (:meth:`settle`): a topic only Gearman subscribers read costs one
    tiny script call per group, not its payloads. An append refused while
    another caller holds the topic's pen is made again until it goes in."""

    def __init__(self, history: History, fanouts: Sequence[tuple[str, Sequence[Entry]]],
                 once_each: bool, pen: PenArgs = NO_PEN) -> None:
        self.history, self.once_each, self.pen = history, once_each, pen
        by_topic: dict[str, list[Entry]] = {}
        for topic, messages in fanouts:
            if history.policy.readable(topic):
                by_topic.setdefault(topic, []).extend(messages)
        self.by_topic = by_topic
        self.asked = [topic for topic in by_topic if history.policy.mode(topic).while_read
                      and not history.live.get(topic, False)]
        self.appended = [(topic, messages) for topic, messages in by_topic.items()
                         if topic not in self.asked]
        self.topics = list(by_topic)
        self.calls: list[ScriptCall] = (history.calls(self.appended, once_each, pen)
                                        + history.questions(self.asked))
        self.pens: dict[str, str] = {}  # topic -> what its reply said of the pen

    def settle(self, replies: Sequence[object]) -> list[tuple[str, int, int]]:
        """(epoch, first, last) of each topic of the group with a history, in
        order (('', 0, 0): not kept; first :data:`LOST`: the caller's pen was
        lost, nothing appended); appends the topics the questions found kept,
        and those refused for another's pen. ``replies``: those of
        :attr:`calls`, in order."""
        history, live = self.history, self.history.live
        if len(live) > 100_000:
            live.clear()  # a belief, not a record: asking again is always right
        where: dict[str, tuple[str, int, int]] = {}
        self._took([topic for topic, _ in self.appended], replies[:len(self.appended)], where)
        found = [topic for topic, reply in zip(self.asked, replies[len(self.appended):],
                                               strict=True) if int(reply)]
        for topic in self.asked:
            live[topic] = topic in found
        found += [topic for topic, _ in self.appended if where[topic][1] == REFUSED]
        pause = RETRY_FIRST
        while found := [topic for topic in found if where.get(topic, ("", REFUSED))[1] == REFUSED]:
            calls = history.calls([(topic, self.by_topic[topic]) for topic in found],
                                  self.once_each, self.pen)
            self._took(found, history.direct.run_scripts(calls), where)
            if any(where[topic][1] == REFUSED for topic in found):
                time.sleep(pause)  # the holder gives it back once it hears, or it lapses
                pause = min(pause * 2, RETRY_MOST)
        return [where.get(topic, ("", 0, 0)) for topic in self.topics]

    def _took(self, topics: Sequence[str], replies: Sequence[object],
              where: dict[str, tuple[str, int, int]]) -> None:
        live = self.history.live
        for topic, reply in zip(topics, replies, strict=True):
            where[topic] = appended_at(reply)
            self.pens[topic] = pen_of(reply)
            if self.history.policy.mode(topic).while_read:
                live[topic] = bool(where[topic][0])


def _size_ttl(mode: Mode) -> tuple[int, int]:
    return mode.size, mode.ttl


def appended_at(reply: list) -> tuple[str, int, int]:
    """An append call's reply: (epoch, first offset, last offset)."""
    epoch, first, last = reply[:3]
    return text(epoch), int(first), int(last)


def pen_of(reply: list) -> str:
    """What an append call's reply says of the topic's pen: 'held',
    'wanted' (held, and another caller waits for it) or ''."""
    return text(reply[3]) if len(reply) > 3 else ""
