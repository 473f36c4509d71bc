"""The live audit's transforms: a stream of ledger events in, copy outcomes out.

Pure DataFrame code, like transforms.py, whose definitions of what settles
a copy and of a first delivery it uses (one definition of "lost" for the
report and the audit). On a batch DataFrame the same code gives the same
outcomes for a whole ledger (the tests use that).

State is Spark's own and bounded by event time: an enqueued copy is kept
until the watermark passes its enqueue time plus the deadline, and a
delivery until no copy it could settle can still arrive. The watermark is
the newest event time seen less ``lateness_ms``; the export's ``tick`` rows
move it while the ledger is quiet.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from gearhorn.pipeline import transforms as T
from gearhorn.rules.events import Event as E

OUTCOME_COLUMNS = ("outcome", "subscriber", "topic", "message_id", "unique", "copy_key",
                   "enqueued_ts", "settled_ts", "first")
SETTLED, UNSETTLED, DUPLICATE = "settled", "unsettled", "duplicate"


def with_event_time(events: DataFrame, lateness_ms: int) -> DataFrame:
    """``at``, the event time, and the watermark on it."""
    return (events.withColumn("at", F.timestamp_millis("ts"))
            .withWatermark("at", f"{int(lateness_ms)} milliseconds"))


def _kept(condition: Column) -> Column:
    """``condition`` as a filter that stays above the watermark: Spark moves
    a filter that does not read the event time below it, and the watermark
    would then see only the rows that pass (never the ticks)."""
    return F.when(F.col("at").isNotNull(), condition).otherwise(F.lit(False))


def _within(later: str, earlier: str, before_ms: int, after_ms: int) -> Column:
    return ((F.col(later) >= F.col(earlier) - F.expr(f"INTERVAL {int(before_ms)} MILLISECONDS"))
            & (F.col(later) <= F.col(earlier) + F.expr(f"INTERVAL {int(after_ms)} MILLISECONDS")))


def copy_outcomes(events: DataFrame, deadline_ms: int, lateness_ms: int) -> DataFrame:
    """One ``settled`` row per settlement of a copy within ``deadline_ms`` of
    its enqueue (streaming: at once), and one ``unsettled`` row per copy
    nothing settled in that time (streaming: once the watermark passes its
    enqueue time plus the deadline). A settlement up to ``lateness_ms``
    before its enqueue row (clocks of two writers) still counts."""
    enqueued = events.filter(_kept(F.col("event") == E.ENQUEUED)).select(
        F.col("copy_key").alias("e_key"), F.col("at").alias("e_at"),
        F.col("ts").alias("enqueued_ts"), "subscriber", "topic", "message_id", "unique")
    settling = events.filter(_kept(T.settles_copy() & F.col("copy_key").isNotNull())).select(
        F.col("copy_key").alias("s_key"), F.col("at").alias("s_at"),
        F.col("ts").alias("settled_ts"), T.first_delivery().alias("first"))
    joined = enqueued.join(
        settling, (F.col("e_key") == F.col("s_key"))
        & _within("s_at", "e_at", lateness_ms, deadline_ms), "leftOuter")
    outcome = F.when(F.col("settled_ts").isNull(), F.lit(UNSETTLED)).otherwise(F.lit(SETTLED))
    return joined.select(outcome.alias("outcome"), "subscriber", "topic", "message_id",
                         "unique", F.col("e_key").alias("copy_key"), "enqueued_ts",
                         "settled_ts", "first")


def duplicate_deliveries(events: DataFrame, window_ms: int) -> DataFrame:
    """One ``duplicate`` row per pair of first deliveries of one copy within
    ``window_ms`` of each other, or of complete answers of one held copy in
    two runs (transforms.answer_run); each pair once: the later row by
    ledger id, or run, names it."""
    answer = T.complete_answer()

    def firsts(suffix: str) -> DataFrame:
        return events.filter(_kept((T.first_delivery() | answer)
                                   & F.col("copy_key").isNotNull())).select(
            F.col("copy_key").alias(f"key{suffix}"), F.col("at").alias(f"at{suffix}"),
            answer.alias(f"answer{suffix}"),
            F.when(answer, T.answer_run())
            .otherwise(F.concat_ws("/", "stream_id", "source")).alias(f"id{suffix}"),
            F.col("subscriber").alias(f"subscriber{suffix}"),
            F.col("unique").alias(f"unique{suffix}"), F.col("ts").alias(f"ts{suffix}"))

    pairs = firsts("1").join(firsts("2"), (F.col("key1") == F.col("key2"))
                             & (F.col("answer1") == F.col("answer2"))
                             & (F.col("id2") > F.col("id1"))
                             & _within("at2", "at1", window_ms, window_ms))
    return pairs.select(F.lit(DUPLICATE).alias("outcome"), F.col("subscriber1").alias("subscriber"),
                        F.lit(None).cast("string").alias("topic"),
                        F.lit(None).cast("string").alias("message_id"),
                        F.col("unique1").alias("unique"), F.col("key1").alias("copy_key"),
                        F.lit(None).cast("long").alias("enqueued_ts"),
                        F.col("ts2").alias("settled_ts"), F.lit(True).alias("first"))


def passed_through(events: DataFrame) -> DataFrame:
    """The rows the driver reads as they are: stream runs (``streamed``) and
    the clock (``tick``), in the outcome columns (the run in ``unique``, the
    time in ``enqueued_ts``)."""
    none = F.lit(None)
    return events.filter(_kept(F.col("event").isin(E.STREAMED, E.TICK))).select(
        F.col("event").alias("outcome"), "subscriber", "topic", none.cast("string")
        .alias("message_id"), "unique", none.cast("long").alias("copy_key"),
        F.col("ts").alias("enqueued_ts"), none.cast("long").alias("settled_ts"),
        none.cast("boolean").alias("first"))


def audit_rows(events: DataFrame, deadline_ms: int, lateness_ms: int) -> DataFrame:
    """Everything a micro-batch of the audit reads, in ``OUTCOME_COLUMNS``.
    ``events``: keyed ledger rows with their event time
    (:func:`with_event_time`)."""
    return (copy_outcomes(events, deadline_ms, lateness_ms)
            .unionByName(duplicate_deliveries(events, deadline_ms))
            .unionByName(passed_through(events)))
