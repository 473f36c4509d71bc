"""Giving a queue's held messages back in order (runs under gevent).

Why it is shaped so: docs/design/notes.rst, "gearhorn/stomp/queues/giveback.py".
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence

from gearhorn import gearman
from gearhorn.rules.naming import TEMP_FUNCTION_PREFIX, is_held, returnable, returned_unique
from gearhorn.stomp.queues.dispatchers import Delivery
from gearhorn.store.redeliveries import Redeliveries, Returned

log = logging.getLogger(__name__)

_TEMP_REPLY = f"/queue/{TEMP_FUNCTION_PREFIX}"


def may_give_back(delivery: Delivery) -> bool:
    """A background job gearhorn made, and not a request awaiting its reply."""
    if delivery.headers.get("reply-to", "").startswith(_TEMP_REPLY):
        return False
    return returnable(delivery.job.function, delivery.job.unique)


class GiveBack:
    """Submits held messages again, in order, ahead of newer ones."""

    def __init__(self, handouts: Redeliveries, tls: gearman.TlsFiles | None = None) -> None:
        self.handouts = handouts
        self.tls = tls

    def __call__(self, function: str, held: Sequence[Delivery]) -> list[Delivery]:
        """Submit ``held`` again; returns those given back, whose originals
        the caller answers: held copies first (answered ``GIVEN_BACK``, their
        holders hand them again), then those now queued anew (completed).
        Raises GearmanError or a Redis error when nothing could be given
        back (gearmand then requeues them all)."""
        copies = [d for d in held if is_held(d.job.unique)]
        chosen = [d for d in held if may_give_back(d)]
        if not chosen and not copies:
            return []
        tokens = {id(d): uuid.uuid4().hex for d in chosen}
        self.handouts.give_back(
            function,
            [Returned(tokens[id(d)], d.unique, d.deliveries > 0 or d.redelivered)
             for d in chosen],
            [d.unique for d in held if d.tracked and d.deliveries == 0 and not d.redelivered])
        given = list(copies)
        for (host, port), group in _by_server(chosen):
            client = gearman.Client([(host, port)], tls=self.tls)
            try:
                client.submit_background([gearman.Copy(function, returned_unique(tokens[id(d)]),
                                                       d.body) for d in group], "high")
                given += group
            except gearman.GearmanError as exc:
                log.warning("%s: could not give %d messages back to gearmand %s:%s (%s); "
                            "it requeues them itself", function, len(group), host, port, exc)
            finally:
                client.close()
        return given


def _by_server(deliveries: list[Delivery]) -> list[tuple[tuple[str, int], list[Delivery]]]:
    """Deliveries grouped by the gearmand they came from, each in order."""
    groups: dict[tuple[str, int], list[Delivery]] = {}
    for d in deliveries:
        groups.setdefault((d.worker.conn.host, d.worker.conn.port), []).append(d)
    return list(groups.items())
