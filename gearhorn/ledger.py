"""The delivery ledger: events in a bounded Redis Stream, exported to files.

One stream entry per message published (it lists every copy enqueued, so a
fanout to 1,000 subscribers costs one XADD) and one per bridge event
(delivered, acked, attached; these as lines of one ``batch`` entry per
flush). Events are buffered and written in batches
every 0.1-0.2 s by a background flusher, so no job waits for the ledger.
``export`` turns entries into flat rows, one per event, which is what the
Spark pipeline reads.

Row fields (``ROW_FIELDS``): ``event`` (published, enqueued, attached,
delivered, acked, failed), ``ts`` (epoch milliseconds), ``message_id``,
``topic``, ``subscriber`` (the copy's queue, ``<topic>_<client_id>``),
``unique`` (the copy's Gearman unique key, which names one copy), ``count``
(subscribers of a published message), ``reason`` (failed), ``redelivered``,
``source`` (the worker or bridge that wrote it), ``stream_id``, and two
64-bit keys the pipeline groups by instead of strings: ``copy_key`` (of
``subscriber`` and ``unique``) and ``message_key`` (of ``message_id``).
They are Spark's ``xxhash64`` of the same columns, so the pipeline computes
them itself for rows exported without them (see :func:`copy_key`).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime

import redis

from gearhorn.background import StoppableThread
from gearhorn.events import FIELDS, Event, copy_key, message_key
from gearhorn.keys import Keys
from gearhorn.redisutil import text

log = logging.getLogger(__name__)

CHECKPOINT = "_checkpoint"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class Ledger:
    """Buffers events and writes them in batches; a disabled ledger does nothing.

    Appending never waits for Redis: ``flush`` (called by the owner's timer,
    or a ``Flusher`` thread) writes everything buffered in one round trip.
    """

    def __init__(self, client: redis.Redis, keys: Keys, maxlen: int = 1_000_000,
                 enabled: bool = True, source: str = "") -> None:
        self.redis = client
        self.stream = keys.ledger
        self.maxlen = maxlen
        self.enabled = enabled
        self.source = source
        self._buffer: list[dict[str, str]] = []
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self.lost = 0  # events dropped because Redis failed

    def published(self, topic: str, message_id: str,
                  copies: Sequence[tuple[str, str]]) -> None:
        """``message_id`` of ``topic`` went to ``copies`` (queue, unique)."""
        subs = "\n".join(f"{queue}\t{unique}" for queue, unique in copies)
        self._add({"e": Event.PUBLISHED.value, "ts": str(now_ms()), "mid": message_id,
                   "topic": topic, "n": str(len(copies)), "subs": subs})

    def failed(self, reason: str, topic: str = "", subscriber: str = "", unique: str = "",
               message_id: str = "") -> None:
        self._add({"e": Event.FAILED.value, "ts": str(now_ms()), "reason": reason[:500],
                   "topic": topic, "sub": subscriber, "u": unique, "mid": message_id})

    def record(self, event: str, subscriber: str, unique: str = "",
               redelivered: bool = False) -> None:
        """A bridge event: attached, delivered, acked. These are many (two per
        message and subscriber), so they travel as lines of one ``batch``
        entry per flush instead of an entry each."""
        if self.enabled:
            line = f"{event}\t{now_ms()}\t{subscriber}\t{unique}\t{'1' if redelivered else ''}"
            with self._lock:
                self._lines.append(line)

    def _add(self, fields: dict[str, str]) -> None:
        if self.enabled:
            if self.source:
                fields["src"] = self.source
            with self._lock:
                self._buffer.append(fields)

    @property
    def buffered(self) -> int:
        return len(self._buffer) + len(self._lines)

    def flush(self) -> None:
        """Write what is buffered in one round trip; on a Redis error the
        events are counted in ``lost`` and logged, never raised."""
        with self._lock:
            events, self._buffer = self._buffer, []
            lines, self._lines = self._lines, []
        if lines:
            batch = {"e": "batch", "events": "\n".join(lines)}
            if self.source:
                batch["src"] = self.source
            events.append(batch)
        if not events:
            return
        pipe = self.redis.pipeline(transaction=False)
        for fields in events:
            pipe.xadd(self.stream, fields, maxlen=self.maxlen, approximate=True)
        try:
            pipe.execute()
        except redis.RedisError as exc:
            self.lost += len(events)
            log.warning("ledger: %d events lost: %s", len(events), exc)


class Flusher(StoppableThread):
    """Flushes a ledger every ``interval`` seconds (worker processes)."""

    def __init__(self, ledger: Ledger, interval: float = 0.1) -> None:
        super().__init__("gearhorn-ledger")
        self.ledger = ledger
        self.interval = interval

    def run(self) -> None:
        while not self.stopping.wait(self.interval):
            self.ledger.flush()

    def stop(self, timeout: float | None = 5.0) -> None:
        super().stop(timeout)
        self.ledger.flush()  # what the last turn left


# -- entries to rows (pure) ------------------------------------------------------

def rows_from_entries(entries: Iterable[tuple[str, dict[str, str]]]) -> Iterator[dict]:
    """Stream entries ``(id, fields)`` -> flat rows (``ROW_FIELDS``).

    A ``published`` entry gives one ``published`` row and one ``enqueued``
    row per copy it lists.
    """
    for stream_id, fields in entries:
        event = fields.get("e", "")
        if event == "batch":
            yield from _batch_rows(stream_id, fields)
            continue
        base = {"event": event, "ts": _int(fields.get("ts")),
                "message_id": fields.get("mid") or None, "topic": fields.get("topic") or None,
                "subscriber": fields.get("sub") or None, "unique": fields.get("u") or None,
                "count": None, "reason": fields.get("reason") or None,
                "redelivered": fields.get("r") == "1", "source": fields.get("src") or None,
                "stream_id": stream_id}
        base["message_key"] = message_key(base["message_id"])
        if event != Event.PUBLISHED:
            yield {**base, "copy_key": copy_key(base["subscriber"], base["unique"])}
            continue
        yield {**base, "count": _int(fields.get("n")), "copy_key": None}
        for line in filter(None, fields.get("subs", "").split("\n")):
            queue, _, unique = line.partition("\t")
            yield {**base, "event": Event.ENQUEUED.value, "subscriber": queue,
                   "unique": unique or None, "copy_key": copy_key(queue, unique)}


def _batch_rows(stream_id: str, fields: dict[str, str]) -> Iterator[dict]:
    """Lines ``event TAB ts TAB subscriber TAB unique TAB redelivered``."""
    source = fields.get("src") or None
    for line in filter(None, fields.get("events", "").split("\n")):
        parts = (line.split("\t") + [""] * 5)[:5]
        yield {"event": parts[0], "ts": _int(parts[1]), "message_id": None, "topic": None,
               "subscriber": parts[2] or None, "unique": parts[3] or None, "count": None,
               "reason": None, "redelivered": parts[4] == "1", "source": source,
               "stream_id": stream_id, "copy_key": copy_key(parts[2], parts[3]),
               "message_key": None}


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


# -- export ----------------------------------------------------------------------


def _decode(fields: dict) -> dict[str, str]:
    return {text(k): text(v) for k, v in fields.items()}


class ExportResult(dict):
    """rows, files, first_id, last_id, trimmed (events lost before export)."""


def export(client: redis.Redis, keys: Keys, out_dir: str, fmt: str = "parquet",
           chunk: int = 10_000) -> ExportResult:
    """Write every event since the last export to ``out_dir/date=YYYY-MM-DD/``.

    The last exported stream id is kept in ``out_dir/_checkpoint``, written
    after the files: an export that dies half way is redone whole next time
    (its files are replaced: they are named by the same first id), so no
    event is lost or written twice.
    """
    if fmt not in ("parquet", "jsonl"):
        raise ValueError("format must be parquet or jsonl")
    os.makedirs(out_dir, exist_ok=True)
    since = _read_checkpoint(out_dir)
    head = client.xrevrange(keys.ledger, count=1)
    result = ExportResult(rows=0, files=[], first_id=None, last_id=since, trimmed=False)
    if not head:
        return result
    end = text(head[0][0])
    first = client.xrange(keys.ledger, count=1)
    if since and first and text(first[0][0]) > _next_id(since):
        result["trimmed"] = True  # MAXLEN dropped events nobody exported
        log.warning("ledger: events between %s and %s were trimmed before export",
                    since, text(first[0][0]))
    rows_by_date: dict[str, list[dict]] = {}
    start = "(" + since if since else "-"
    while True:
        batch = client.xrange(keys.ledger, min=start, max=end, count=chunk)
        if not batch:
            break
        entries = [(text(i), _decode(f)) for i, f in batch]
        result["first_id"] = result["first_id"] or entries[0][0]
        for row in rows_from_entries(entries):
            day = datetime.fromtimestamp((row["ts"] or 0) / 1000, UTC).strftime("%Y-%m-%d")
            rows_by_date.setdefault(day, []).append(row)
        start = "(" + entries[-1][0]
        if entries[-1][0] == end:
            break
    if result["first_id"] is None:
        return result
    name = f"part-{result['first_id'].replace('-', '_')}"
    for day, rows in sorted(rows_by_date.items()):
        path = _write(out_dir, day, name, rows, fmt)
        result["files"].append(path)
        result["rows"] += len(rows)
    _write_checkpoint(out_dir, end)
    result["last_id"] = end
    return result


def _next_id(stream_id: str) -> str:
    ms, _, seq = stream_id.partition("-")
    return f"{ms}-{int(seq or 0) + 1}"


def _read_checkpoint(out_dir: str) -> str | None:
    path = os.path.join(out_dir, CHECKPOINT)
    if not os.path.exists(path):
        return None
    with open(path) as fp:
        return fp.read().strip() or None


def _write_checkpoint(out_dir: str, last_id: str) -> None:
    path = os.path.join(out_dir, CHECKPOINT)
    with open(path + ".tmp", "w") as fp:
        fp.write(last_id + "\n")
        fp.flush()
        os.fsync(fp.fileno())
    os.replace(path + ".tmp", path)


def _write(out_dir: str, day: str, name: str, rows: list[dict], fmt: str) -> str:
    folder = os.path.join(out_dir, f"date={day}")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{name}.{fmt}")
    tmp = path + ".tmp"
    if fmt == "jsonl":
        with open(tmp, "w") as fp:
            for row in rows:
                fp.write(json.dumps(row, separators=(",", ":")) + "\n")
    else:
        _write_parquet(tmp, rows)
    os.replace(tmp, path)
    return path


def _write_parquet(path: str, rows: list[dict]) -> None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise RuntimeError("Parquet export needs pyarrow (pip install pyarrow), "
                           "or use --format jsonl") from None
    types = {"string": pa.string(), "int64": pa.int64(), "bool": pa.bool_()}
    schema = pa.schema([(name, types[kind]) for name, kind in FIELDS])
    table = pa.Table.from_pylist(rows, schema=schema)
    pq.write_table(table, path, compression="zstd")
