"""Making gearmand's redis queue give back exactly what it was given.

gearmand ``-q redis`` keeps each background job in a Redis hash named
``<prefix>-<function>-<unique>`` (fields ``data`` and ``priority``) and, when
it starts, replays every such key. gearmand 1.1.20 (Debian 12's) parses the
name with ``sscanf("%[^-]-%[^-]-%[^*]")`` and copies the data with
``strdup``, so, as measured in tests/integration/test_durable.py:

- a function with a ``-`` comes back as the part before its first ``-``, the
  rest glued to the unique: ``price-feed_alice`` / ``m1:al-ice`` is replayed
  as ``price`` / ``feed_alice-m1:al-ice`` (wrong queue, wrong consumer);
- a unique with a ``*`` is cut there;
- data is cut at its first NUL byte.

gearhorn mends that around gearmand's start, in two steps that are safe to
repeat (a crash between them loses nothing):

1. :func:`hold`, before gearmand starts: every job key that gearmand would
   replay wrong is renamed out of its sight (``<gearhorn prefix>held:<key>``).
2. :func:`resubmit`, once gearmand listens: each held job is submitted again
   with its real function, unique, data and priority (gearmand writes its key
   anew), then the held key is deleted.

A key alone cannot tell where a function with a ``-`` ends, so every gearhorn
process records such function names in the registry before it first submits
a background job to one (:class:`DashedFunctions`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

import redis

from gearhorn import gearman
from gearhorn.servers import Managed
from gearhorn.store.dashed import DashedFunctions
from gearhorn.store.keys import Keys

log = logging.getLogger(__name__)

# gearmand's default --redis-prefix; gearhorn starts gearmand with it.
GEARMAND_PREFIX = b"_gear_"
_PRECEDENCE = {0: "high", 1: "normal", 2: "low"}  # gearmand's priority numbers
_SCAN_COUNT = 1000

# Returns the 1-based positions of the KEYS whose job data holds a NUL byte.
_FIND_NUL = """
local found = {}
for i, key in ipairs(KEYS) do
  if redis.call('TYPE', key)['ok'] == 'hash' then
    local data = redis.call('HGET', key, 'data')
    if data and string.find(data, '\\0', 1, true) then found[#found + 1] = i end
  end
end
return found
"""


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """One job as gearmand's queue stores it."""

    function: bytes
    unique: bytes


def split_key(key: bytes, dashed: Collection[bytes],
              prefix: bytes = GEARMAND_PREFIX) -> QueuedJob | None:
    """The job a queue key stands for; None for a key that is not gearmand's.

    The function is the longest recorded name with a ``-`` that the key's body
    starts with, else the body up to its first ``-`` (as gearmand reads it).
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
    return QueuedJob(body[:cut], body[cut + 1:])


def replayed_wrong(job: QueuedJob, data_has_nul: bool) -> bool:
    """Whether gearmand 1.1.20 would replay ``job`` as something else."""
    return b"-" in job.function or b"*" in job.unique or data_has_nul


def hold(queue: redis.Redis, dashed: Collection[bytes], keys: Keys,
         prefix: bytes = GEARMAND_PREFIX) -> int:
    """Step 1, before gearmand starts: move aside every job key gearmand
    would replay wrong; returns how many."""
    find_nul = queue.register_script(_FIND_NUL)
    held = 0
    for batch in scan_keys(queue, prefix + b"-*"):
        with_nul = {batch[i - 1] for i in find_nul(keys=batch)}
        pipe = queue.pipeline(transaction=False)
        for key in batch:
            job = split_key(key, dashed, prefix)
            if job is not None and replayed_wrong(job, key in with_nul):
                pipe.rename(key, keys.held_job(key))
                held += 1
        pipe.execute()
    if held:
        log.info("held %d queued jobs that gearmand would replay wrong", held)
    return held


def resubmit(queue: redis.Redis, dashed: Collection[bytes], keys: Keys,
             client: gearman.Client, prefix: bytes = GEARMAND_PREFIX) -> int:
    """Step 2, once gearmand listens: submit every held job again, then drop
    its held key; returns how many."""
    done = 0
    for batch in scan_keys(queue, keys.held_job(b"*")):
        pipe = queue.pipeline(transaction=False)
        for key in batch:
            pipe.hgetall(key)
        by_precedence: dict[str, list[tuple[bytes, gearman.Copy]]] = {}
        for key, fields in zip(batch, pipe.execute(raise_on_error=False), strict=True):
            copy, precedence = queued_copy(key[len(keys.held_job(b"")):], fields, dashed, prefix)
            if copy is not None:
                by_precedence.setdefault(precedence, []).append((key, copy))
        for precedence, items in by_precedence.items():
            client.submit_background([copy for _, copy in items], precedence)
            queue.delete(*[key for key, _ in items])
            done += len(items)
    if done:
        log.info("resubmitted %d held jobs to gearmand", done)
    return done


def start_mended(queue: redis.Redis, registry: redis.Redis, keys: Keys,
                 start: Callable[[], Managed]) -> Managed:
    """``start()`` gearmand on its redis queue with both steps around it."""
    dashed = DashedFunctions(registry, keys).load()
    hold(queue, dashed, keys)
    started = start()
    client = gearman.Client([(started.host, started.port)], connect_timeout=60)
    try:
        resubmit(queue, dashed, keys, client)
    finally:
        client.close()
    return started


def queued_copy(key: bytes, fields: dict[bytes, bytes], dashed: Collection[bytes],
                prefix: bytes) -> tuple[gearman.Copy | None, str]:
    """The job at queue key ``key`` (its hash ``fields``) and its precedence;
    None (logged) for what is not a job."""
    job = split_key(key, dashed, prefix)
    if not isinstance(fields, dict):  # not a hash: gearmand <= 1.1.15 kept strings
        fields = {}
    try:
        priority = int(fields.get(b"priority", b"1"))
        copy = gearman.Copy(job.function.decode(), job.unique.decode(), fields[b"data"])
    except (AttributeError, KeyError, ValueError):  # no job, no data, not text
        log.error("held key %r is not a job gearhorn can resubmit; left in place", key)
        return None, "normal"
    return copy, _PRECEDENCE.get(priority, "normal")


def scan_keys(client: redis.Redis, pattern: bytes) -> Iterator[list[bytes]]:
    cursor = 0
    while True:
        cursor, found = client.scan(cursor, match=pattern, count=_SCAN_COUNT)
        if found:
            yield list(found)
        if cursor == 0:
            return
