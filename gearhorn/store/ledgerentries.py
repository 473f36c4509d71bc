"""The ledger's stream entries: how buffered events are packed into them,
and how they read back as flat rows (``ROW_FIELDS``). Pure.

Why it is shaped so: docs/design/notes.rst, "gearhorn/store/ledgerentries.py".
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Sequence

from gearhorn.rules.events import Event, copy_key, message_key
from gearhorn.rules.naming import copy_unique, queue_name

PUBLISHED_BATCH = "published-batch"
BATCH = "batch"

# Compact JSON: one line per message (JSON escapes a newline in a topic).
_dumps = json.JSONEncoder(separators=(",", ":")).encode


class SharedSubscribers:
    """The direct subscribers every message of a fanout went to, each copy
    named the plain way: queue ``<topic>_<client_id>``, unique
    ``<message_id>:<client_id>`` (gearhorn/rules/naming.py). Their ledger form
    (``ledger_json``) is made once for the fanout, not a pair per copy."""

    __slots__ = ("topic", "client_ids", "ledger_json")

    def __init__(self, topic: str, client_ids: Sequence[str]) -> None:
        self.topic = topic
        self.client_ids = tuple(client_ids)
        self.ledger_json = _dumps({"to": self.client_ids})


class SubscriberCopies(Sequence[tuple[str, str]]):
    """One message's copies (queue, unique) to :class:`SharedSubscribers`."""

    __slots__ = ("message_id", "shared")

    def __init__(self, message_id: str, shared: SharedSubscribers) -> None:
        self.message_id = message_id
        self.shared = shared

    def __len__(self) -> int:
        return len(self.shared.client_ids)

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return list(self)[index]
        return self._copy(self.shared.client_ids[index])

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return map(self._copy, self.shared.client_ids)

    def _copy(self, client_id: str) -> tuple[str, str]:
        return (queue_name(self.shared.topic, client_id),
                copy_unique(self.message_id, client_id))


def published_line(ts: int, message_id: str, topic: str, count: int,
                   copies: Sequence[tuple[str, str]]) -> str:
    """One message of a ``published-batch``: ``[ts, message_id, topic,
    count, copies]``, copies to :class:`SharedSubscribers` by client id."""
    if isinstance(copies, SubscriberCopies):
        return (f"[{ts},{_dumps(message_id)},{_dumps(topic)},{count},"
                f"{copies.shared.ledger_json}]")
    return _dumps([ts, message_id, topic, count, copies])


def batch_entry(kind: str, lines: Sequence[str], source: str) -> dict[str, str]:
    """A ``published-batch`` or ``batch`` entry of ``lines``."""
    entry = {"e": kind, "events": "\n".join(lines)}
    if source:
        entry["src"] = source
    return entry


def events_in(entry: dict[str, str]) -> int:
    """Events an entry holds: the lines of a batch, else one."""
    if entry.get("e") in (BATCH, PUBLISHED_BATCH):
        return entry["events"].count("\n") + 1
    return 1


def newest(entries: list[dict[str, str]], most: int) -> tuple[list[dict[str, str]], int]:
    """The newest of ``entries`` that hold at most ``most`` events, and the
    number of events in those left out."""
    held, kept = 0, len(entries)
    while kept and held + events_in(entries[kept - 1]) <= most:
        kept -= 1
        held += events_in(entries[kept])
    return entries[kept:], sum(map(events_in, entries[:kept]))


def rows_from_entries(entries: Iterable[tuple[str, dict[str, str]]]) -> Iterator[dict]:
    """Stream entries ``(id, fields)`` -> flat rows (``ROW_FIELDS``).

    A ``published`` entry gives one ``published`` row and one ``enqueued``
    row per copy it lists.
    """
    for stream_id, fields in entries:
        event = fields.get("e", "")
        if event == BATCH:
            yield from _batch_rows(stream_id, fields)
            continue
        if event == PUBLISHED_BATCH:
            yield from _published_rows(stream_id, fields)
            continue
        base = {"event": event, "ts": _int(fields.get("ts")),
                "message_id": fields.get("mid") or None, "topic": fields.get("topic") or None,
                "subscriber": fields.get("sub") or None, "unique": fields.get("u") or None,
                "count": None, "reason": fields.get("reason") or None,
                "redelivered": fields.get("r") == "1", "source": fields.get("src") or None,
                "stream_id": stream_id, "handle": None}
        base["message_key"] = message_key(base["message_id"])
        if event != Event.PUBLISHED:
            yield {**base, "copy_key": copy_key(base["subscriber"], base["unique"])}
            continue
        yield {**base, "count": _int(fields.get("n")), "copy_key": None}
        for line in filter(None, fields.get("subs", "").split("\n")):
            queue, _, unique = line.partition("\t")
            yield {**base, "event": Event.ENQUEUED.value, "subscriber": queue,
                   "unique": unique or None, "copy_key": copy_key(queue, unique)}


def _published_rows(stream_id: str, fields: dict[str, str]) -> Iterator[dict]:
    """Lines ``[ts, message_id, topic, count, copies]``: what a
    ``published`` entry each gave."""
    source = fields.get("src") or None
    for line in filter(None, fields.get("events", "").split("\n")):
        yield from _published_line_rows(line, stream_id, source)


def _published_line_rows(line: str, stream_id: str, source: str | None) -> Iterator[dict]:
    """One message's ``published`` row and its ``enqueued`` rows."""
    ts, message_id, topic, count, copies = json.loads(line)
    base = _published_row(ts, message_id, topic, count, stream_id, source)
    yield base
    if isinstance(copies, dict):  # to subscribers by client id, named the plain way
        copies = SubscriberCopies(message_id, SharedSubscribers(topic, copies["to"]))
    for queue, unique in copies:
        yield _enqueued_row(base, queue, unique)


def _published_row(ts: int, message_id: str, topic: str, count: int, stream_id: str,
                   source: str | None) -> dict:
    return {"event": Event.PUBLISHED.value, "ts": ts, "message_id": message_id,
            "topic": topic, "subscriber": None, "unique": None, "count": count,
            "reason": None, "redelivered": False, "source": source,
            "stream_id": stream_id, "copy_key": None, "message_key": message_key(message_id),
            "handle": None}


def _enqueued_row(published: dict, queue: str, unique: str) -> dict:
    return {**published, "event": Event.ENQUEUED.value, "subscriber": queue,
            "unique": unique or None, "count": None, "copy_key": copy_key(queue, unique)}


def _batch_rows(stream_id: str, fields: dict[str, str]) -> Iterator[dict]:
    """Lines ``event TAB ts TAB subscriber TAB unique TAB redelivered``, and
    ``TAB reason TAB generation TAB handle`` after them for an answer (the
    generation goes to ``count``: the hand-out of the held copy that was
    answered; ``handle``: gearmand's job handle of the run that ended)."""
    source = fields.get("src") or None
    for line in filter(None, fields.get("events", "").split("\n")):
        yield _batch_row(line, stream_id, source)


def _batch_row(line: str, stream_id: str, source: str | None) -> dict:
    parts = (line.split("\t") + [""] * 8)[:8]
    return {"event": parts[0], "ts": _int(parts[1]), "message_id": None, "topic": None,
            "subscriber": parts[2] or None, "unique": parts[3] or None,
            "count": _int(parts[6] or None),
            "reason": parts[5] or None, "redelivered": parts[4] == "1", "source": source,
            "stream_id": stream_id, "copy_key": copy_key(parts[2], parts[3]),
            "message_key": None, "handle": parts[7] or None}


class QueuePicker:
    """The rows of a few queues only, picked out of ledger entries without
    parsing the others' (the live audit's closer look reads a minute of
    every queue's entries for a few queues: docs/design/audit.rst). A batch
    line is found by a plain search for its subscriber field; a published
    line is parsed only if it names a topic one of the queues could belong
    to. Within an entry, rows come by queue, not in the entry's order."""

    def __init__(self, queues: Iterable[str]) -> None:
        self.queues = frozenset(queues)
        if not self.queues:
            raise ValueError("no queue to pick")
        # A queue is <topic>_<client id>, and either may hold "_": every
        # prefix before an "_" could be its topic, as a JSON string.
        splits = [(q[:i], q[i + 1:]) for q in self.queues for i, c in enumerate(q) if c == "_"]
        named = "|".join(re.escape(_dumps(t)) for t in sorted({t for t, _ in splits} | self.queues))
        self._names_topic = re.compile(named)
        self._client_ids: dict[str, set[str]] = {}  # topic -> client ids of these queues
        for topic, client_id in splits:
            self._client_ids.setdefault(topic, set()).add(client_id)

    def rows(self, entries: Iterable[tuple[str, dict[str, str]]]) -> Iterator[dict]:
        """What :func:`rows_from_entries` gives of these queues (no
        ``published`` rows: they name no queue)."""
        queues = self.queues
        for stream_id, fields in entries:
            event, source = fields.get("e", ""), fields.get("src") or None
            if event == BATCH:
                for line in self._batch_lines(fields.get("events", "")):
                    yield _batch_row(line, stream_id, source)
            elif event == PUBLISHED_BATCH:
                for line in fields.get("events", "").split("\n"):
                    if line and self._names_topic.search(line):
                        yield from self._enqueued_rows(line, stream_id, source)
            else:
                for row in rows_from_entries([(stream_id, fields)]):
                    if row["subscriber"] in queues:
                        yield row

    def _batch_lines(self, events: str) -> Iterator[str]:
        """The lines whose subscriber field is one of the queues: found by
        a plain search for TAB queue TAB (in C), checked after."""
        for queue in self.queues:
            needle = f"\t{queue}\t"
            at = events.find(needle)
            while at >= 0:
                start, end = events.rfind("\n", 0, at) + 1, events.find("\n", at)
                end = len(events) if end < 0 else end
                line = events[start:end]
                if line.split("\t", 3)[2:3] == [queue]:
                    yield line
                at = events.find(needle, end)

    def _enqueued_rows(self, line: str, stream_id: str, source: str | None) -> Iterator[dict]:
        """A published line's ``enqueued`` rows of these queues (the copies
        of the others are not named)."""
        ts, message_id, topic, count, copies = json.loads(line)
        if isinstance(copies, dict):
            wanted = self._client_ids.get(topic, ())
            picked = [(queue_name(topic, client_id), copy_unique(message_id, client_id))
                      for client_id in copies["to"] if client_id in wanted]
        else:
            picked = [(queue, unique) for queue, unique in copies if queue in self.queues]
        if picked:
            base = _published_row(ts, message_id, topic, count, stream_id, source)
            for queue, unique in picked:
                yield _enqueued_row(base, queue, unique)


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
