"""Entry point of the report: ``gearhorn report`` or ``spark-submit``.

    spark-submit --master spark://host:7077 --py-files gearhorn.zip \\
        gearhorn/pipeline/job.py --ledger /data/ledger --out /data/report

Without ``--master`` Spark chooses (spark-submit's, or local[*] for a plain
``python``); gearhorn never hard-codes one.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
from dataclasses import dataclass

if __package__ in (None, ""):  # run as a file by spark-submit
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))

from gearhorn.errors import GearhornError
from gearhorn.pipeline import needs
from gearhorn.pipeline import transforms as T  # noqa: E402
from gearhorn.store.redisconn import REDIS_ERRORS

# Problem rows the reconciliation sends to every task to find their names;
# beyond this (a subscriber that never took anything, say) it shuffles.
BROADCAST_PROBLEMS = 1_000_000

# The JVM gearhorn starts itself (``gearhorn report``, not spark-submit) runs
# a batch job on few cores: the throughput collector beat G1 on 2 cores
# (``bench/pipeline.py --compare-gc``, docs/benchmarks.rst).
LOCAL_JAVA_OPTIONS = "-XX:+UseParallelGC"


class PipelineError(GearhornError, RuntimeError):
    """A problem a person can fix; the message says how."""


@dataclass(frozen=True)
class Options:
    ledger: str
    out: str
    master: str | None = None
    stale_after_s: float = 300.0
    shuffle_partitions: int = 4
    now_ms: int | None = None  # "now" for staleness; the latest event if None
    quiet: bool = False
    input_format: str = "auto"  # parquet, jsonl, or auto (by file names)
    findings: str | None = None  # the live audit's findings folder, read beside the ledger


def check_java() -> None:
    """Java (and pyspark) present, or one line that says what to install."""
    reason = needs.spark_missing()
    if reason is not None:
        raise PipelineError(reason)


def ledger_files(path: str, fmt: str = "auto") -> tuple[str, list[str]]:
    """The input format and files; a clear error when there are none.

    A URL (``hdfs://``, ``s3a://``) is handed to Spark as it is, in ``fmt``
    (parquet unless told otherwise): only Spark can list it.
    """
    if "://" in path:
        return ("parquet" if fmt == "auto" else fmt), [path]
    if not os.path.isdir(path):
        raise PipelineError(f"ledger folder {path} does not exist: "
                            f"run `gearhorn ledger export --out {path}` first")
    for kind in ("parquet", "jsonl") if fmt == "auto" else (fmt,):
        files = glob.glob(os.path.join(path, "**", f"*.{kind}"), recursive=True)
        if files:
            return kind, files
    raise PipelineError(f"no ledger files (*.parquet, *.jsonl) under {path}: "
                        f"run `gearhorn ledger export --out {path}` first")


def spark_session(options: Options):
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.appName("gearhorn-report")
               .config("spark.sql.shuffle.partitions", str(options.shuffle_partitions))
               .config("spark.sql.session.timeZone", "UTC"))
    if options.master:
        builder = builder.master(options.master)
    if _starts_its_own_jvm():
        builder = builder.config("spark.driver.extraJavaOptions", LOCAL_JAVA_OPTIONS)
    return builder.getOrCreate()


def _starts_its_own_jvm() -> bool:
    """True when this process will launch the JVM and nobody chose its Java
    options (spark-submit sets PYSPARK_GATEWAY_PORT; a user may set them in
    PYSPARK_SUBMIT_ARGS)."""
    submit_args = os.environ.get("PYSPARK_SUBMIT_ARGS", "")
    chosen = "--driver-java-options" in submit_args or "extraJavaOptions" in submit_args
    return "PYSPARK_GATEWAY_PORT" not in os.environ and not chosen


def queue_snapshot(spark, ledger: str):
    """What gearmand held per queue when the ledger was last exported
    (``_queues.json``, written by ``gearhorn ledger export``) as a DataFrame
    of subscriber, queued; None when there is none."""
    from gearhorn.store.ledgerexport import QUEUE_SNAPSHOT

    path = os.path.join(ledger, QUEUE_SNAPSHOT)
    if "://" in ledger or not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as fp:
        queued = json.load(fp)["queued"]
    return spark.createDataFrame(list(queued.items()) or [("", 0)],
                                 "subscriber string, queued long")


def audit_findings(spark, folder: str | None) -> dict:
    """``{"audit_findings": DataFrame}`` of what the live audit wrote to
    ``folder`` (gearhorn/pipeline/audit.py), or nothing without findings."""
    if folder is None:
        return {}
    schema = _findings_schema()
    found = spark.createDataFrame([], schema)
    # Spark's audit writes Parquet; the count-first one, JSON Lines.
    remote = "://" in folder
    if remote or glob.glob(os.path.join(folder, "*.parquet")):
        found = spark.read.schema(schema).parquet(
            folder if remote else os.path.join(folder, "*.parquet"))
    if not remote and glob.glob(os.path.join(folder, "*.jsonl")):
        found = found.unionByName(spark.read.schema(schema).json(
            os.path.join(folder, "*.jsonl")))
    return {"audit_findings": found.orderBy("found_ts")}


def _findings_schema():
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from gearhorn.pipeline.verdicts import FINDING_FIELDS

    kinds = {"string": StringType(), "int64": LongType()}
    return StructType([StructField(name, kinds[kind]) for name, kind in FINDING_FIELDS])


def load_events(spark, options: Options):
    """(usable keyed events, number of malformed rows)."""
    fmt, files = ledger_files(options.ledger, options.input_format)
    if fmt == "parquet":
        return _load_parquet(spark, files)
    return _load_jsonl(spark, files)


def _load_parquet(spark, files: list[str]):
    from functools import reduce

    from pyspark.sql import functions as F

    keyed, unkeyed = split_by_keys(files)
    read = spark.read.schema(T.EVENT_SCHEMA).parquet
    # Files with the key columns are read as they are: computing a key that
    # is there would mean reading every name (most of the reconciliation's
    # time at 30M rows).
    parts = ([read(*keyed)] if keyed else []) + ([T.with_keys(read(*unkeyed))] if unkeyed else [])
    raw = reduce(lambda a, b: a.unionByName(b), parts)
    total, good = raw.agg(F.count("*"), F.count(F.when(T.well_formed(), 1))).first()
    return raw.filter(T.well_formed()), total - good


def _load_jsonl(spark, files: list[str]):
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    schema = StructType(T.EVENT_SCHEMA.fields + [StructField("_corrupt", StringType())])
    raw = (spark.read.schema(schema).option("mode", "PERMISSIVE")
           .option("columnNameOfCorruptRecord", "_corrupt").json(files))
    raw = raw.cache()  # Spark reads the corrupt-record column only from a cached frame
    good = raw.filter(F.col("_corrupt").isNull() & T.well_formed()).drop("_corrupt")
    malformed = raw.count() - good.count()
    return T.with_keys(good), malformed


def split_by_keys(files: list[str]) -> tuple[list[str], list[str]]:
    """(Parquet files with ``copy_key`` and ``message_key`` columns, the
    rest). Only local files are looked at (their footers); a URL goes with
    the rest, whose keys are computed."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        return [], files
    keyed, unkeyed = [], []
    for path in files:
        local = "://" not in path
        names = set(pq.read_schema(path).names) if local else set()
        (keyed if {"copy_key", "message_key"} <= names else unkeyed).append(path)
    return keyed, unkeyed


def reconcile(events):
    """The reconciliation: everything that does not add up, empty when
    nothing was lost. The one entry point (the report, the benchmark and the
    tests use it).

    kind ``never_delivered``: a copy for a tracked subscriber with no
    delivery; ``duplicate``: a copy delivered more than once without the
    ``redelivered`` flag (the client may have processed it twice);
    ``width_mismatch``: a message whose published subscriber count differs
    from the distinct copies enqueued for it; ``stream_gap`` and
    ``stream_duplicate``: offsets a stream subscription skipped or was given
    twice (``T.stream_problems``).

    Keyed events (``T.with_keys``) in; the table comes back computed and
    cached (it is small; ``unpersist`` it when done): the problem keys first
    (one aggregation each), then their names, broadcast when few. Copies
    are told apart by their 64-bit key: two that collide would count as one;
    the chance that this hides a problem is about problems x copies / 2**64,
    below 1e-9 for 10M copies (docs/pipeline.rst).
    """
    copies_wrong = T.copy_problems(events).cache()
    suspects = T.width_suspects(events).cache()
    widths_wrong = suspects
    try:
        suspected = suspects.count()
        if suspected:  # else the distinct count would be a pass for nothing
            widths_wrong = T.width_problems(events, suspects,
                                            broadcast=suspected <= BROADCAST_PROBLEMS).cache()
        few = copies_wrong.count() + widths_wrong.count() <= BROADCAST_PROBLEMS
        table = (T.name_problems(events, copies_wrong, widths_wrong, broadcast=few)
                 .unionByName(T.stream_problems(events)).cache())
        table.count()
    finally:
        for frame in {id(f): f for f in (copies_wrong, suspects, widths_wrong)}.values():
            frame.unpersist()
    return table


def run(options: Options) -> dict:
    """Build every table and the report; returns the summary."""
    check_java()
    ledger_files(options.ledger, options.input_format)
    say = (lambda *a: None) if options.quiet else (lambda *a: print(*a, flush=True))
    started = time.monotonic()
    say(f"[1/5] starting Spark ({options.master or 'default master'})")
    spark = spark_session(options)
    if options.quiet:
        spark.sparkContext.setLogLevel("ERROR")
    say(f"[2/5] reading {options.ledger}")
    events, malformed = load_events(spark, options)
    # Not cached: each table reads only its columns again, which costs less
    # than holding every name of every event in memory.
    now_ms = options.now_ms or events.agg({"ts": "max"}).first()[0] or 0
    say("[3/5] computing tables")
    copy_rows = T.copies(events).cache()
    # Each table is written, then read again for the HTML report: cached, it
    # is computed once (they are aggregates, small beside the events).
    tables = {name: frame.cache() for name, frame in {
        "volume": T.volume_per_topic_hour(events),
        "fanout_width": T.fanout_width(events),
        "latency": T.latency_per_topic(copy_rows, events),
        "subscribers": T.subscriber_backlog(copy_rows, events, now_ms,
                                            int(options.stale_after_s * 1000)),
        "reconciliation": reconcile(events),
        "untracked": T.untracked(copy_rows, events, queue_snapshot(spark, options.ledger)),
        "failures": T.failures(events),
        "policy": T.policy_drops(events),
        **audit_findings(spark, options.findings),
    }.items()}
    try:
        summary = _write_tables(options, say, events, malformed, tables)
    finally:  # a second run in this session must not find these cached
        for frame in (copy_rows, *tables.values()):
            frame.unpersist()
    summary["seconds"] = round(time.monotonic() - started, 1)
    return summary


def _write_tables(options: Options, say, events, malformed: int, tables: dict) -> dict:
    """Parquet tables, then the HTML report; returns the summary."""
    say(f"[4/5] writing tables to {options.out}/tables")
    for name, frame in tables.items():
        frame.write.mode("overwrite").parquet(os.path.join(options.out, "tables", name))
    untracked = tables["untracked"].collect()
    summary = {"events": events.count(), "malformed": malformed,
               "reconciliation": {row["kind"]: row["count"] for row in
                                  tables["reconciliation"].groupBy("kind").count().collect()},
               # Copies of plain Gearman subscribers neither still queued nor
               # recorded delivered: taken, or lost; the ledger cannot tell.
               "unaccounted": {row["subscriber"]: row["unaccounted"] for row in untracked
                               if row["unaccounted"]},
               # Copies the subscriptions' limits did not keep, by reason:
               # not delivered by policy, which is not lost.
               "policy": _by_reason(tables["policy"].collect())}
    if "audit_findings" in tables:
        summary["audit_findings"] = {row["kind"]: row["count"] for row in
                                     tables["audit_findings"].groupBy("kind").count().collect()}
    say("[5/5] writing the report")
    from gearhorn.pipeline.report import write_report

    small = {name: frame.limit(10_000).toPandas() for name, frame in tables.items()}
    # The HTML report is written by the driver: into --out when it is a local
    # folder, else into ./gearhorn-report (tables still go to the URL).
    report_dir = options.out if "://" not in options.out else os.path.abspath("gearhorn-report")
    summary["report"] = write_report(report_dir, summary, small)
    return summary


def _by_reason(rows: list) -> dict[str, int]:
    totals: dict[str, int] = {}
    for row in rows:
        totals[row["reason"]] = totals.get(row["reason"], 0) + row["copies"]
    return totals


def parse_args(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(prog="gearhorn report",
                                     description="statistics and reconciliation of a ledger")
    parser.add_argument("--ledger", required=True, help="folder written by `gearhorn ledger "
                        "export` (Parquet or JSON Lines)")
    parser.add_argument("--out", required=True, help="folder for tables/ and report.html")
    parser.add_argument("--master", help="Spark master URL (default: Spark's own)")
    parser.add_argument("--stale-after", type=float, default=300.0, metavar="SECONDS",
                        help="a subscriber with a backlog and no ack for this long is stale")
    parser.add_argument("--shuffle-partitions", type=int, default=4)
    parser.add_argument("--format", choices=("auto", "parquet", "jsonl"), default="auto",
                        help="input format (auto: by file names; needed for URLs)")
    parser.add_argument("--findings", metavar="DIR",
                        help="the live audit's findings (DATA_DIR/audit/findings), shown "
                             "beside the reconciliation")
    args = parser.parse_args(argv)
    return Options(args.ledger, args.out, args.master, args.stale_after,
                   args.shuffle_partitions, input_format=args.format, findings=args.findings)


def publish_verdict(summary: dict) -> None:
    """Leave the verdict where ``gearhorn web``'s console shows it (the
    registry's Redis, from the usual settings). Best effort: the report
    stands without it, and a report run far from Redis says so once."""

    from gearhorn import config as configuration
    from gearhorn.store import redisconn
    from gearhorn.store.keys import Keys

    verdict = {key: summary.get(key) for key in ("events", "malformed", "reconciliation",
                                                 "unaccounted", "policy", "report")}
    verdict["finished"] = time.time()
    try:
        config = configuration.load()
        client = redisconn.for_config(config, socket_timeout=5, socket_connect_timeout=2)
        client.set(Keys(config.key_prefix).last_report, json.dumps(verdict))
    except (*REDIS_ERRORS, configuration.ConfigError) as exc:
        print(f"gearhorn report: verdict not sent to the console: {exc}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    try:
        summary = run(parse_args(argv))
    except PipelineError as exc:
        print(f"gearhorn report: {exc}", file=sys.stderr)
        return 1
    publish_verdict(summary)
    problems = sum(summary["reconciliation"].values())
    kinds = summary["reconciliation"]
    unaccounted = summary["unaccounted"]
    untracked = (f"; {sum(unaccounted.values()):,} copies of {len(unaccounted)} untracked "
                 f"Gearman subscribers unaccounted (taken or lost: the ledger cannot tell)"
                 if unaccounted else "")
    policy = summary.get("policy") or {}
    by_policy = (f"; {sum(policy.values()):,} copies not delivered by policy {policy}"
                 if policy else "")
    live = summary.get("audit_findings")
    by_audit = f"; live audit findings {live}" if live else ""
    print(f"{summary['events']:,} events ({summary['malformed']:,} malformed rows skipped); "
          f"reconciliation: {problems:,} problems{f' {kinds}' if kinds else ''}{untracked}"
          f"{by_policy}{by_audit}; "
          f"report: {summary['report']} ({summary['seconds']}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
