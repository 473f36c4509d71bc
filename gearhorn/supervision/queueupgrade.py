"""Upgrading a data directory whose copies wait in gearmand's redis queue.

Why it is shaped so: docs/design/notes.rst, "gearhorn/supervision/queueupgrade.py".
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Collection, Iterator

import redis

from gearhorn import gearman
from gearhorn.store.heldcopies import HeldCopies, HeldCopy
from gearhorn.store.keys import Keys

log = logging.getLogger(__name__)

UPGRADE_HOLDER = "upgraded-from-gearmand-queue"
# gearmand's default --redis-prefix, which the older gearhorn started it with.
GEARMAND_PREFIX = b"_gear_"
_PRECEDENCE = {0: "high", 1: "normal", 2: "low"}  # gearmand's priority numbers


def dashed_functions(registry: redis.Redis, keys: Keys) -> set[bytes]:
    """The function names with a ``-`` the older version recorded."""
    return set(registry.smembers(keys.dashed_functions))


def move_to_held(queue: redis.Redis, store: HeldCopies, keys: Keys,
                 dashed: Collection[bytes], synced: Callable[[], None]) -> int:
    """Every job in gearmand's redis queue ``queue`` (and any a start cut
    short had set aside) as a held copy; returns how many. ``synced()``
    returns once an fsync covers the records."""
    moved = 0
    # A holder that never registers: the pool's holders take its copies over.
    holder = f"{UPGRADE_HOLDER}:{uuid.uuid4().hex[:12]}"
    for pattern, head in ((GEARMAND_PREFIX + b"-*", b""), (keys.held_job(b"*"),
                                                            keys.held_job(b""))):
        for batch in scan_keys(queue, pattern):
            pipe = queue.pipeline(transaction=False)
            for key in batch:
                pipe.hgetall(key)
            found = []
            for key, fields in zip(batch, pipe.execute(raise_on_error=False), strict=True):
                copy, precedence = queued_copy(key[len(head):], fields, dashed, GEARMAND_PREFIX)
                if copy is not None:
                    found.append((key, HeldCopy(copy.function, copy.unique, copy.data,
                                                holder, precedence)))
            if not found:
                continue
            store.keep([held for _, held in found])
            synced()
            queue.delete(*[key for key, _ in found])
            moved += len(found)
    if moved:
        log.warning("moved %d jobs from gearmand's redis queue (an older gearhorn's) into "
                    "held copies: the pool hands them out now", moved)
    return moved


def split_key(key: bytes, dashed: Collection[bytes],
              prefix: bytes = GEARMAND_PREFIX) -> tuple[bytes, bytes] | None:
    """The (function, unique) a queue key stands for; None for a key that is
    not gearmand's. The function is the longest recorded name with a ``-``
    that the key's body starts with, else the body up to its first ``-``
    (as gearmand reads it).

    >>> split_key(b"_gear_-price-feed_alice-m1:al-ice", {b"price-feed_alice"})
    (b'price-feed_alice', b'm1:al-ice')
    >>> split_key(b"_gear_-news_alice-m1", set())
    (b'news_alice', b'm1')
    """
    head = prefix + b"-"
    if not key.startswith(head):
        return None
    body = key[len(head):]
    cut = -1
    for at, char in enumerate(body):
        if char == 0x2D and body[:at] in dashed:  # "-"
            cut = at
    if cut < 0:
        cut = body.find(b"-")
        if cut < 0:
            return None
    return body[:cut], body[cut + 1:]


def queued_copy(key: bytes, fields: dict[bytes, bytes], dashed: Collection[bytes],
                prefix: bytes = GEARMAND_PREFIX) -> tuple[gearman.Copy | None, str]:
    """The job at queue key ``key`` (its hash ``fields``) and its precedence;
    None (logged) for what is not a job."""
    job = split_key(key, dashed, prefix)
    if not isinstance(fields, dict):  # not a hash: gearmand <= 1.1.15 kept strings
        fields = {}
    try:
        function, unique = job  # type: ignore[misc]
        priority = int(fields.get(b"priority", b"1"))
        copy = gearman.Copy(function.decode(), unique.decode(), fields[b"data"])
    except (TypeError, KeyError, ValueError):  # no job, no data, not text
        log.error("queue key %r is not a job gearhorn can move; left in place", key)
        return None, "normal"
    return copy, _PRECEDENCE.get(priority, "normal")


def scan_keys(client: redis.Redis, pattern: bytes) -> Iterator[list[bytes]]:
    cursor = 0
    while True:
        cursor, found = client.scan(cursor, match=pattern, count=1000)
        if found:
            yield list(found)
        if cursor == 0:
            return
