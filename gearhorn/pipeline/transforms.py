"""Pure DataFrame transforms of ledger events: DataFrames in, DataFrames out.

Why it is shaped so: docs/design/notes.rst, "gearhorn/pipeline/transforms.py".
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from gearhorn.rules.events import FIELDS, SETTLING, STREAM_SPAN
from gearhorn.rules.events import Event as E

EVENT_TYPES = tuple(e.value for e in E)

_SPARK_TYPES = {"string": StringType, "int64": LongType, "bool": BooleanType}
EVENT_SCHEMA = StructType([StructField(name, _SPARK_TYPES[kind]()) for name, kind in FIELDS])

RECONCILIATION_COLUMNS = ("kind", "message_id", "topic", "subscriber", "unique", "detail")


def well_formed() -> Column:
    """Rows the pipeline can use: a known event with a time."""
    return F.col("event").isin(*EVENT_TYPES) & F.col("ts").isNotNull()


def with_keys(events: DataFrame) -> DataFrame:
    """Fill ``copy_key`` and ``message_key`` where the export did not (JSON
    Lines written by hand, exports older than the keys). Same function as
    the export's, so rows with and without keys group together."""
    subscriber, unique, message_id = F.col("subscriber"), F.col("unique"), F.col("message_id")
    computed_copy = F.when(subscriber.isNotNull() & unique.isNotNull(),
                           F.xxhash64(subscriber, unique))
    computed_message = F.when(message_id.isNotNull(), F.xxhash64(message_id))
    return (events.withColumn("copy_key", F.coalesce(F.col("copy_key"), computed_copy))
            .withColumn("message_key", F.coalesce(F.col("message_key"), computed_message)))


def settles_copy() -> Column:
    """Rows that settle the copy they name (``SETTLING``, rules/events.py);
    a copy no such row follows is never_delivered."""
    return F.col("event").isin(*SETTLING)


def first_delivery() -> Column:
    """A delivery not flagged ``redelivered``: two of one copy are a
    ``duplicate`` (the client may have processed it twice). A held copy's
    answer is never a first one: the bridge records its own deliveries of
    the same copy, and a copy handed again after a crash may be answered
    twice (at least once, as a redelivery is)."""
    return (F.col("event") == E.DELIVERED) & ~F.coalesce(F.col("redelivered"), F.lit(False))


def complete_answer() -> Column:
    """A held copy's receiver completed it, in the generation ``count``
    names: two in two runs (:func:`answer_run`) are a ``duplicate`` (it was
    handed again, its holder taken for dead, and the receiver ran it twice).
    Two of one run are one job that two holders heard end."""
    return ((F.col("event") == E.ANSWERED) & (F.col("reason") == "complete")
            & F.col("count").isNotNull())


def answer_run() -> Column:
    """Which run of a held copy an answer ended: its generation and
    gearmand's job handle (``generation/handle``; rows written before the
    handle was: the generation alone). The same generation under two
    handles is a job made again after it was answered (a taker's attach in
    the instant after: docs/design/held-copies.rst, "The bounds")."""
    return F.concat_ws("/", F.col("count").cast("string"), F.col("handle"))


def _of(events: DataFrame, event: str) -> DataFrame:
    return events.filter(F.col("event") == event)


def volume_per_topic_hour(events: DataFrame) -> DataFrame:
    """topic, hour, messages published, copies enqueued."""
    return (_of(events, E.PUBLISHED)
            .withColumn("hour", F.date_trunc("hour", F.timestamp_millis("ts")))
            .groupBy("topic", "hour")
            .agg(F.count("*").alias("messages"), F.sum("count").alias("copies"))
            .orderBy("hour", "topic"))


def fanout_width(events: DataFrame) -> DataFrame:
    """width (subscribers of a message), messages with that width."""
    return (_of(events, E.PUBLISHED)
            .groupBy(F.col("count").alias("width"))
            .agg(F.count("*").alias("messages"))
            .orderBy("width"))


def copies(events: DataFrame) -> DataFrame:
    """One row per copy: when enqueued, first delivered and acked, how often.

    Keyed events (:func:`with_keys`) in. Columns: subscriber, copy_key,
    topic_key (``xxhash64(topic)``; :func:`latency_per_topic` names it),
    enqueued_ts, enqueues, delivered_ts, deliveries, redeliveries, acked_ts,
    acks. One aggregation whose values are all numbers, so Spark keeps it in
    its hash map rather than sorting 30M rows (docs/benchmarks.rst).
    """
    event = F.col("event")

    def when(kind: str, value: Column) -> Column:
        return F.when(event == kind, value)

    one = F.lit(1)
    # A held copy's answer (a plain Gearman consumer's) stands for its
    # delivery, and a complete one for its ack, where the bridge recorded none.
    completed = (event == E.ANSWERED) & (F.col("reason") == "complete")
    return (events.filter(event.isin(E.ENQUEUED, E.DELIVERED, E.ACKED, E.ANSWERED)
                          & F.col("copy_key").isNotNull())
            .groupBy("subscriber", "copy_key")
            .agg(F.min(when(E.ENQUEUED, F.col("ts"))).alias("enqueued_ts"),
                 F.count(when(E.ENQUEUED, one)).alias("enqueues"),
                 F.max(when(E.ENQUEUED, F.xxhash64("topic"))).alias("topic_key"),
                 F.coalesce(F.min(when(E.DELIVERED, F.col("ts"))),
                            F.min(when(E.ANSWERED, F.col("ts")))).alias("delivered_ts"),
                 _either(F.count(when(E.DELIVERED, one)), F.count(when(E.ANSWERED, one)))
                 .alias("deliveries"),
                 F.count(F.when((event == E.DELIVERED) & F.col("redelivered"), one))
                 .alias("redeliveries"),
                 F.coalesce(F.min(when(E.ACKED, F.col("ts"))),
                            F.min(F.when(completed, F.col("ts")))).alias("acked_ts"),
                 _either(F.count(when(E.ACKED, one)), F.count(F.when(completed, one)))
                 .alias("acks"))
            .filter(F.col("enqueues") > 0))  # queue messages are not fanout copies


def _either(recorded: Column, answered: Column) -> Column:
    """The bridge's count where it recorded any, else the answers'."""
    return F.when(recorded > 0, recorded).otherwise(answered)


def latency_per_topic(copy_rows: DataFrame, events: DataFrame) -> DataFrame:
    """topic, delivery and ack latency (ms from enqueue) at p50/p95/p99."""
    delivery = F.col("delivered_ts") - F.col("enqueued_ts")
    ack = F.col("acked_ts") - F.col("enqueued_ts")
    quantiles = [0.5, 0.95, 0.99]
    aggregated = copy_rows.groupBy("topic_key").agg(
        F.percentile_approx(delivery, quantiles, 10_000).alias("d"),
        F.percentile_approx(ack, quantiles, 10_000).alias("a"),
        F.count("delivered_ts").alias(E.DELIVERED), F.count("acked_ts").alias(E.ACKED))
    names = (_of(events, E.PUBLISHED).filter(F.col("topic").isNotNull())
             .select(F.xxhash64("topic").alias("topic_key"), "topic").distinct())
    return aggregated.join(names, "topic_key").select(
        "topic", E.DELIVERED, E.ACKED,
        *[F.col("d")[i].alias(f"delivery_p{int(q * 100)}_ms") for i, q in enumerate(quantiles)],
        *[F.col("a")[i].alias(f"ack_p{int(q * 100)}_ms") for i, q in enumerate(quantiles)],
    ).orderBy("topic")


def tracked_subscribers(events: DataFrame) -> DataFrame:
    """Subscribers whose deliveries the ledger sees (a bridge attached them,
    or delivered to them, or their held copies were answered). Plain Gearman
    consumers of copies in gearmand's queue report nothing, so the pipeline
    cannot say whether their copies arrived."""
    return (events.filter(F.col("event").isin(E.ATTACHED, E.DELIVERED, E.ANSWERED))
            .select("subscriber").distinct())


UNTRACKED_COLUMNS = ("subscriber", "enqueued", "dropped", "queued", "unaccounted")


def untracked(copy_rows: DataFrame, events: DataFrame,
              queued: DataFrame | None) -> DataFrame:
    """Subscribers whose deliveries the ledger cannot see (plain Gearman
    consumers), checked against what gearmand still held when the ledger
    was exported: subscriber, copies enqueued, still ``queued`` (``queued``:
    subscriber, queued; None without a snapshot, and then every copy is
    unaccounted), ``unaccounted`` (taken by a consumer that records
    nothing, or lost: the ledger cannot tell which). The snapshot is taken
    before the ledger is read, so a copy that came in between counts as
    unaccounted (a false alarm, never a hidden loss); ``unaccounted`` never
    goes below 0.
    """
    seen = tracked_subscribers(events)
    dropped = (_of(events, E.DROPPED).filter(F.col("message_key").isNull())
               .groupBy("subscriber").agg(F.count("*").alias(E.DROPPED)))
    per = (copy_rows.filter(F.col("enqueues") > 0)
           .join(seen, "subscriber", "left_anti")
           .groupBy("subscriber").agg(F.count("*").alias(E.ENQUEUED))
           .join(dropped, "subscriber", "left").fillna(0, [E.DROPPED]))
    if queued is None:
        held = per.withColumn("queued", F.lit(None).cast(LongType()))
    else:
        held = per.join(queued, "subscriber", "left").fillna(0, ["queued"])  # gone: none
    left = F.col(E.ENQUEUED) - F.col(E.DROPPED) - F.coalesce(F.col("queued"), F.lit(0))
    return (held.withColumn("unaccounted", F.greatest(left, F.lit(0)))
            .select(*UNTRACKED_COLUMNS).orderBy(F.desc("unaccounted"), "subscriber"))


def subscriber_backlog(copy_rows: DataFrame, events: DataFrame, now_ms: int,
                       stale_after_ms: int) -> DataFrame:
    """subscriber, copies enqueued/delivered/acked, backlog, last ack, tracked, stale.

    Stale: tracked, with a backlog, and no ack for ``stale_after_ms``.
    """
    tracked = tracked_subscribers(events).withColumn("tracked", F.lit(True))
    per = copy_rows.groupBy("subscriber").agg(
        F.count("*").alias(E.ENQUEUED), F.count("delivered_ts").alias(E.DELIVERED),
        F.count("acked_ts").alias(E.ACKED), F.max("acked_ts").alias("last_ack_ts"))
    return (per.join(tracked, "subscriber", "left")
            .fillna(False, ["tracked"])
            .withColumn("backlog", F.col(E.ENQUEUED) - F.col(E.ACKED))
            .withColumn("stale", F.col("tracked") & (F.col("backlog") > 0) & (
                F.col("last_ack_ts").isNull() | (F.lit(now_ms) - F.col("last_ack_ts")
                                                 > stale_after_ms)))
            .orderBy(F.desc("backlog"), "subscriber"))


# Per copy, one sum holds four counts (20 bits each would be a million
# deliveries of one copy): 2**60 per policy drop (at most 7), 2**40 per
# enqueue, 2**20 per delivery, and 1 per delivery not flagged
# ``redelivered``. A single long aggregate keeps the 30M-row aggregation in
# Spark's fastest hash map.
_DROP, _ENQUEUE, _DELIVERY, _FIRST = 1 << 60, 1 << 40, 1 << 20, 1
_LOW20 = (1 << 20) - 1


def copy_problems(events: DataFrame) -> DataFrame:
    """copy_key, deliveries, first_deliveries, answered_twice of every copy
    that was never delivered, delivered more than once without the
    ``redelivered`` flag, or completed in two runs (:func:`complete_answer`).

    Keyed events (:func:`with_keys`) in. Only ``enqueued`` rows and those
    that settle a copy (:func:`settles_copy`) are read; queue messages
    (delivered, never enqueued) are not fanout copies and are left out. A
    copy its queue's limits dropped was not delivered by policy: not a
    problem. First deliveries are :func:`first_delivery`'s. The live audit
    (gearhorn/pipeline/live.py) uses the same two definitions.
    """
    event = F.col("event")
    counted = (F.when(event == E.ENQUEUED, F.lit(_ENQUEUE))
               .when(event == E.DROPPED, F.lit(_DROP))
               .when(first_delivery(), F.lit(_DELIVERY + _FIRST))
               .otherwise(F.lit(_DELIVERY)))
    total = F.col("total")
    deliveries = F.shiftright(total, 20).bitwiseAND(_LOW20)
    firsts = total.bitwiseAND(_LOW20)
    enqueues = F.shiftright(total, 40).bitwiseAND(_LOW20)
    dropped = F.shiftright(total, 60)
    run = F.when(complete_answer(), answer_run())
    answered_twice = F.coalesce(F.col("answer_lo") < F.col("answer_hi"), F.lit(False))
    return (events.filter(((event == E.ENQUEUED) | settles_copy())
                          & F.col("copy_key").isNotNull())
            .groupBy("copy_key").agg(F.sum(counted).alias("total"),
                                     F.min(run).alias("answer_lo"),
                                     F.max(run).alias("answer_hi"))
            .filter((enqueues > 0) & (((deliveries == 0) & (dropped == 0)) | (firsts > 1)
                                      | answered_twice))
            .select("copy_key", deliveries.alias("deliveries"),
                    firsts.alias("first_deliveries"), answered_twice.alias("answered_twice")))


def _made_or_refused() -> Column:
    """A subscriber a message was published for: its copy was enqueued, or
    refused by ``reject-publish`` (a ``dropped`` row with the message id)."""
    event = F.col("event")
    return (event == E.ENQUEUED) | ((event == E.DROPPED) & F.col("message_key").isNotNull())


def policy_drops(events: DataFrame) -> DataFrame:
    """topic, reason, copies: not delivered by policy (the subscription's
    limits), apart from lost."""
    return (_of(events, E.DROPPED).groupBy("topic", "reason")
            .agg(F.count("*").alias("copies")).orderBy(F.desc("copies"), "topic"))


def width_suspects(events: DataFrame) -> DataFrame:
    """message_key, count, enqueued (rows) of every message whose published
    subscriber count differs from the ``enqueued`` rows logged for it: one
    aggregation of numbers. A fanout that ran again (its worker died, or
    gearmand replayed it) logs its copies again, so these are only suspects:
    :func:`width_problems` counts their distinct copies."""
    event = F.col("event")
    return (events.filter(event.isin(E.PUBLISHED, E.ENQUEUED, E.DROPPED)
                          & F.col("message_key").isNotNull())
            .groupBy("message_key")
            .agg(F.max(F.when(event == E.PUBLISHED, F.col("count"))).alias("count"),
                 F.count(F.when(_made_or_refused(), F.lit(1))).alias(E.ENQUEUED))
            .filter(F.col("count").isNotNull() & (F.col("count") != F.col(E.ENQUEUED))))


def width_problems(events: DataFrame, suspects: DataFrame | None = None,
                   broadcast: bool = True) -> DataFrame:
    """message_key, count, enqueued of every message whose published
    subscriber count differs from the distinct copies enqueued for it.

    Only the ``suspects`` (:func:`width_suspects`) are counted again, by
    copy key; ``broadcast`` (they are few) sends them to every task.
    """
    suspects = width_suspects(events) if suspects is None else suspects
    keys = suspects.select("message_key", "count")
    wanted = F.broadcast(keys) if broadcast else keys
    distinct = (events.filter(_made_or_refused())
                .join(wanted.select("message_key"), "message_key")
                .groupBy("message_key").agg(F.countDistinct("copy_key").alias("copies")))
    enqueued = F.coalesce(F.col("copies"), F.lit(0))
    return (keys.join(distinct, "message_key", "left")
            .select("message_key", "count", enqueued.alias(E.ENQUEUED))
            .filter(F.col("count") != F.col(E.ENQUEUED)))


def name_problems(events: DataFrame, copies_wrong: DataFrame, widths_wrong: DataFrame,
                  broadcast: bool = True) -> DataFrame:
    """The reconciliation table (``RECONCILIATION_COLUMNS``) from the
    problem keys: one more pass over the published and enqueued rows finds
    their names. ``broadcast`` (the problems are few) sends the keys to
    every task instead of shuffling the events.
    """
    event = F.col("event")
    copies_wrong = copies_wrong.withColumnRenamed("copy_key", "wrong_copy")
    widths_wrong = widths_wrong.withColumnRenamed("message_key", "wrong_message")
    tracked = tracked_subscribers(events).withColumn("tracked", F.lit(True))
    if broadcast:
        copies_wrong, widths_wrong = F.broadcast(copies_wrong), F.broadcast(widths_wrong)
        tracked = F.broadcast(tracked)
    named = (events.filter(event.isin(E.PUBLISHED, E.ENQUEUED))
             .select("event", "copy_key", "message_key", "message_id", "topic", "subscriber",
                     "unique", F.col("count").alias("published_count"))
             .join(copies_wrong, (event == E.ENQUEUED)
                   & (F.col("copy_key") == F.col("wrong_copy")), "left")
             .join(widths_wrong, (event == E.PUBLISHED)
                   & (F.col("message_key") == F.col("wrong_message")), "left")
             .filter(F.col("wrong_copy").isNotNull() | F.col("wrong_message").isNotNull())
             .join(tracked, "subscriber", "left"))
    deliveries, firsts = F.col("deliveries"), F.col("first_deliveries")
    twice = F.coalesce(F.col("answered_twice"), F.lit(False))
    kind = (F.when(F.col("wrong_message").isNotNull(), F.lit("width_mismatch"))
            .when((firsts > 1) | twice, F.lit("duplicate"))
            .when((deliveries == 0) & F.col("tracked"), F.lit("never_delivered")))
    detail = (F.when(F.col("wrong_message").isNotNull(),
                     F.format_string("published to %d subscribers, %d copies enqueued",
                                     "published_count", E.ENQUEUED))
              .when(firsts > 1, F.format_string("delivered %d times", deliveries))
              .when(twice, F.lit("completed by its receiver twice, handed again after its "
                                 "holder was taken for dead (two generations, or two jobs)"))
              .otherwise(F.lit("enqueued, no delivery recorded")))
    width_row = F.col("wrong_message").isNotNull()
    return (named.select(kind.alias("kind"), "message_id", "topic",
                         F.when(~width_row, F.col("subscriber")).alias("subscriber"),
                         F.when(~width_row, F.col("unique")).alias("unique"),
                         detail.alias("detail"))
            .filter(F.col("kind").isNotNull())
            .dropDuplicates(["kind", "message_id", "subscriber", "unique"])
            .select(*RECONCILIATION_COLUMNS))


def stream_problems(events: DataFrame) -> DataFrame:
    """The reconciliation rows (``RECONCILIATION_COLUMNS``) of stream
    subscriptions: ``stream_gap``, offsets a subscription skipped between
    two it was given (unless its client was told, ``x-recovered:false``);
    ``stream_duplicate``, offsets it was given twice. Per subscriber and
    epoch, each run of ``streamed`` rows is compared with the furthest
    offset given before it."""
    unique = F.col("unique")
    runs = (_of(events, E.STREAMED).filter(unique.rlike(STREAM_SPAN))
            .select("subscriber", "unique",
                    F.regexp_extract(unique, STREAM_SPAN, 1).alias("epoch"),
                    F.regexp_extract(unique, STREAM_SPAN, 2).cast("long").alias("first"),
                    F.regexp_extract(unique, STREAM_SPAN, 3).cast("long").alias("last"),
                    (F.regexp_extract(unique, STREAM_SPAN, 4) != "").alias("told")))
    before = (Window.partitionBy("subscriber", "epoch").orderBy("first", "last")
              .rowsBetween(Window.unboundedPreceding, -1))
    first, furthest = F.col("first"), F.col("furthest")
    compared = runs.withColumn("furthest", F.max("last").over(before))
    gap = (first > furthest + 1) & ~F.col("told")
    kind = F.when(gap, F.lit("stream_gap")).when(first <= furthest, F.lit("stream_duplicate"))
    detail = (F.when(gap, F.format_string("offsets %d-%d never given", furthest + 1, first - 1))
              .otherwise(F.format_string("offsets %d-%d given again", first,
                                         F.least(furthest, F.col("last")))))
    subscriber = F.col("subscriber")
    topic = F.regexp_extract(subscriber, r"^(.*)_[^_]*$", 1)
    return (compared.filter(furthest.isNotNull())
            .select(kind.alias("kind"), F.lit(None).cast("string").alias("message_id"),
                    topic.alias("topic"), "subscriber", "unique", detail.alias("detail"))
            .filter(F.col("kind").isNotNull()))


def failures(events: DataFrame) -> DataFrame:
    """reason, topic, failures: what the workers refused or could not deliver."""
    return (_of(events, E.FAILED).groupBy("reason", "topic")
            .agg(F.count("*").alias("failures")).orderBy(F.desc("failures")))
