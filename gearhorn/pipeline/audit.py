"""``gearhorn audit``: is anything lost right now? The live delivery audit.

Three parts in one process:

- an export that follows the ledger: every ``audit_interval`` seconds the
  new events go into ``DIR/inbox`` as Parquet files (checkpointed:
  gearhorn/store/ledgerexport.py), then a ``tick`` file, so event time
  moves on while the ledger is quiet;
- a Spark Structured Streaming query over that folder
  (gearhorn/pipeline/live.py), whose state is Spark's, bounded by event-time
  watermarks, and checkpointed in ``DIR/checkpoint``; Spark deletes the
  files it has read;
- the judge of each micro-batch (gearhorn/pipeline/verdicts.py), whose state
  is saved in ``DIR/state.json`` with the micro-batch's id, so a micro-batch
  Spark runs again after a restart is judged once.

Findings go to ``DIR/findings/`` (Parquet, a file per micro-batch that found
any; ``gearhorn report --findings DIR/findings`` reads them), to the terminal
(a line each, and every minute a line that says nothing was lost, or what
was), and to the registry's Redis, where ``gearhorn web`` serves them as
metrics.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass

import redis

from gearhorn.pipeline import verdicts
from gearhorn.pipeline.verdicts import FINDING_FIELDS, AuditState, Finding, Presence, Unsettled
from gearhorn.store import ledgerexport
from gearhorn.store.keys import Keys
from gearhorn.store.ledger import now_ms
from gearhorn.store.redisconn import REDIS_ERRORS

log = logging.getLogger(__name__)

# Topics whose finding counts go to Redis (the metrics' labels).
TOP_TOPICS = 100
# The JVM's log: errors only (its start-up warnings buried the findings).
QUIET_LOG4J = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                           "log4j2-audit.properties")


@dataclass(frozen=True)
class AuditSettings:
    folder: str
    deadline_ms: int
    lateness_ms: int
    interval_s: float
    master: str | None = None
    window_ms: int = 5 * 60_000  # the console's "nothing lost in the last N minutes"
    from_start: bool = False  # a first start audits the whole ledger kept, not from now
    shards: int = 8

    @property
    def inbox(self) -> str:
        return os.path.join(self.folder, "inbox")

    @property
    def checkpoint(self) -> str:
        return os.path.join(self.folder, "checkpoint")

    @property
    def findings(self) -> str:
        return os.path.join(self.folder, "findings")

    @property
    def state(self) -> str:
        return os.path.join(self.folder, "state.json")


# -- the export that follows the ledger -------------------------------------------


def follow_ledger(client: redis.Redis, keys: Keys, settings: AuditSettings,
                  stop: threading.Event) -> None:
    """Export new events into the inbox until ``stop``, a tick after each
    round; a Redis away at the first start is waited for."""
    while not settings.from_start and not stop.is_set():
        try:
            if ledgerexport.start_at_heads(client, keys, settings.inbox, settings.shards):
                log.info("audit: first start, judging what happens from now on")
            break
        except REDIS_ERRORS as exc:
            log.warning("audit: redis unavailable at start (%s); trying again", exc)
            stop.wait(settings.interval_s)

    def ticked(result: ledgerexport.ExportResult) -> None:
        if result["read_at"] is not None:
            ledgerexport.write_tick(settings.inbox, result["read_at"])

    ledgerexport.follow(client, keys, settings.inbox, settings.interval_s, stop,
                        shards=settings.shards, on_export=ticked)


# -- the streaming query --------------------------------------------------------------


def spark_session(settings: AuditSettings):
    from pyspark.sql import SparkSession

    from gearhorn.pipeline import job

    builder = (SparkSession.builder.appName("gearhorn-audit")
               .config("spark.sql.shuffle.partitions", "4")  # fixed by the checkpoint
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")  # its lines are the findings
               # State on disk, not on the heap: it grows with copies/s x deadline.
               .config("spark.sql.streaming.stateStore.providerClass",
                       "org.apache.spark.sql.execution.streaming.state."
                       "RocksDBStateStoreProvider"))
    if settings.master:
        builder = builder.master(settings.master)
    if job._starts_its_own_jvm():
        # A bigger stack: stopping a query mid-batch overflowed the default
        # one in a regular expression of Spark's.
        builder = builder.config("spark.driver.extraJavaOptions",
                                 f"{job.LOCAL_JAVA_OPTIONS} -Xss8m "
                                 f"-Dlog4j2.configurationFile={QUIET_LOG4J}")
    return builder.getOrCreate()


def start_query(spark, settings: AuditSettings, judge):
    """The streaming query over the inbox, each micro-batch to ``judge``."""
    from gearhorn.pipeline import live
    from gearhorn.pipeline import transforms as T

    os.makedirs(settings.inbox, exist_ok=True)
    events = (spark.readStream.schema(T.EVENT_SCHEMA)
              .option("pathGlobFilter", "*.parquet")  # never a .tmp being written
              .option("recursiveFileLookup", "true")
              .option("cleanSource", "delete")  # read once: the inbox stays small
              .parquet(settings.inbox)
              .filter(T.well_formed()))
    rows = live.audit_rows(live.with_event_time(events, settings.lateness_ms),
                           settings.deadline_ms, settings.lateness_ms)
    return (rows.writeStream.queryName("gearhorn-audit").foreachBatch(judge)
            .option("checkpointLocation", settings.checkpoint)
            .trigger(processingTime=f"{settings.interval_s:g} seconds")
            .start())


# -- judging each micro-batch -----------------------------------------------------------


class Judge:
    """``foreachBatch``'s function: a micro-batch's outcomes to findings."""

    def __init__(self, settings: AuditSettings, state: AuditState, tell) -> None:
        self.settings = settings
        self.state = state
        self.tell = tell  # called with the state and the new findings, after the save
        self.lock = threading.Lock()  # the main thread reads the state too

    def __call__(self, frame, batch_id: int) -> None:
        if batch_id <= self.state.batch:
            # Judged before a restart: Spark runs the last one again, and its
            # stateful operators must still run over all of it (Spark checks
            # that every state store committed the batch).
            frame.write.format("noop").mode("overwrite").save()
            return
        presence, others = _read(frame)
        found_at = now_ms()
        with self.lock:
            findings = self._judge(presence, others)
            self.state.count(findings, found_at)
            self.state.forget_settled()
            self.state.batch = batch_id
            write_findings(self.settings.findings, batch_id, findings, found_at)
            verdicts.save(self.settings.state, self.state)
        self.tell(self.state, findings)

    def _judge(self, presence: list[Presence], others: list) -> list[Finding]:
        state = self.state
        state.settle(presence)
        clock = max((row.enqueued_ts for row in others if row.outcome == "tick"), default=0)
        if clock:
            state.clock_ms = max(state.clock_ms, clock)
            state.lags_ms.append(max(0, now_ms() - clock))
        findings: list[Finding] = []
        runs: dict[str, list[str]] = {}
        for row in others:
            if row.outcome == "unsettled":
                finding = state.judge(Unsettled(row.subscriber, row.topic, row.message_id,
                                                row.unique, row.enqueued_ts))
            elif row.outcome == "duplicate":
                topic = (row.subscriber or "").rpartition("_")[0] or None
                finding = state.duplicate(str(row.copy_key), Finding(
                    verdicts.DUPLICATE, topic, row.subscriber, None, row.unique,
                    row.settled_ts, "delivered more than once as new (or, held, completed "
                    "in two hand-outs)"))
            else:
                if row.outcome == "streamed":
                    runs.setdefault(row.subscriber, []).append(row.unique)
                continue
            if finding is not None:
                findings.append(finding)
        for subscriber, spans in runs.items():
            findings += state.streamed(subscriber, spans)
        return findings


def _read(frame) -> tuple[list[Presence], list]:
    """Who settled what (aggregated in Spark), and every other row."""
    from pyspark.sql import functions as F

    from gearhorn.pipeline.live import SETTLED

    frame.persist()
    try:
        settled = (frame.filter(F.col("outcome") == SETTLED).groupBy("subscriber")
                   .agg(F.max("enqueued_ts"), F.max("settled_ts"), F.countDistinct("copy_key"))
                   .collect())
        others = frame.filter(F.col("outcome") != SETTLED).collect()
    finally:
        frame.unpersist()
    return [Presence(*row) for row in settled], others


def _state_rows(progress: dict | None) -> int:
    """Rows Spark keeps in the query's state (its joins), after the last micro-batch."""
    return sum(op.get("numRowsTotal", 0) for op in (progress or {}).get("stateOperators", []))


def write_findings(folder: str, batch_id: int, findings: list[Finding], found_ms: int) -> None:
    """``batch-<id>.parquet`` (replaced if the micro-batch runs again)."""
    if not findings:
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(folder, exist_ok=True)
    types = {"string": pa.string(), "int64": pa.int64()}
    schema = pa.schema([(name, types[kind]) for name, kind in FINDING_FIELDS])
    rows = [{**f.__dict__, "found_ts": found_ms, "batch": batch_id} for f in findings]
    path = os.path.join(folder, f"batch-{batch_id:09d}.parquet")
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path + ".tmp")
    os.replace(path + ".tmp", path)


# -- where the verdict goes ---------------------------------------------------------------


def verdict(state: AuditState, settings: AuditSettings, now: int) -> dict:
    """The JSON the registry's Redis keeps for ``gearhorn web`` (metrics, console)."""
    topics = sorted(state.totals.items(), key=lambda kv: -sum(kv[1].values()))[:TOP_TOPICS]
    return {"updated_ms": now, "clock_ms": state.clock_ms, "batch": state.batch,
            "deadline_s": settings.deadline_ms / 1000, "lag": state.lag_quantiles(),
            "totals": state.kind_totals(), "topics": dict(topics),
            "settled": state.settled, "away": state.away, "state_rows": state.state_rows,
            "recent": list(state.recent)[-10:],
            "line": state.summary_line(now, settings.window_ms)}


class Publisher:
    """Tells the terminal and Redis; Redis away is said once, not fatal."""

    def __init__(self, client: redis.Redis, keys: Keys, settings: AuditSettings,
                 say=print) -> None:
        self.client, self.keys, self.settings, self.say = client, keys, settings, say
        self.said_at = 0.0
        self.redis_failed = False

    def __call__(self, state: AuditState, findings: list[Finding]) -> None:
        for finding in findings:
            self.say(f"audit: {finding.line()}")
        now = now_ms()
        if findings or time.monotonic() - self.said_at >= 60:
            self.said_at = time.monotonic()
            self.say(state.summary_line(now, self.settings.window_ms))
        try:
            self.client.set(self.keys.audit, json.dumps(verdict(state, self.settings, now)))
            self.redis_failed = False
        except REDIS_ERRORS as exc:
            if not self.redis_failed:
                log.warning("audit: verdict not sent to Redis (%s); the findings are on "
                            "disk and in this log", exc)
            self.redis_failed = True


# -- the command ---------------------------------------------------------------------------


def run(client: redis.Redis, keys: Keys, settings: AuditSettings, say=print) -> int:
    """Until SIGTERM or Ctrl-C."""
    from gearhorn.pipeline import job

    job.check_java()
    logging.getLogger("py4j").setLevel(logging.WARNING)  # a line per call at INFO
    os.makedirs(settings.folder, exist_ok=True)
    state = verdicts.load(settings.state, settings.deadline_ms, now_ms())
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    exporter = threading.Thread(target=follow_ledger, args=(client, keys, settings, stop),
                                name="audit-export", daemon=True)
    exporter.start()
    spark = spark_session(settings)
    spark.sparkContext.setLogLevel("ERROR")
    query = start_query(spark, settings, Judge(settings, state,
                                               Publisher(client, keys, settings, say)))
    say(f"audit: following the ledger every {settings.interval_s:g} s; a copy not "
        f"delivered within {settings.deadline_ms / 1000:g} s is a finding; state in "
        f"{settings.folder}")
    try:
        while not stop.wait(1.0):
            if not query.isActive:
                raise job.PipelineError(f"the audit's query stopped: {query.exception()}")
            state.state_rows = _state_rows(query.lastProgress)
    finally:
        stop.set()
        _stop(query)
        exporter.join(timeout=30)
    return 0


def _stop(query) -> None:
    """Stop the query, unless its JVM stopped first: Ctrl-C reaches the
    whole process group, and the JVM's own shutdown then ends Spark before
    this process gets to (nothing is left to stop; no traceback for it)."""
    from py4j.protocol import Py4JError

    try:
        query.stop()
    except (Py4JError, ConnectionError) as exc:
        log.info("audit: Spark had stopped already (%s)", str(exc).splitlines()[0])
