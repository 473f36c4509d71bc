"""The worker's Gearman functions: ``subscribe_fanout``,
``unsubscribe_fanout``, ``fanout``, ``topic_presence``, ``topic_history``.

:class:`FanoutService` is the logic (jobs in, JSON bytes or a BadRequest
out), whatever brings the jobs; gearhorn/worker/process.py's
``WorkerProcess`` feeds it jobs from gearmand and answers them, and
gearhorn/worker/wiring.py builds it. Each job is parsed once, here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence

from gearhorn.errors import BadRequest
from gearhorn.rules.messages import (
    Fanout,
    parse_fanout,
    parse_history,
    parse_presence,
    parse_subscription,
)
from gearhorn.store.history import History
from gearhorn.store.observers import Observer
from gearhorn.store.presence import Presence
from gearhorn.store.registry import Registry
from gearhorn.worker.copies import plain
from gearhorn.worker.fanout import Fanouts, Outgoing
from gearhorn.worker.jobs import (
    FANOUT,
    HISTORY,
    PRESENCE,
    SUBSCRIBE,
    SUBSCRIBE_ALIAS,
    UNSUBSCRIBE,
    Answer,
    Job,
    unavailable_when_servers_fail,
)


def _dumps(obj: dict) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


Group = list[tuple[Job, Fanout]] | tuple[Job, Fanout | BadRequest | None]


class FanoutService:
    """What the Gearman functions do, independent of how jobs arrive."""

    def __init__(self, fanouts: Fanouts, registry: Registry, history: History,
                 max_payload_bytes: int, observer: Observer | None = None) -> None:
        self.fanouts = fanouts
        self.registry = registry
        self.history = history
        self.max_payload_bytes = max_payload_bytes
        self.observer = observer or Observer()
        self._queries: dict[str, Callable[[bytes], bytes]] = {
            SUBSCRIBE: self._subscribe, SUBSCRIBE_ALIAS: self._subscribe,
            UNSUBSCRIBE: self._unsubscribe, PRESENCE: self._presence, HISTORY: self._history}

    def handle(self, function: str, data: bytes, job_unique: str = "",
               received: float | None = None) -> bytes:
        """Run one job; raises BadRequest (bad input) or ServiceUnavailable."""
        (outcome,) = next(self.run([Job(function, data, job_unique, received)]))
        if isinstance(outcome, BadRequest):
            raise outcome
        return outcome

    def run(self, jobs: Sequence[Job]) -> Iterator[list[Answer]]:
        """Run ``jobs`` in order, yielding the outcomes of each group of them
        as it is done.

        Consecutive plain fanouts (background, one priority, no headers, no
        delay) are one group: one subscriber look-up for all their topics
        and one Gearman write for all their copies, which is what makes a
        worker fast when small fanouts queue up. Any other job is a group of
        its own. Raises ServiceUnavailable (Redis or gearmand away): the
        groups yielded are done, the others are not.
        """
        for group in self._groups(jobs):
            try:
                with unavailable_when_servers_fail():
                    outcomes = self._run_group(group)
            except BadRequest as exc:  # the whole group (a full queue store)
                outcomes = [exc] * (len(group) if isinstance(group, list) else 1)
            yield outcomes

    def _run_group(self, group: Group) -> list[Answer]:
        if isinstance(group, list):
            batch = [Outgoing(request, request.ids(job.unique), received=job.received)
                     for job, request in group]
            return [_dumps(result) for result in self.fanouts.deliver(batch)]
        job, request = group
        if isinstance(request, BadRequest):
            return [request]
        if request is not None:
            return [_dumps(self.fanouts.publish(request, job.unique, job.received))]
        query = self._queries.get(job.function)
        if query is None:
            return [BadRequest(f"unknown function {job.function!r}")]
        return [query(job.data)]

    def _groups(self, jobs: Sequence[Job]) -> Iterator[Group]:
        """Runs of plain fanouts as lists; any other job alone, with its
        parsed fanout or the reason parsing refused it."""
        run: list[tuple[Job, Fanout]] = []
        for job in jobs:
            request: Fanout | BadRequest | None = None
            if job.function == FANOUT:
                try:
                    request = parse_fanout(job.data, self.max_payload_bytes)
                except BadRequest as exc:
                    request = exc
            grouped = isinstance(request, Fanout) and plain(request)
            if run and not (grouped and request.priority == run[0][1].priority):
                yield run
                run = []
            if grouped:
                run.append((job, request))
            else:
                yield job, request
        if run:
            yield run

    def _subscribe(self, data: bytes) -> bytes:
        sub = parse_subscription(data)
        count = self.registry.subscribe(sub)
        return _dumps({"topic": sub.topic, "client_id": sub.client_id, "subscribers": count})

    def _unsubscribe(self, data: bytes) -> bytes:
        sub = parse_subscription(data)
        count = self.registry.unsubscribe(sub)
        return _dumps({"topic": sub.topic, "client_id": sub.client_id, "subscribers": count})

    def _presence(self, data: bytes) -> bytes:
        return _dumps(Presence(self.registry).of(parse_presence(data)))

    def _history(self, data: bytes) -> bytes:
        query = parse_history(data)
        return _dumps(self.history.read(query.topic, query.since, query.limit, query.epoch))

    def record_rejection(self, function: str, reason: str) -> None:
        self.observer.refused(function, reason)
