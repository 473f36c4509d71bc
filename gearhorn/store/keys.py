"""Every Redis key and channel gearhorn uses, in one place.

Why it is shaped so: docs/design/notes.rst, "gearhorn/store/keys.py".
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    prefix: str = "gearhorn:"
    channel: str = "__matchmaking"

    @classmethod
    def for_config(cls, config) -> Keys:
        """The keys of ``config``'s ``key_prefix`` and ``matchmaking_channel``."""
        return cls(config.key_prefix, config.matchmaking_channel)

    @property
    def topics(self) -> str:
        return self.prefix + "topics"

    def topic(self, topic: str) -> str:
        return f"{self.prefix}topic:{{{topic}}}"

    def topic_version(self, topic: str) -> str:
        return f"{self.prefix}topic-version:{{{topic}}}"

    def history(self, topic: str) -> str:
        return f"{self.prefix}history:{{{topic}}}"

    def history_meta(self, topic: str) -> str:
        return f"{self.prefix}history-meta:{{{topic}}}"

    def history_ids(self, topic: str) -> str:
        return f"{self.prefix}history-ids:{{{topic}}}"

    def dedup(self, topic: str, dedup_id: str) -> str:
        return f"{self.prefix}dedup:{{{topic}}}:{dedup_id}"

    @property
    def room(self) -> str:
        return f"{self.prefix}room"

    def coalesce(self, topic: str, unique: str) -> str:
        return f"{self.prefix}unique:{{{topic}}}:{unique}"

    @property
    def prefixes(self) -> str:
        return f"{{{self.prefix}prefixes}}"

    def prefix_set(self, pattern: str) -> str:
        return f"{self.prefixes}:{pattern}"

    @property
    def prefix_version(self) -> str:
        return f"{self.prefixes}:version"

    def ledger(self, shard: int) -> str:
        return f"{{{self.prefix}ledger:{shard}}}"

    def audit_counts(self, shard: int) -> str:
        """The live audit's counts of ledger shard ``shard``: in its hash
        slot, so a flush writes both in one MULTI."""
        return f"{self.ledger(shard)}:counts"

    @property
    def workers(self) -> str:
        return self.prefix + "workers"

    def headers(self, header_id: str) -> str:
        return f"{self.prefix}headers:{header_id}"

    @property
    def bridges(self) -> str:
        return self.prefix + "bridges"

    @property
    def temp_queues(self) -> str:
        return self.prefix + "temp-queues"

    def bridge(self, bridge_id: str) -> str:
        return f"{self.prefix}bridge:{bridge_id}"

    def sweeping(self, bridge_id: str) -> str:
        return f"{self.prefix}bridge:{bridge_id}:sweeping"

    def due(self, lane: int | str, shard: int | str) -> str:
        return f"{{{self.prefix}due:{lane}}}:{shard}"

    def due_cursor(self, lane: int | str) -> str:
        return f"{{{self.prefix}due:{lane}}}:cursor"

    def due_layout(self) -> str:
        return f"{self.prefix}due-layout"

    def worker(self, worker_id: str) -> str:
        return f"{self.prefix}worker:{worker_id}"

    @property
    def dashed_functions(self) -> str:
        return self.prefix + "dashed-functions"

    def bridge_info(self, bridge_id: str) -> str:
        return f"{self.prefix}bridge-info:{bridge_id}"

    def stats(self, name: str) -> str:
        """``copies``, ``fanouts``, ``totals`` or ``dead-letters``, in one
        hash slot so a flush is one MULTI."""
        return f"{{{self.prefix}stats}}:{name}"

    def handouts(self, function: str) -> str:
        return f"{self.prefix}handouts:{function}"

    def returned(self, token: str) -> str:
        return f"{self.prefix}returned:{token}"

    def dead(self, queue: str) -> str:
        return f"{self.prefix}dead:{queue}"

    def dead_info(self, queue: str) -> str:
        return f"{self.prefix}dead-info:{queue}"

    @property
    def subscriptions(self) -> str:
        return self.prefix + "subscriptions"

    def tally(self, queue: str) -> str:
        return f"{self.prefix}tally:{{{queue}}}"

    def tally_sum(self, queue: str) -> str:
        return f"{self.tally(queue)}:sum"

    @property
    def watched(self) -> str:
        return self.prefix + "watched"

    @property
    def tallied(self) -> str:
        return self.prefix + "tallied"

    @property
    def tally_version(self) -> str:
        return self.prefix + "tally-version"

    @property
    def renewed(self) -> str:
        return self.prefix + "renewed"

    @property
    def expiring(self) -> str:
        return self.prefix + "expiring"

    def consumed(self, queue: str) -> str:
        return f"{self.prefix}consumed:{queue}"

    @property
    def full(self) -> str:
        return self.prefix + "full"

    @property
    def store(self) -> str:
        return self.prefix + "store"

    @property
    def backlogs(self) -> str:
        return self.prefix + "backlogs"

    @property
    def warden(self) -> str:
        return self.prefix + "warden"

    @property
    def warden_scanned(self) -> str:
        return self.prefix + "warden-scanned"

    @property
    def last_report(self) -> str:
        return self.prefix + "last-report"

    @property
    def audit(self) -> str:
        """The live audit's verdict (JSON; gearhorn/pipeline/audit.py)."""
        return self.prefix + "audit"

    def held_job(self, queue_key: bytes) -> bytes:
        return f"{self.prefix}held:".encode() + queue_key

    def copies(self, queue: str) -> str:
        return f"{self.prefix}copies:{{{queue}}}"

    def owners(self, queue: str) -> str:
        """Who may hold copies of ``queue``, and who is fenced there."""
        return f"{self.prefix}owners:{{{queue}}}"

    @property
    def owners_pattern(self) -> str:
        return f"{self.prefix}owners:*"

    @property
    def holders(self) -> str:
        """Every holder's lease (docs/design/held-copies.rst)."""
        return f"{{{self.prefix}holders}}"

    def holder_queues(self, holder: str) -> str:
        """The queues ``holder`` may hold copies in (its index)."""
        return f"{self.holders}:{holder}"

    # Written by versions before issue 77 (gearhorn/supervision/queueupgrade.py)
    def old_holding(self, holder: str) -> str:
        return f"{self.prefix}holding:{holder}"

    @property
    def old_holders(self) -> str:
        return self.prefix + "holders"
