"""Which subscribers get a fanout's copies, and the copies themselves, each
with its unique key: pure, no I/O."""

from __future__ import annotations

from gearhorn import gearman
from gearhorn.messages import Fanout, copy_unique
from gearhorn.store.registry import Recipient


def admit(recipients: tuple[Recipient, ...], full: frozenset[str]
           ) -> tuple[tuple[Recipient, ...], tuple[Recipient, ...]]:
    """(recipients that get a copy, reject-publish ones whose queue is full)."""
    if not full:
        return recipients, ()
    return (tuple(r for r in recipients if r.queue not in full),
            tuple(r for r in recipients if r.queue in full))


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
