"""The copies gearhorn holds itself (``copies = held``): one record per copy
in Redis until its receiver answers (docs/design/gearmand.rst, "Held copies").

Why it is shaped so: docs/design/notes.rst, "gearhorn/store/heldcopies.py".
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import redis

from gearhorn.gearman import Copy
from gearhorn.rules.naming import FOREGROUND_MARK, GENERATION_MARK, HEADER_MARK
from gearhorn.store.keys import Keys
from gearhorn.store.redisutil import ScriptCall, script, text, with_scripts_loaded

# Room for "^" and three base-36 digits within gearmand's 63 bytes of unique.
KEY_BYTES = 59
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"
# A copy's unique that carries its header id: naming.copy_unique's head.
_HEADED = re.compile(re.escape(FOREGROUND_MARK) + "?" + re.escape(HEADER_MARK)
                     + "[0-9a-f]{32}:")


@dataclass(frozen=True, slots=True)
class HeldCopy:
    """One copy as its record says. Pure."""

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
    number, digits = generation % 36 ** 3, ""
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


class HeldCopies:
    """The records of held copies, on the registry's Redis."""

    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.redis, self.keys = client, keys
        self._keep = script(client, "keep_copies.lua")
        self._claim = script(client, "claim_takeover.lua")

    def keep(self, copies: Sequence[HeldCopy], again: bool = False) -> list[HeldCopy]:
        """Write the records of ``copies`` (one round trip; their
        acknowledgement waits for the fsync that covers this write); the
        copies written, to be handed. A copy whose record is there already
        (its fanout ran before) is held already and left out
        (lua/keep_copies.lua). With ``again`` (handed over), a copy whose
        record is gone (answered meanwhile) is left out, and the others go
        at a generation above any handed out."""
        by_queue: dict[str, list[HeldCopy]] = {}
        for copy in copies:
            by_queue.setdefault(copy.queue, []).append(copy)
        calls: list[ScriptCall] = []
        heads: dict[tuple[str, str], bytes] = {}  # a batch has one holder, few precedences
        for queue, some in by_queue.items():  # one call a queue: a batch has many
            args: list[object] = ["again" if again else "new"]
            for copy in some:
                head = heads.get((copy.holder, copy.precedence))
                if head is None:
                    head = heads[copy.holder, copy.precedence] = copy.head()
                args += (copy.key, head, copy.generation, copy.tail())
            calls.append((self._keep, [self.keys.copies(queue)], args))
        # One round trip: each holder's index first, so that no record is
        # ever missing from it, then the records.
        written = with_scripts_loaded(self.redis, calls, lambda some: self._write(copies, some))
        return [copy if generation == copy.generation else copy.at(generation)
                for some, generations in zip(by_queue.values(), written, strict=True)
                for copy, generation in zip(some, generations, strict=True)
                if generation >= 0]

    def _write(self, copies: Sequence[HeldCopy], calls: list[ScriptCall]) -> list[object]:
        """The holders' index of ``copies`` and the script ``calls``, in one
        pipeline; each call's reply (an error reply as its exception)."""
        cluster = isinstance(self.redis, redis.RedisCluster)
        pipe = self.redis.pipeline(transaction=False)
        for holder, queues in _queues_by_holder(copies).items():
            pipe.sadd(self.keys.holding(holder), *queues)
            pipe.sadd(self.keys.holders, holder)
        indexed = len(pipe)
        for script_, keys, args in calls:
            options = {"target_nodes": self.redis.get_node_from_key(keys[0])} if cluster else {}
            pipe.execute_command("EVALSHA", script_.sha, len(keys), *keys, *args, **options)
        replies = pipe.execute(raise_on_error=False)
        for reply in replies[:indexed]:
            if isinstance(reply, Exception):
                raise reply
        return replies[indexed:]

    def forget(self, answered: Sequence[tuple[str, str]]) -> None:
        """The receivers answered these copies, each (queue, the unique
        gearmand was given): drop their records, in one round trip. Only a
        copy's last generation can be answered: gearmand runs no job whose
        holder left."""
        if not answered:
            return
        by_queue: dict[str, list[str]] = {}
        for queue, handed in answered:
            by_queue.setdefault(queue, []).append(key_of(handed))
        pipe = self.redis.pipeline(transaction=False)
        for queue, keys in by_queue.items():  # one HDEL a queue
            pipe.hdel(self.keys.copies(queue), *keys)
        pipe.execute()

    def count(self, queue: str) -> int:
        return int(self.redis.hlen(self.keys.copies(queue)))

    def counts(self, queues: Sequence[str]) -> dict[str, int]:
        """The copies held in each of ``queues``: one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for queue in queues:
            pipe.hlen(self.keys.copies(queue))
        return dict(zip(queues, (int(n) for n in pipe.execute()), strict=True)) if queues else {}

    def held_by(self, holder: str) -> Iterator[HeldCopy]:
        """Every copy ``holder`` holds, queue by queue."""
        for queue in sorted(text(q) for q in self.redis.smembers(self.keys.holding(holder))):
            for _, record in self.redis.hscan_iter(self.keys.copies(queue), count=1000):
                copy = HeldCopy.decode(queue, record)
                if copy.holder == holder:
                    yield copy

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

    def holders(self) -> list[str]:
        return sorted(text(h) for h in self.redis.smembers(self.keys.holders))

    def hand_over(self, copies: Sequence[HeldCopy], holder: str) -> list[HeldCopy]:
        """The next generation of ``copies``, held by ``holder``, written
        before it goes to gearmand: a later takeover then never submits a
        generation that was handed out already."""
        moved = [copy.again(holder) for copy in copies]
        return [written for at in range(0, len(moved), 1000)
                for written in self.keep(moved[at:at + 1000], again=True)]

    def retire(self, holder: str) -> None:
        """``holder`` holds nothing any more (its copies were handed over)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.delete(self.keys.holding(holder))
        pipe.srem(self.keys.holders, holder)
        pipe.execute()

    def claim(self, holder: str, claimer: str, is_alive: Callable[[str], bool],
              seconds: int = 60) -> bool:
        """Take over ``holder``'s copies: True for one ``claimer`` at a
        time. A claim lasts ``seconds``, or until its claimer is no longer
        alive (killed mid-takeover, its claim would otherwise hold the
        copies back for the rest of those seconds). ``is_alive`` is asked
        after the claim is read: a claimer claims only once its own
        heartbeat is there (HoldingClient), so a live one is always seen."""
        key = self.keys.taking_over(holder)
        if self._claim(keys=[key], args=[claimer, seconds, ""]):
            return True
        current = self.redis.get(key)
        if current is None or (text(current) != claimer and is_alive(text(current))):
            return False
        return bool(self._claim(keys=[key], args=[claimer, seconds, text(current)]))


def _queues_by_holder(copies: Sequence[HeldCopy]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for copy in copies:
        found.setdefault(copy.holder, set()).add(copy.queue)
    return found
