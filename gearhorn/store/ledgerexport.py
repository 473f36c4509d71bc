"""The ledger's export: its streams' new events as files, by date, that the
Spark pipeline reads (``gearhorn ledger export``; ``--follow`` repeats it).

Why it is shaped so: docs/design/notes.rst, "gearhorn/store/ledgerexport.py".
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime

import redis

from gearhorn.errors import GearhornError
from gearhorn.rules.events import FIELDS, Event
from gearhorn.store.keys import Keys
from gearhorn.store.ledger import now_ms
from gearhorn.store.ledgerentries import rows_from_entries
from gearhorn.store.redisutil import text

log = logging.getLogger(__name__)

CHECKPOINT = "_checkpoint"
# What gearmand held per queue at the last export: the report checks plain
# Gearman subscribers, which record no delivery, against it.
QUEUE_SNAPSHOT = "_queues.json"


def write_queue_snapshot(out_dir: str, queued: dict[str, int]) -> None:
    """``queued``: jobs per Gearman function, summed over every gearmand."""
    path = os.path.join(out_dir, QUEUE_SNAPSHOT)
    with open(path + ".tmp", "w", encoding="utf-8") as fp:
        json.dump({"taken_ms": now_ms(), "queued": queued}, fp)
    os.replace(path + ".tmp", path)



def _decode(fields: dict) -> dict[str, str]:
    return {text(k): text(v) for k, v in fields.items()}


class ExportError(GearhornError):
    """The export cannot be written as asked; the message says what to do."""


class ExportResult(dict):
    """rows, files, first_id, last_id, trimmed (events lost before export),
    read_at (ms: when the streams' ends were read, so every event written
    before then, less a writer's flush delay, is exported; None for an
    export redone to the ends an earlier one read)."""


def export(client: redis.Redis, keys: Keys, out_dir: str, fmt: str = "parquet",
           chunk: int = 10_000, shards: int = 1) -> ExportResult:
    """Write every event since the last export to ``out_dir/date=YYYY-MM-DD/``.

    Reads the ``shards`` streams of the ledger and merges them by stream id
    (time first; each writer's own events stay in their order). The ids it
    ends at go into ``out_dir/_checkpoint`` (JSON) before the files, and
    become the last exported ones after them: an export that dies half way
    is redone next time up to the same ids, into the same files (the
    module's docstring says why), so no event is lost or written twice.
    """
    if fmt not in ("parquet", "jsonl"):
        raise ValueError("format must be parquet or jsonl")
    os.makedirs(out_dir, exist_ok=True)
    since, pending = _read_checkpoint(out_dir)
    result = ExportResult(rows=0, files=[], first_id=None, last_id=None, trimmed=False,
                          read_at=None if pending else now_ms())
    ends = pending or _heads(client, keys, shards)
    if all(since.get(stream) == end for stream, end in ends.items()):
        return result  # nothing new
    if not pending:
        _write_checkpoint(out_dir, since, ends)  # the ids this export ends at, first
    readers = []
    for stream in sorted(ends):
        first = client.xrange(stream, count=1)
        done = since.get(stream)
        if done and first and _id_key(text(first[0][0])) > _id_key(_next_id(done)):
            result["trimmed"] = True  # MAXLEN dropped events nobody exported
            log.warning("ledger: events of %s between %s and %s were trimmed before export",
                        stream, done, text(first[0][0]))
        if done != ends[stream]:
            readers.append(_read_stream(client, stream, done, ends[stream], chunk))
    files: _DayFiles | None = None
    try:
        merged = heapq.merge(*readers, key=lambda entry: _id_key(entry[0]))
        while batch := list(itertools.islice(merged, chunk)):
            if files is None:
                result["first_id"] = batch[0][0]
                files = _DayFiles(out_dir, f"part-{batch[0][0].replace('-', '_')}", fmt)
            for day, rows in _by_day(rows_from_entries(batch)).items():
                files.add(day, rows)  # written now: memory holds one chunk per stream
            result["last_id"] = batch[-1][0]
    except BaseException:
        if files is not None:
            files.abandon()
        raise
    if files is not None:
        for path, rows in files.finish():
            result["files"].append(path)
            result["rows"] += rows
    _write_checkpoint(out_dir, {**since, **ends}, {})
    return result


def _heads(client: redis.Redis, keys: Keys, shards: int) -> dict[str, str]:
    """Stream key -> its newest id, for every stream of the ledger with any."""
    ends = {}
    for shard in range(shards):
        stream = keys.ledger(shard)
        head = client.xrevrange(stream, count=1)
        if head:
            ends[stream] = text(head[0][0])
    return ends


def start_at_heads(client: redis.Redis, keys: Keys, out_dir: str, shards: int) -> bool:
    """A folder exported for the first time starts at the streams' ends
    (the live audit judges what happens from its start, not the ledger's
    past); False when it was exported before."""
    os.makedirs(out_dir, exist_ok=True)
    if os.path.exists(os.path.join(out_dir, CHECKPOINT)):
        return False
    _write_checkpoint(out_dir, _heads(client, keys, shards), {})
    return True


TICKS = "clock"  # the folder of tick files, beside the days' folders


def write_tick(out_dir: str, ts_ms: int) -> str:
    """A file of one ``tick`` row at ``ts_ms``: event time moves on for a
    reader that follows the folder while the ledger is quiet."""
    folder = os.path.join(out_dir, TICKS)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"tick-{ts_ms}.parquet")
    row = dict.fromkeys((name for name, _ in FIELDS), None)
    row.update(event=Event.TICK.value, ts=ts_ms)
    _write_parquet(path + ".tmp", [row])
    os.replace(path + ".tmp", path)
    return path


def follow(client: redis.Redis, keys: Keys, out_dir: str, every: float,
           stop: threading.Event, fmt: str = "parquet", shards: int = 1,
           on_export: Callable[[ExportResult], None] | None = None) -> None:
    """:func:`export` every ``every`` seconds until ``stop`` is set; a Redis
    that is away is waited for (the next round takes what was missed)."""
    while not stop.is_set():
        try:
            result = export(client, keys, out_dir, fmt, shards=shards)
        except redis.RedisError as error:
            log.warning("ledger export: redis unavailable (%s); trying again in %gs",
                        error, every)
        else:
            if on_export is not None:
                on_export(result)
        stop.wait(every)


def entries(client: redis.Redis, keys: Keys, shards: int) -> list[tuple[str, dict[str, str]]]:
    """Every entry of every stream of the ledger, merged by id (tools, tests)."""
    readers = [_read_stream(client, keys.ledger(shard), None, "+", 10_000)
               for shard in range(shards)]
    return list(heapq.merge(*readers, key=lambda entry: _id_key(entry[0])))


def _read_stream(client: redis.Redis, stream: str, after: str | None, end: str,
                 chunk: int) -> Iterator[tuple[str, dict[str, str]]]:
    """Entries of ``stream`` after ``after`` up to ``end``, a chunk at a time."""
    start = "(" + after if after else "-"
    while True:
        batch = client.xrange(stream, min=start, max=end, count=chunk)
        for stream_id, fields in batch:
            yield text(stream_id), _decode(fields)
        if not batch or text(batch[-1][0]) == end:
            return
        start = "(" + text(batch[-1][0])


def _id_key(stream_id: str) -> tuple[int, int]:
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


def _next_id(stream_id: str) -> str:
    ms, _, seq = stream_id.partition("-")
    return f"{ms}-{int(seq or 0) + 1}"


def _read_checkpoint(out_dir: str) -> tuple[dict[str, str], dict[str, str]]:
    """(stream key -> last exported id, stream key -> id an unfinished export
    ends at). Checkpoints older than ``pending`` are the first map alone."""
    path = os.path.join(out_dir, CHECKPOINT)
    if not os.path.exists(path):
        return {}, {}
    with open(path) as fp:
        saved = json.loads(fp.read() or "{}")
    if "done" not in saved:
        return saved, {}
    return saved["done"], saved.get("pending", {})


def _write_checkpoint(out_dir: str, done: dict[str, str], pending: dict[str, str]) -> None:
    path = os.path.join(out_dir, CHECKPOINT)
    with open(path + ".tmp", "w") as fp:
        fp.write(json.dumps({"done": done, "pending": pending}, sort_keys=True) + "\n")
        fp.flush()
        os.fsync(fp.fileno())
    os.replace(path + ".tmp", path)


def _by_day(rows: Iterable[dict]) -> dict[str, list[dict]]:
    days: dict[str, list[dict]] = {}
    for row in rows:
        day = datetime.fromtimestamp((row["ts"] or 0) / 1000, UTC).strftime("%Y-%m-%d")
        days.setdefault(day, []).append(row)
    return days


class _DayFiles:
    """The files of one export, one per day (``date=YYYY-MM-DD/<name>.<fmt>``),
    written chunk by chunk as ``.tmp`` and put in place by :meth:`finish`."""

    def __init__(self, out_dir: str, name: str, fmt: str) -> None:
        self.out_dir, self.name, self.fmt = out_dir, name, fmt
        self.writers: dict[str, tuple[str, _ParquetRows | _JsonLines]] = {}
        self.rows: dict[str, int] = {}

    def add(self, day: str, rows: list[dict]) -> None:
        if day not in self.writers:
            folder = os.path.join(self.out_dir, f"date={day}")
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, f"{self.name}.{self.fmt}")
            kind = _JsonLines if self.fmt == "jsonl" else _ParquetRows
            self.writers[day] = (path, kind(path + ".tmp"))
            self.rows[day] = 0
        self.writers[day][1].write(rows)
        self.rows[day] += len(rows)

    def finish(self) -> list[tuple[str, int]]:
        done = []
        for day, (path, writer) in sorted(self.writers.items()):
            writer.close()
            os.replace(path + ".tmp", path)
            done.append((path, self.rows[day]))
        return done

    def abandon(self) -> None:
        for path, writer in self.writers.values():
            writer.close()
            os.remove(path + ".tmp")


class _JsonLines:
    def __init__(self, path: str) -> None:
        self.fp = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def write(self, rows: list[dict]) -> None:
        self.fp.writelines(json.dumps(row, separators=(",", ":")) + "\n" for row in rows)

    def close(self) -> None:
        self.fp.close()


class _ParquetRows:
    """A Parquet file of ledger rows, one row group per chunk written."""

    def __init__(self, path: str) -> None:
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise ExportError("Parquet export needs pyarrow (pip install pyarrow), "
                              "or use --format jsonl") from None
        types = {"string": pa.string(), "int64": pa.int64(), "bool": pa.bool_()}
        self.schema = pa.schema([(name, types[kind]) for name, kind in FIELDS])
        self.table = pa.Table
        self.writer = pq.ParquetWriter(path, self.schema, compression="zstd")

    def write(self, rows: list[dict]) -> None:
        self.writer.write_table(self.table.from_pylist(rows, schema=self.schema))

    def close(self) -> None:
        self.writer.close()


def _write_parquet(path: str, rows: list[dict]) -> None:
    """``rows`` as one Parquet file (tests and benchmarks make ledgers with it)."""
    writer = _ParquetRows(path)
    try:
        writer.write(rows)
    finally:
        writer.close()
