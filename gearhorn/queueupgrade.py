"""Upgrading a data directory whose copies wait in gearmand's redis queue.

Before held copies, ``gearhorn up`` ran gearmand on its redis queue plugin
(a second Redis, in ``<data_dir>/gearmand-queue``), and the copies queued
there are acknowledged: an upgrade must deliver them. With ``copies =
held`` up runs gearmand without that Redis, so at its first start it moves
each job still queued there into a held copy's record in the registry's
Redis, under a holder that is never alive (:data:`UPGRADE_HOLDER`): the
pool takes them over within a second and hands them out like any others.

Safe to repeat: a record written before a crash is left as it is (a copy
already held is never written again), and a job's key in the queue Redis
goes only after an fsync covers its record.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

import redis

from gearhorn.store.heldcopies import HeldCopies, HeldCopy
from gearhorn.store.keys import Keys
from gearhorn.worker.replay import GEARMAND_PREFIX, queued_copy, scan_keys

log = logging.getLogger(__name__)

UPGRADE_HOLDER = "upgraded-from-gearmand-queue"


def move_to_held(queue: redis.Redis, store: HeldCopies, keys: Keys,
                 dashed: Collection[bytes], synced: Callable[[], None]) -> int:
    """Every job in gearmand's redis queue ``queue`` (and any a start cut
    short had set aside, gearhorn/worker/replay.py) as a held copy; returns
    how many. ``synced()`` returns once an fsync covers the records."""
    moved = 0
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
                                                UPGRADE_HOLDER, precedence)))
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

