"""The naming rules: every Gearman function name and unique key gearhorn
makes, and the ids of its processes, in one place.

=============================  ==============================================
``<topic>_<client id>``        a subscriber's queue (:func:`queue_name`)
``<base>:<client id>``         a copy's unique key; ``h:<sha256>`` when over
                               63 bytes; ``@<header id>:<client id>`` when
                               the message has headers; ``!`` before it for a
                               foreground fanout's copy (:func:`copy_unique`)
``~<token>``                   a queue message a bridge gave back itself, in
                               order (:func:`returned_unique`)
``stomp:<message id>``         a STOMP SEND to a queue (:func:`stomp_unique`)
``delayed:<message id>``       a delayed queue message (:func:`delayed_unique`)
``call:<uuid>``                a request/reply call (gearman.client.call_unique)
``<queue>.dlq``                a queue's dead letters (:func:`dead_letter_queue`)
``gearhorn.tmp.<s>.<name>``    a STOMP ``/temp-queue/`` (:func:`temp_queue`)
``d-<name>``                   a durable STOMP subscription's client id
                               (:func:`durable_client_id`)
``+<random>``                  a STOMP stream subscription's client id: no
                               queue, no copies; it reads the topic's history
                               (:func:`stream_client_id`)
``<host>:<pid>:<random>``      a worker's or a bridge's id (:func:`process_id`)
=============================  ==============================================
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import uuid

from gearhorn.errors import BadRequest

# gearmand refuses longer unique keys and mangles 64-byte ones (docs/design/index.rst).
MAX_UNIQUE_BYTES = 63
# Gearman functions behind /temp-queue/ reply queues.
TEMP_FUNCTION_PREFIX = "gearhorn.tmp."


def shorten(value: str, limit: int = 40) -> str:
    """``value`` quoted, cut after ``limit`` characters (for error texts)."""
    return repr(value if len(value) <= limit else value[:limit] + "...")


def queue_name(topic: str, client_id: str) -> str:
    """The Gearman function that receives ``client_id``'s copies of ``topic``."""
    return f"{topic}_{client_id}"


def split_queue_name(name: str) -> tuple[str, str]:
    """Inverse of :func:`queue_name`: ``"a_b_c"`` -> ``("a_b", "c")``."""
    topic, sep, client_id = name.rpartition("_")
    if not sep or not topic or not client_id:
        raise BadRequest(f"{shorten(name)} is not a <topic>_<client_id> queue name")
    return topic, client_id


def copy_unique(base: str, client_id: str, header_id: str | None = None,
                foreground: bool = False) -> str:
    """The Gearman unique key of one copy: ``<base>:<client_id>``.

    Keys over 63 bytes (gearmand's real limit: docs/design/paths.rst, "Unique
    keys") become a SHA-256 digest of the same text, so the key stays
    deterministic (coalescing still works) and valid.
    A message with headers has ``@<header id>:<client_id>`` instead (the
    client id digested when too long), so whoever grabs the copy finds its
    headers without a lookup per job (see :func:`header_id_of`).
    A foreground fanout's copy starts with ``!``: a bridge never gives such
    a copy back itself (its sender waits for its answer; :func:`returnable`).
    """
    if foreground:
        return FOREGROUND_MARK + _copy_key(base, client_id, header_id, MAX_UNIQUE_BYTES - 1)
    return _copy_key(base, client_id, header_id, MAX_UNIQUE_BYTES)


def _copy_key(base: str, client_id: str, header_id: str | None, limit: int) -> str:
    if header_id is not None:
        key = f"{HEADER_MARK}{header_id}:{client_id}"
        if len(key) > limit:
            key = f"{HEADER_MARK}{header_id}:" + hashlib.sha256(client_id.encode()).hexdigest()
        return key[:limit]
    key = f"{base}:{client_id}"
    if len(key) <= limit:
        return key
    return "h:" + hashlib.sha256(key.encode()).hexdigest()[:60]  # 62 bytes, "!" fits


# A unique key that starts with this and a 32-digit header id says the job's
# STOMP headers are in Redis (gearhorn/store/headers.py).
HEADER_MARK = "@"
_HEADER_ID = re.compile(r"[0-9a-f]{32}")


def header_id_for(message_id: str, unique: str | None) -> str:
    """Where a message's headers are kept: its message id, or for a request
    with a ``unique`` a digest of it, so a retry coalesces with the first."""
    if unique is None:
        return message_id
    return hashlib.sha256(f"unique:{unique}".encode()).hexdigest()[:32]


def header_id_of(unique: str) -> str | None:
    """The header id a job's unique key carries, or None."""
    unique = unique.removeprefix(FOREGROUND_MARK)
    if unique.startswith(HEADER_MARK) and _HEADER_ID.fullmatch(unique[1:33]):
        return unique[1:33]
    return None


# A foreground fanout's copy (its sender waits for the answer).
FOREGROUND_MARK = "!"
# A message a bridge gave back itself: ``~<token>``; the token names its
# original unique key in Redis (gearhorn/store/redeliveries.py).
RETURNED_MARK = "~"
_DIGEST_COPY = re.compile(r"h:[0-9a-f]{60}")


def returned_unique(token: str) -> str:
    return RETURNED_MARK + token


def returned_token(unique: str) -> str | None:
    """The token of a message a bridge gave back, or None."""
    return unique[1:] if unique.startswith(RETURNED_MARK) else None


# A held copy as gearmand was given it: ``<record key>^<generation, base 36>``
# (gearhorn/store/heldcopies.py). Its holder waits for its answer.
GENERATION_MARK = "^"
# A bridge's WORK_EXCEPTION for a held copy it gives back (a client left
# without acking it): its holder hands it again first in line, in the order
# given back, instead of forgetting it (gearhorn/store/holding.py).
GIVEN_BACK = b"gearhorn: given back, to be handed again first"
_HANDED = re.compile(r"\^[0-9a-z]{1,3}")


def is_held(unique: str) -> bool:
    """Whether ``unique`` is a held copy's, as gearmand was given it.

    >>> is_held("m1:alice^0"), is_held("@" + "0" * 32 + ":bob^1a"), is_held("m1:alice")
    (True, True, False)
    """
    at = unique.rfind(GENERATION_MARK)
    return at > 0 and _HANDED.fullmatch(unique, at) is not None


def own_unique(unique: str) -> str:
    """A held copy's key, the same in every generation it is handed as (its
    hand-outs, headers and ledger entries follow it); any other unique as it is.

    >>> own_unique("m1:alice^0"), own_unique("m1:bob^3^14"), own_unique("order-17")
    ('m1:alice', 'm1:bob^3', 'order-17')
    """
    return unique.rpartition(GENERATION_MARK)[0] if is_held(unique) else unique


def returnable(function: str, unique: str) -> bool:
    """Whether a job of queue ``function`` is a background job gearhorn made,
    which a bridge may give back by submitting it again and completing the
    original (docs/stomp.rst, "Given back in order"). Foreground jobs, and
    jobs of other clients (they may be foreground: a worker cannot tell),
    are left to gearmand.

    >>> returnable("news_alice", "m1:alice"), returnable("news_alice", "!m1:alice")
    (True, False)
    >>> returnable("jobs", "stomp:ab12"), returnable("jobs", "order-17")
    (True, False)

    A held copy is a foreground job of gearhorn's holder: never (given
    back, it would live on in gearmand alone, its record forgotten).

    >>> returnable("news_alice", "@" + "0" * 32 + ":alice^0")
    False
    """
    if is_held(unique):
        return False
    if unique.startswith((STOMP_MARK, DELAYED_MARK, RETURNED_MARK)):
        return True
    if header_id_of(unique) is not None:
        return not unique.startswith(FOREGROUND_MARK)
    if _DIGEST_COPY.fullmatch(unique):
        return True
    _, sep, client_id = function.rpartition("_")
    return bool(sep) and unique.endswith(":" + client_id) and \
        not unique.startswith(FOREGROUND_MARK)


def new_message_id() -> str:
    """32 random hex digits, as ``uuid4().hex`` but a fifth of its cost
    (3.4 against 0.6 us: one per message on the bridge's SEND path)."""
    return os.urandom(16).hex()


def message_ids_for(job_unique: str, count: int) -> list[str]:
    """Message ids of a fanout job: derived from the job's Gearman unique key
    when it has one, so a job run again (its worker died, or gearmand replayed
    it from its persistent queue) makes the same copies with the same unique
    keys, and gearmand coalesces those still queued. Random without one."""
    if not job_unique:
        return [new_message_id() for _ in range(count)]
    return [hashlib.sha256(f"job:{job_unique}:{i}".encode()).hexdigest()[:32]
            for i in range(count)]


_MESSAGE_ID = re.compile(rf"[0-9A-Za-z_-]{{1,{MAX_UNIQUE_BYTES}}}")


def given_message_ids(value: object, count: int) -> tuple[str, ...]:
    """A fanout's ``message_ids``: absent, or one id per message (the sender
    named them; else they derive from the job: :func:`message_ids_for`)."""
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) != count:
        raise BadRequest(f"message_ids must be a list of {count} ids, one per message")
    for given in value:
        # Letters, digits, '-' and '_' only: a copy's unique key is built from
        # its message id, and ':' or '@' there have meanings (naming.py).
        if not isinstance(given, str) or not _MESSAGE_ID.fullmatch(given):
            raise BadRequest(f"invalid message id {shorten(str(given))}: use 1 to "
                             f"{MAX_UNIQUE_BYTES} letters, digits, '-' or '_'")
    return tuple(value)


def queue_copy_unique(message_id: str) -> str:
    """A queue message with headers (the bridge's SENDs, replies, dead
    letters): a copy for no subscriber, marked as carrying headers."""
    return copy_unique("", "q", message_id)


STOMP_MARK = "stomp:"
DELAYED_MARK = "delayed:"


def stomp_unique(message_id: str) -> str:
    return STOMP_MARK + message_id


def delayed_unique(message_id: str) -> str:
    return DELAYED_MARK + message_id


def dead_letter_queue(function: str) -> str:
    return f"{function}.dlq"


def temp_queue(session_id: str, name: str) -> str:
    return f"{TEMP_FUNCTION_PREFIX}{session_id}.{name}"


def durable_client_id(name: str) -> str:
    """A registry client id for a durable subscription name (stable, no '_')."""
    if re.fullmatch(r"[!-~]{1,100}", name) and "_" not in name and "*" not in name:
        return "d-" + name
    return "d-" + hashlib.sha256(name.encode()).hexdigest()[:32]


STREAM_CLIENT_MARK = "+"


def stream_client_id() -> str:
    """A client id for a STOMP subscription served from the topic's history
    (gearhorn/stomp/topics/streams.py): listed, so presence and the janitor see
    it, but no worker makes copies for it."""
    return STREAM_CLIENT_MARK + uuid.uuid4().hex[:20]


def is_stream_client(client_id: str) -> bool:
    return client_id.startswith(STREAM_CLIENT_MARK)


def process_id() -> str:
    """Unique across hosts and restarts: the janitor and status go by it."""
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(3).hex()}"
