"""The ledger's contract: event names, the row fields and their types, and
the 64-bit keys. Pure; the writer (ledger.py), the Parquet export and the
Spark schema (pipeline/transforms.py) all derive from this one list.
"""

from __future__ import annotations

import enum

import xxhash


class Event(enum.StrEnum):
    """What a ledger row records."""

    PUBLISHED = "published"  # a fanout: its message id, topic, subscriber count
    ENQUEUED = "enqueued"  # one copy in a subscriber's queue
    ATTACHED = "attached"  # a bridge started consuming a queue for a subscriber
    DELIVERED = "delivered"  # the bridge gave a copy to a STOMP client
    ACKED = "acked"  # the STOMP client acknowledged it
    # A held copy's receiver answered its job (copies = held; reason: complete,
    # failed or exception; count: the generation it was handed in): any
    # Gearman consumer's delivery, seen by gearhorn. Two complete answers in
    # two generations, or under two of gearmand's job handles (``handle``),
    # are a duplicate: the receiver ran it twice (pipeline/transforms.answer_run).
    ANSWERED = "answered"
    FAILED = "failed"  # a fanout or a copy failed (reason)
    # A copy not kept by the subscription's limits (reason: maxlen, maxbytes,
    # expired, removed; full: never made, with its message id): "not
    # delivered by policy", apart from lost (gearhorn/rules/limits.py).
    DROPPED = "dropped"
    # A run of a topic's history offsets given to a stream subscription
    # (gearhorn/stomp/topics/streamruns.py): subscriber is ``<topic>_<client_id>`` and
    # unique is the run, ``stream_span``'s text.
    STREAMED = "streamed"
    # The live audit's clock (gearhorn/pipeline/audit.py): written by its
    # export after each round, never by a writer, so event time advances
    # while the ledger is quiet.
    TICK = "tick"


# What settles a copy, for the report, the Spark audit and the count-first
# audit's closer look alike: delivered (the bridge gave it to a client),
# answered (any Gearman consumer of a held copy), or dropped by its
# subscription's limits (not delivered by policy, which is not lost).
SETTLING = (Event.DELIVERED, Event.ANSWERED, Event.DROPPED)

# (name, type) of every row field, in order; types are "string", "int64", "bool".
FIELDS: tuple[tuple[str, str], ...] = (
    ("event", "string"), ("ts", "int64"), ("message_id", "string"), ("topic", "string"),
    ("subscriber", "string"), ("unique", "string"), ("count", "int64"),
    ("reason", "string"), ("redelivered", "bool"), ("source", "string"),
    ("stream_id", "string"), ("copy_key", "int64"), ("message_key", "int64"),
    ("handle", "string"),  # an answer's job handle at gearmand (older rows: none)
)
ROW_FIELDS = tuple(name for name, _ in FIELDS)

# A streamed row's run: ``EPOCH:FIRST-LAST``, and ``:unrecovered`` after it
# when the client was told that offsets before FIRST are lost (x-recovered).
STREAM_SPAN = r"^(.+):([0-9]+)-([0-9]+)(:unrecovered)?$"


def stream_span(epoch: str, first: int, last: int, told_gap: bool = False) -> str:
    """The text of a run of offsets (``STREAM_SPAN``)."""
    return f"{epoch}:{first}-{last}{':unrecovered' if told_gap else ''}"


_SPARK_HASH_SEED = 42  # the seed of Spark's xxhash64()


def _xxhash64(text: str, seed: int) -> int:
    """XXH64 of the UTF-8 text as Spark computes it (an unsigned seed in, a
    signed result out)."""
    value = xxhash.xxh64_intdigest(text.encode(), seed=seed & 0xFFFF_FFFF_FFFF_FFFF)
    return value - (1 << 64) if value >= 1 << 63 else value


def copy_key(subscriber: str | None, unique: str | None) -> int | None:
    """Spark's ``xxhash64(subscriber, unique)``; None unless both are set."""
    if not subscriber or not unique:
        return None
    return _xxhash64(unique, _xxhash64(subscriber, _SPARK_HASH_SEED))


def message_key(message_id: str | None) -> int | None:
    """Spark's ``xxhash64(message_id)``; None without a message id."""
    return _xxhash64(message_id, _SPARK_HASH_SEED) if message_id else None
