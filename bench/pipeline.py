"""The report and the reconciliation on Spark local[2], DuckDB as the reference.

    python bench/pipeline.py                  # 1M, 10M and 30M rows (about 10 minutes)
    python bench/pipeline.py --rows 1000000   # one size

Generates a synthetic exported ledger (Parquet, like `gearhorn ledger
export`, with its 64-bit keys and real-sized names: 32-hex message ids,
copy keys ``<message id>:<client id>``): messages to 10 subscribers each,
every copy enqueued, delivered and acked (31 rows a message), with planted
problems: 1 copy in 10,000 never delivered, 1 in 20,000 delivered twice,
1 message in 50,000 with a wrong width. Then times, in the same run:

- the whole `gearhorn report` job (all tables, the HTML report) on local[2];
- the reconciliation alone on local[2], as the report makes it (read, find
  the problems, name them, collect the table);
- the same reconciliation in DuckDB (2 threads) as the single-machine peer,

and checks that Spark and DuckDB find the same problems.

    python bench/pipeline.py --compare-gc     # cold 30M reconciliation, G1 vs parallel

runs the reconciliation once in each of two fresh JVMs, one with G1 (Java's
default) and one with the parallel collector (what ``gearhorn report``
starts), on the same ledger, twice over, alternating.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from gearhorn.rules.events import copy_key, message_key  # noqa: E402

WIDTH = 10
ROWS_PER_MESSAGE = 1 + 3 * WIDTH
CHUNK = 100_000  # messages per file


def _strings(prefix: str, numbers: np.ndarray) -> pa.Array:
    return pc.binary_join_element_wise(prefix, pc.cast(pa.array(numbers), pa.string()), "")


def generate(folder: str, rows: int, seed: int = 7) -> dict:
    """Write the ledger; returns the planted problem counts."""
    rng = np.random.default_rng(seed)
    messages = rows // ROWS_PER_MESSAGE
    planted = {"never_delivered": 0, "duplicate": 0, "width_mismatch": 0}
    day = os.path.join(folder, "date=2026-11-22")
    os.makedirs(day, exist_ok=True)
    for n, first in enumerate(range(0, messages, CHUNK)):
        ids = np.arange(first, min(messages, first + CHUNK))
        table, counts = _chunk(ids, rng, spacing_ms=max(1, 6 * 3_600_000 // messages))
        for k, v in counts.items():
            planted[k] += v
        pq.write_table(table, os.path.join(day, f"part-{n:04d}.parquet"))
    return planted


def _chunk(ids: np.ndarray, rng, spacing_ms: int) -> tuple[pa.Table, dict]:
    """Messages ``ids``, published ``spacing_ms`` apart (6 hours in all)."""
    m = len(ids)
    ts0 = 1_795_000_000_000 + ids * spacing_ms
    mid_text = [rng.bytes(16).hex() for _ in range(m)]
    mid = pa.array(mid_text)
    topic_no = ids % 100
    wrong = rng.random(m) < 1 / 50_000
    count = np.where(wrong, WIDTH + 1, WIDTH)
    copy_msg = np.repeat(np.arange(m), WIDTH)
    copy_sub = np.tile(np.arange(WIDTH), m)
    lost = rng.random(m * WIDTH) < 1 / 10_000
    twice = (rng.random(m * WIDTH) < 1 / 20_000) & ~lost
    subscriber = pc.binary_join_element_wise(
        _strings("topic", topic_no[copy_msg]), _strings("c", copy_sub), "_")
    unique = pc.binary_join_element_wise(pc.take(mid, pa.array(copy_msg)),
                                         _strings("c", copy_sub), ":")
    copy_ts = ts0[copy_msg]
    keys = pa.array([copy_key(s, u) for s, u in zip(subscriber.to_pylist(), unique.to_pylist(),
                                                    strict=True)], pa.int64())
    mkeys = pa.array([message_key(x) for x in mid_text], pa.int64())

    def block(event, n, ts, **cols):
        base = {"event": pa.array([event] * n), "ts": pa.array(ts, pa.int64()),
                "message_id": pa.nulls(n, pa.string()), "topic": pa.nulls(n, pa.string()),
                "subscriber": pa.nulls(n, pa.string()), "unique": pa.nulls(n, pa.string()),
                "count": pa.nulls(n, pa.int64()), "reason": pa.nulls(n, pa.string()),
                "redelivered": pa.array(np.zeros(n, bool)), "source": pa.nulls(n, pa.string()),
                "stream_id": pa.nulls(n, pa.string()), "copy_key": pa.nulls(n, pa.int64()),
                "message_key": pa.nulls(n, pa.int64())}
        base.update(cols)
        return pa.table(base)

    topic = _strings("topic", topic_no)
    keep = pa.array(~lost)
    delivered_idx = np.concatenate([np.nonzero(~lost)[0], np.nonzero(twice)[0]])
    d_idx = pa.array(delivered_idx)
    parts = [
        block("published", m, ts0, message_id=mid, topic=topic,
              count=pa.array(count, pa.int64()), message_key=mkeys),
        block("enqueued", m * WIDTH, copy_ts, message_id=pc.take(mid, pa.array(copy_msg)),
              topic=pc.take(topic, pa.array(copy_msg)), subscriber=subscriber, unique=unique,
              copy_key=keys, message_key=pc.take(mkeys, pa.array(copy_msg))),
        block("delivered", len(delivered_idx), copy_ts[delivered_idx] + 5 +
              rng.integers(0, 50, len(delivered_idx)),
              subscriber=pc.take(subscriber, d_idx), unique=pc.take(unique, d_idx),
              copy_key=pc.take(keys, d_idx)),
        block("acked", int((~lost).sum()), copy_ts[~lost] + 60,
              subscriber=pc.filter(subscriber, keep), unique=pc.filter(unique, keep),
              copy_key=pc.filter(keys, keep)),
    ]
    counts = {"never_delivered": int(lost.sum()), "duplicate": int(twice.sum()),
              "width_mismatch": int(wrong.sum())}
    return pa.concat_tables(parts), counts


# The same algorithm as gearhorn/pipeline/transforms.py: problems by key,
# then their names.
DUCKDB_SQL = """
WITH events AS (SELECT * FROM read_parquet('{path}/**/*.parquet')),
c AS (
  SELECT copy_key, count(*) FILTER (WHERE event = 'delivered') AS deliveries,
         count(*) FILTER (WHERE event = 'delivered' AND NOT redelivered) AS firsts
  FROM events WHERE event IN ('enqueued', 'delivered') AND copy_key IS NOT NULL
  GROUP BY copy_key
  HAVING count(*) FILTER (WHERE event = 'enqueued') > 0 AND (deliveries = 0 OR firsts > 1)),
w AS (
  SELECT message_key FROM events
  WHERE event IN ('published', 'enqueued') AND message_key IS NOT NULL GROUP BY message_key
  HAVING max(count) FILTER (WHERE event = 'published') <>
         count(*) FILTER (WHERE event = 'enqueued')),
tracked AS (SELECT DISTINCT subscriber FROM events WHERE event IN ('attached', 'delivered')),
named AS (
  SELECT DISTINCT CASE WHEN c.firsts > 1 THEN 'duplicate'
                       WHEN c.deliveries = 0 AND t.subscriber IS NOT NULL
                       THEN 'never_delivered' END AS kind, e.subscriber, e."unique"
  FROM events e JOIN c ON e.copy_key = c.copy_key
  LEFT JOIN tracked t ON t.subscriber = e.subscriber
  WHERE e.event = 'enqueued')
SELECT kind, count(*) FROM named WHERE kind IS NOT NULL GROUP BY kind
UNION ALL SELECT 'width_mismatch', count(DISTINCT e.message_id)
  FROM events e JOIN w ON e.message_key = w.message_key WHERE e.event = 'published'
"""


def duckdb_reconcile(path: str) -> tuple[dict, float]:
    import duckdb

    con = duckdb.connect()
    con.execute("SET threads = 2")
    start = time.perf_counter()
    found = dict(con.execute(DUCKDB_SQL.format(path=path)).fetchall())
    return found, time.perf_counter() - start


def spark_reconcile(spark, path: str) -> tuple[dict, float]:
    from gearhorn.pipeline.job import Options, load_events, reconcile

    start = time.perf_counter()
    events, _ = load_events(spark, Options(path, ""))
    table = reconcile(events)
    found: dict[str, int] = {}
    for row in table.collect():
        found[row["kind"]] = found.get(row["kind"], 0) + 1
    seconds = time.perf_counter() - start
    table.unpersist()
    return found, seconds


def cold_reconcile(path: str, java_options: str) -> float:
    """Seconds of a reconciliation as the first query of a new JVM."""
    import subprocess

    env = {**os.environ, "PYSPARK_SUBMIT_ARGS":
           f"--driver-memory 6g --driver-java-options {java_options} pyspark-shell"}
    code = ("import sys; sys.path.insert(0, 'bench'); import pipeline; "
            "from gearhorn.pipeline.job import Options, spark_session; "
            "spark = spark_session(Options('', '', master='local[2]', shuffle_partitions=8)); "
            "spark.sparkContext.setLogLevel('ERROR'); "
            f"print(pipeline.spark_reconcile(spark, {path!r})[1])")
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, text=True,
                         capture_output=True, cwd=os.path.join(os.path.dirname(__file__), ".."))
    return float(out.stdout.strip().splitlines()[-1])


def compare_gc(rows: int) -> None:
    tmp = tempfile.mkdtemp(prefix="gearhorn-bench-")
    try:
        path = os.path.join(tmp, "ledger")
        generate(path, rows)
        print(f"cold reconciliation of {rows:,} rows, each in a new JVM:", flush=True)
        for _ in range(2):
            for name, flag in (("G1", "-XX:+UseG1GC"), ("parallel", "-XX:+UseParallelGC")):
                print(f"  {name:>8} {cold_reconcile(path, flag):6.1f}s", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, action="append",
                        help="ledger rows (repeatable; default 1M, 10M, 30M)")
    parser.add_argument("--compare-gc", action="store_true",
                        help="cold reconciliation with G1 and with the parallel collector")
    args = parser.parse_args()
    if args.compare_gc:
        compare_gc((args.rows or [30_000_000])[-1])
        return
    sizes = args.rows or [1_000_000, 10_000_000, 30_000_000]
    os.environ.setdefault("PYSPARK_SUBMIT_ARGS", "--driver-memory 6g pyspark-shell")
    from gearhorn.pipeline.job import Options, run, spark_session

    tmp = tempfile.mkdtemp(prefix="gearhorn-bench-")
    try:
        spark = spark_session(Options("", "", master="local[2]", shuffle_partitions=8))
        spark.sparkContext.setLogLevel("ERROR")
        print(f"{'rows':>12} {'report (Spark)':>15} {'reconcile (Spark)':>18} "
              f"{'reconcile (DuckDB)':>19} {'ratio':>6}  problems found = planted", flush=True)
        for rows in sizes:
            path = os.path.join(tmp, f"ledger{rows}")
            planted = generate(path, rows)
            found, spark_s = spark_reconcile(spark, path)
            reference, duck_s = duckdb_reconcile(path)
            report_start = time.perf_counter()
            run(Options(path, os.path.join(tmp, f"report{rows}"), master="local[2]",
                        shuffle_partitions=8, quiet=True))
            report_s = time.perf_counter() - report_start
            nonzero = [{k: v for k, v in d.items() if v} for d in (found, reference, planted)]
            agree = nonzero[0] == nonzero[1] == nonzero[2]
            print(f"{rows:>12,} {report_s:>14.1f}s {spark_s:>17.1f}s {duck_s:>18.1f}s "
                  f"{spark_s / duck_s:>6.1f}  {agree} {nonzero[0]}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
