"""Which subscribers get a fanout's copies, and the copies themselves, each
with its unique key: pure, but for the room a reject-publish queue is asked
for (:func:`claim_room`, through the store)."""

from __future__ import annotations

from dataclasses import dataclass

from gearhorn import gearman
from gearhorn.rules.messages import Fanout
from gearhorn.rules.naming import copy_unique
from gearhorn.store.registry import Recipient
from gearhorn.store.rejectroom import RoomKeeper


def plain(request: Fanout) -> bool:
    """A fanout that needs nothing but its copies queued (a worker runs a
    series of them as one group)."""
    return (request.background and request.deliver_at is None and not request.headers
            and request.dedup_id is None and request.unique is None)


def admit(recipients: tuple[Recipient, ...], full: frozenset[str]
           ) -> tuple[tuple[Recipient, ...], tuple[Recipient, ...]]:
    """(recipients that get a copy, reject-publish ones whose queue is full)."""
    if not full:
        return recipients, ()
    return (tuple(r for r in recipients if r.queue not in full),
            tuple(r for r in recipients if r.queue in full))


def claim_room(room: RoomKeeper, bounded: frozenset[str], request: Fanout,
               kept: tuple[Recipient, ...], refused: tuple[Recipient, ...]
               ) -> tuple[tuple[Recipient, ...], tuple[Recipient, ...], dict[str, int]]:
    """Claim room in the reject-publish queues among ``kept`` (one Redis
    call, only when there are some): those with room for none of the
    messages join ``refused``; ``cut`` maps a queue with room for some to
    how many (the first ones) it takes (gearhorn/store/rejectroom.py)."""
    claims = [r for r in kept if r.queue in bounded]
    if not claims:
        return kept, refused, {}
    taken = dict(zip((r.queue for r in claims),
                     room.claim([r.queue for r in claims], [len(b) for b in request.bodies]),
                     strict=True))
    none = {q for q, k in taken.items() if k == 0}
    cut = {q: k for q, k in taken.items() if 0 < k < len(request.bodies)}
    return (tuple(r for r in kept if r.queue not in none),
            refused + tuple(r for r in kept if r.queue in none), cut)


def cut_copies(per: list[list[gearman.Copy]], cut: dict[str, int]
               ) -> tuple[list[list[gearman.Copy]], list[tuple[int, gearman.Copy]]]:
    """The copies each queue of ``cut`` has room for (its first messages),
    and the others, each with the index of its message."""
    if not cut:
        return per, []
    kept = [[c for c in copies if cut.get(c.function, i + 1) > i] for i, copies in enumerate(per)]
    left = [(i, c) for i, copies in enumerate(per) for c in copies
            if cut.get(c.function, i + 1) <= i]
    return kept, left


def make_copies(request: Fanout, message_ids: list[str], recipients: tuple[Recipient, ...],
                header_ids: list[str] | None = None) -> list[list[gearman.Copy]]:
    """One Gearman job per message and recipient, each with its own unique
    key; a list per message (the ledger records each message's own copies).

    Message by message, so every subscriber's queue receives them in order.
    """
    per_message = []
    for i, (body, message_id) in enumerate(zip(request.bodies, message_ids, strict=True)):
        base = request.unique or message_id
        header_id = header_ids[i] if header_ids else None
        copies = []
        for r in recipients:
            who = r.client_id if r.pattern is None else f"{r.pattern}:{r.client_id}"
            copies.append(gearman.Copy(r.queue, copy_unique(base, who, header_id,
                                                            not request.background), body))
        per_message.append(copies)
    return per_message


def flat(per_message: list[list[gearman.Copy]]) -> list[gearman.Copy]:
    """Every message's copies in one list, in order: one write to gearmand."""
    return [copy for copies in per_message for copy in copies]


@dataclass(frozen=True, slots=True)
class Made:
    """One fanout's copies, a list per message; the subscribers they are
    for, the full ones left out, and how many the look-up resolved."""

    request: Fanout
    message_ids: list[str]
    per: list[list[gearman.Copy]]
    recipients: tuple[Recipient, ...]
    refused: tuple[Recipient, ...]
    width: int

    @property
    def copies(self) -> list[gearman.Copy]:
        return flat(self.per)

    def result(self) -> dict[str, object]:
        return {"topic": self.request.topic, "copies": len(self.copies),
                "background": self.request.background, **result_ids(self.message_ids),
                **result_full(self.refused)}


def result_full(refused: tuple[Recipient, ...]) -> dict[str, object]:
    """The result's ``full``: subscribers whose queue took no copy."""
    return {"full": [r.client_id for r in refused]} if refused else {}


def result_ids(message_ids: list[str]) -> dict[str, object]:
    if len(message_ids) == 1:
        return {"message_id": message_ids[0]}
    return {"message_ids": message_ids}
