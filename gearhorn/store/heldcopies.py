"""The copies gearhorn holds itself (``copies = held``): one record per copy
in Redis until its receiver answers (docs/design/gearmand.rst, "Held copies").

Why it is shaped so: docs/design/notes.rst, "gearhorn/store/heldcopies.py".
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import redis

from gearhorn.gearman import Copy
from gearhorn.rules.naming import FOREGROUND_MARK, GENERATION_MARK, HEADER_MARK
from gearhorn.store.keys import Keys
from gearhorn.store.redisutil import (
    ScriptCall,
    add_script_calls,
    run_scripts,
    script,
    text,
    with_scripts_loaded,
)

# Room for "^" and three base-36 digits within gearmand's 63 bytes of unique.
KEY_BYTES = 59
WRAP = 36 ** 3  # a handed unique carries its generation modulo this
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
# A copy's unique that carries its header id: naming.copy_unique's head.
_HEADED = re.compile(re.escape(FOREGROUND_MARK) + "?" + re.escape(HEADER_MARK)
                     + "[0-9a-f]{32}:")


class HeldCopy(NamedTuple):
    """One copy as its record says. Pure. A tuple: a fanout makes one per
    copy, and a frozen dataclass's init cost 1.7 us of the pool's ~40 a
    copy (py-spy, bench/durable.py x1000)."""

    queue: str
    unique: str  # the copy's own
    data: bytes
    holder: str
    precedence: str = "normal"
    generation: int = 0

    @property
    def key(self) -> str:
        return record_key(self.unique)

    def encode(self) -> bytes:
        return self.head() + str(self.generation).encode() + self.tail()

    def head(self) -> bytes:
        """The record before its generation."""
        return f"{self.holder}\0{self.precedence}\0".encode()

    def tail(self) -> bytes:
        """The record after its generation."""
        return f"\0{self.unique}\0".encode() + self.data

    def at(self, generation: int) -> HeldCopy:
        return HeldCopy(self.queue, self.unique, self.data, self.holder, self.precedence,
                        generation)

    @classmethod
    def decode(cls, queue: str, record: bytes) -> HeldCopy:
        holder, precedence, generation, unique, data = record.split(b"\0", 4)
        return cls(queue, unique.decode(), data, holder.decode(), precedence.decode(),
                   int(generation))

    def handed(self) -> Copy:
        """The job gearmand is given for this generation of the copy."""
        return Copy(self.queue, handed_unique(self.key, self.generation), self.data)

    def pending(self) -> tuple[str, str, int]:
        """(queue, key, generation mark): what a list of copies to hand later
        names it by (gearhorn/store/later.py)."""
        return self.queue, self.key, self.generation % WRAP

    def again(self, holder: str) -> HeldCopy:
        """The next generation, held by ``holder``."""
        return HeldCopy(self.queue, self.unique, self.data, holder, self.precedence,
                        self.generation + 1)


def record_key(unique: str) -> str:
    """The record's field: the copy's unique, or a digest of it when the
    generation mark would not fit after it. A unique that names its STOMP
    headers (``@<header id>:``, gearhorn/rules/naming.py) keeps that head, so the
    receiver still finds them.

    >>> record_key("m1:alice")
    'm1:alice'
    >>> len(record_key("m" * 63))
    59
    >>> record_key("@" + "0" * 32 + ":" + "b" * 30)[:34] == "@" + "0" * 32 + ":"
    True
    """
    if len(unique.encode()) <= KEY_BYTES:
        return unique
    digest = hashlib.sha256(unique.encode()).hexdigest()
    if head := _HEADED.match(unique):
        return head.group() + digest[:KEY_BYTES - head.end()]
    return "h:" + digest[:KEY_BYTES - 2]


def handed_unique(key: str, generation: int) -> str:
    """The unique gearmand is given: the record's key and the generation,
    always marked, so no generation of one copy is another copy's unique.

    >>> handed_unique("m1:alice", 0), handed_unique("m1:bob^3", 40)
    ('m1:alice^0', 'm1:bob^3^14')
    """
    if generation < 36:  # nearly always: one character
        return f"{key}{GENERATION_MARK}{_DIGITS[generation]}"
    number, digits = generation % WRAP, ""
    while True:
        number, digit = divmod(number, 36)
        digits = _DIGITS[digit] + digits
        if not number:
            return f"{key}{GENERATION_MARK}{digits}"


def key_of(handed: str) -> str:
    """The record's key in the unique gearmand was given.

    >>> key_of("m1:bob^3^14")
    'm1:bob^3'
    """
    return handed.rpartition(GENERATION_MARK)[0]


def mark_of(handed: str) -> int:
    """The generation a handed unique carries, modulo 36^3 (its three digits).

    >>> mark_of("m1:bob^3^14"), mark_of(handed_unique("k", 46657))
    (40, 1)
    """
    return int(handed.rpartition(GENERATION_MARK)[2], 36)


class Fenced(redis.RedisError):
    """This holder was taken for dead: its writes to held copies are
    refused from now on (docs/design/held-copies.rst). It lets go of its
    connections and comes back under a new name; to a caller outside the
    holder this is an outage of the store: the work is tried again."""


class HeldCopies:
    """The records of held copies, queue by queue, and their holders'
    indexes, on the registry's Redis (lua/copies.lua)."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.redis, self.keys = client, keys
        self._script = script(client, "copies.lua")

    def keep(self, copies: Sequence[HeldCopy]) -> list[HeldCopy]:
        """Write the records of ``copies`` (one round trip; their
        acknowledgement waits for the fsync that covers this write); the
        copies written, to be handed. A copy whose record is there already
        (its fanout ran before) is held already and left out, unless the
        record is exactly this copy's (this call, run twice by a cluster
        client after a failover, or a retry by its own holder: handed
        again, gearmand makes one job of the unique while it lives). Raises
        Fenced when a holder of theirs is fenced in one of their queues."""
        calls: list[ScriptCall] = []
        by_queue = _by_queue(copies, by_holder=True)
        heads: dict[tuple[str, str], bytes] = {}  # a batch has one holder, few precedences
        for (queue, holder), some in by_queue.items():  # a call a queue: a batch has many
            args: list[object] = ["keep", holder]
            for copy in some:
                head = heads.get((copy.holder, copy.precedence))
                if head is None:
                    head = heads[copy.holder, copy.precedence] = copy.head()
                args += (copy.key, head, copy.generation, copy.tail())
            calls.append(self._call(queue, args))
        # One round trip: each holder's index first, so that no record is
        # ever missing from it, then the records.
        written = self._with_index(copies, calls)
        return [copy if generation == copy.generation else copy.at(generation)
                for some, generations in zip(by_queue.values(), written, strict=True)
                for copy, generation in zip(some, generations, strict=True)
                if generation >= 0]

    def hand_again(self, copies: Sequence[HeldCopy], holder: str) -> list[HeldCopy]:
        """The next generation of each of ``copies`` that is still ``holder``'s
        at the generation it was handed at, written before it goes to
        gearmand; the others (answered, or taken over) are left out."""
        calls, by_queue = [], _by_queue(copies)
        for queue, some in by_queue.items():
            args: list[object] = ["again", holder]
            for copy in some:
                args += (copy.key, copy.generation)
            calls.append(self._call(queue, args))
        written = self._run(calls)
        return [HeldCopy(c.queue, c.unique, c.data, holder, c.precedence, generation)
                for some, generations in zip(by_queue.values(), written, strict=True)
                for c, generation in zip(some, generations, strict=True) if generation >= 0]

    def fence(self, queue: str, holders: Sequence[str]) -> set[str]:
        """Refuse every write of ``holders`` (none live) to ``queue``; every
        holder fenced there."""
        (found,) = self._run([self._call(queue, ["fence", "", *holders])])
        return {text(h) for h in found}

    def take(self, queue: str, taker: str,
             copies: Sequence[tuple[HeldCopy, int]]) -> list[HeldCopy]:
        """Each (copy as read, the generation to hand it at) becomes
        ``taker``'s, if its owner is fenced in ``queue`` and the record did not
        change since it was read; those taken."""
        args: list[object] = ["take", taker]
        for copy, generation in copies:
            args += (copy.key, copy.holder, copy.generation, generation)
        (written,) = self._run([self._call(queue, args)])
        return [HeldCopy(c.queue, c.unique, c.data, taker, c.precedence, generation)
                for (c, _), generation in zip(copies, written, strict=True) if generation >= 0]

    def forget(self, answered: Sequence[tuple[str, str]]) -> None:
        """The receivers answered these copies, each (queue, the unique
        gearmand was given): drop their records, in one round trip. A
        record handed again since that generation stays."""
        if not answered:
            return
        by_queue: dict[str, list[object]] = {}
        for queue, handed in answered:
            by_queue.setdefault(queue, []).extend((key_of(handed), mark_of(handed)))
        self._run([self._call(queue, ["forget", "", *items])
                   for queue, items in by_queue.items()])

    def count(self, queue: str) -> int:
        return int(self.redis.hlen(self.keys.copies(queue)))

    def counts(self, queues: Sequence[str]) -> dict[str, int]:
        """The copies held in each of ``queues``: one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for queue in queues:
            pipe.hlen(self.keys.copies(queue))
        return dict(zip(queues, (int(n) for n in pipe.execute()), strict=True)) if queues else {}

    def records(self, queue: str) -> Iterator[HeldCopy]:
        """Every record of ``queue``, in no order."""
        for _, record in self.redis.hscan_iter(self.keys.copies(queue), count=1000):
            yield HeldCopy.decode(queue, record)

    def queues_of(self, holder: str) -> list[str]:
        """The queues ``holder``'s index lists."""
        return sorted(text(q) for q in self.redis.smembers(self.keys.holder_queues(holder)))

    def held_by(self, holder: str) -> Iterator[HeldCopy]:
        """Every copy ``holder`` holds, queue by queue."""
        for queue in self.queues_of(holder):
            yield from (c for c in self.records(queue) if c.holder == holder)

    def find(self, wanted: Sequence[tuple[str, str]]) -> list[HeldCopy]:
        """The records still there of ``wanted``, each (queue, record key)."""
        by_queue: dict[str, list[str]] = {}
        for queue, key in wanted:
            by_queue.setdefault(queue, []).append(key)
        pipe = self.redis.pipeline(transaction=False)
        for queue, keys in by_queue.items():
            pipe.hmget(self.keys.copies(queue), keys)
        return [HeldCopy.decode(queue, record)
                for queue, records in zip(by_queue, pipe.execute(), strict=True)
                for record in records if record is not None]

    def still_held(self, wanted: Sequence[tuple[str, str, int]], holder: str) -> list[HeldCopy]:
        """The records of ``wanted``, each (queue, record key, generation
        mark modulo WRAP), still ``holder``'s at that generation."""
        marks = {(q, k): m for q, k, m in wanted}
        return [c for c in self.find(list(marks))
                if c.holder == holder and c.generation % WRAP == marks[c.queue, c.key]]

    def owners(self, queue: str) -> dict[str, int]:
        """Who may hold copies of ``queue`` (0), and who is fenced there
        (when, Redis ms)."""
        return self.owners_of([queue])[0]

    def owners_of(self, queues: Sequence[str]) -> list[dict[str, int]]:
        """:meth:`owners` of each of ``queues``, in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for queue in queues:
            pipe.hgetall(self.keys.owners(queue))
        return [{text(h): int(v) for h, v in found.items()} for found in pipe.execute()]

    def _call(self, queue: str, args: list[object]) -> ScriptCall:
        return self._script, [self.keys.copies(queue), self.keys.owners(queue)], args

    def _run(self, calls: list[ScriptCall]) -> list:
        try:
            return run_scripts(self.redis, calls)
        except redis.ResponseError as exc:
            raise _fenced_or(exc) from None

    def _with_index(self, copies: Sequence[HeldCopy], calls: list[ScriptCall]) -> list:
        """The holders' index of ``copies``, then the script ``calls``, in one
        pipeline; each call's reply."""
        def write(some: list[ScriptCall]) -> list[object]:
            pipe = self.redis.pipeline(transaction=False)
            for holder, queues in _queues_by_holder(copies).items():
                pipe.sadd(self.keys.holder_queues(holder), *queues)
                # A holder that was forgotten (fenced, its index emptied) and
                # writes again is listed again, and so judged again.
                pipe.zadd(self.keys.holders, {holder: 0}, nx=True)
            indexed = len(pipe)
            add_script_calls(self.redis, pipe, some)
            replies = pipe.execute(raise_on_error=False)
            for reply in replies[:indexed]:
                if isinstance(reply, Exception):
                    raise reply
            return replies[indexed:]
        try:
            return with_scripts_loaded(self.redis, calls, write)
        except redis.ResponseError as exc:
            raise _fenced_or(exc) from None


def _fenced_or(exc: redis.ResponseError) -> Exception:
    return Fenced(str(exc)) if str(exc).startswith("FENCED") else exc


def _by_queue(copies: Sequence[HeldCopy], by_holder: bool = False) -> dict:
    """``copies`` by queue (and holder: a call writes for one)."""
    found: dict = {}
    for copy in copies:
        found.setdefault((copy.queue, copy.holder) if by_holder else copy.queue, []).append(copy)
    return found


def _queues_by_holder(copies: Sequence[HeldCopy]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for copy in copies:
        found.setdefault(copy.holder, set()).add(copy.queue)
    return found
