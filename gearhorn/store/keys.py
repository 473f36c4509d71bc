"""Every Redis key and channel gearhorn uses, in one place.

All keys start with the configured prefix (default ``gearhorn:``), or with
``{`` and the prefix. Text in ``{}`` is a Redis Cluster hash tag: keys with
the same tag live in the same hash slot, so every Lua script and
transaction touches one slot (docs/design/redis.rst, "Redis Cluster"). On a single
Redis the braces are just characters.

==============================  ====================================================
``<p>topics``                   set: topics with at least one direct subscriber
``<p>topic:{T}``                set: client ids subscribed to topic T
``<p>topic-version:{T}``        string: change counter of topic T's set
``<p>history:{T}``              stream: topic T's last messages, entry id = offset
                                (store/history.py)
``<p>history-meta:{T}``         hash: T's last offset and its history's epoch
``<p>history-ids:{T}``          sorted set: the workers' message ids appended to T's
                                history in the last 2 minutes -> when (ms), so a fanout
                                run again is appended once
``<p>room``                     hash: the room of each ``reject-publish`` queue, and what
                                workers claimed of it (gearhorn/store/rejectroom.py)
``<p>unique:{T}:<u>``           string: the job of the last fanout to topic T with the
                                JSON ``unique`` u, for ``dedup_window``: a second one
                                is coalesced by gearmand and says so (store/dedup.py)
``<p>dedup:{T}:<id>``           string: the message id of the first fanout to topic T
                                with that dedup id, for ``dedup_window`` (store/dedup.py)
``{<p>prefixes}``               set: prefix subscriptions (``news.*``) with subscribers
``{<p>prefixes}:<P*>``          set: client ids subscribed to prefix P
``{<p>prefixes}:version``       string: change counter of every prefix subscription
``<p>workers``                  sorted set: worker id scored by the epoch second at
                                which it is dead unless it sends a heartbeat
``<p>worker:<id>``              hash: pid, host, started, jobs; expires with the worker
``<p>headers:<id>``             string: JSON headers of a message (gearhorn/store/headers.py),
                                expiring after ``headers_ttl``
``{<p>due:<L>}:<n>``            sorted set: delayed messages of lane L (of
                                ``delay_lanes``) due in the ``n``-th time shard of
                                ``delay_shard_seconds``, scored by due time in ms
                                (gearhorn/store/delayed.py)
``{<p>due:<L>}:cursor``         string: the oldest shard of lane L that may hold
                                messages
``<p>due-layout``               string: JSON ``{"width_ms", "lanes"}``, the shard width
                                and lanes every process uses, recorded by the first
                                (gearhorn/store/delaylayout.py)
``<p>bridges``                  sorted set: bridge id scored by the epoch second at
                                which it is dead unless it sends a heartbeat
``<p>holding-bridges``          sorted set: bridge id scored by the epoch second after
                                which its held copies are taken over (worker_ttl: sooner
                                than its subscriptions are swept; workers' own heartbeats
                                serve for theirs)
``<p>bridge:<id>``              set: what dies with that bridge: ``topic\t<pattern>\t<client
                                id>`` (non-durable subscriptions), ``queue\t<function>``
                                (temp queues); the janitor cleans up after a dead bridge
``<p>bridge:<id>:sweeping``     string: a janitor's claim on cleaning up after that
                                bridge (expires after 60 s)
``<p>temp-queues``              set: every live ``/temp-queue/`` function; a reply may
                                only be sent to one of these
``{<p>ledger:<n>}``             stream: shard n (of ``ledger_shards``) of the
                                delivery ledger (gearhorn/store/ledger.py); each writer
                                appends to one; together trimmed to about
                                ``ledger_maxlen`` entries
``<p>dashed-functions``         set, written by versions before held copies:
                                functions with a ``-`` (gearhorn/supervision/queueupgrade.py)
``<p>held:<key>``               hash, in an older version's gearmand queue Redis:
                                a job set aside (gearhorn/supervision/queueupgrade.py)
``<p>bridge-info:<id>``         hash: pid, host, started, connections of a live
                                bridge; expires with its heartbeat
``{<p>stats}:copies``           sorted set: topic -> copies made, ever (gearhorn/store/stats.py)
``{<p>stats}:fanouts``          sorted set: topic -> messages fanned out, ever
``{<p>stats}:totals``           hash: copies, fanouts, dead letters over every topic
                                and queue, and the fanout latency histogram
``{<p>stats}:dead-letters``     sorted set: queue -> messages dead-lettered, ever
``<p>dead:<queue>``             sorted set: header ids of the dead letters of a queue
                                still in ``<queue>.dlq``, scored by when (ms)
``<p>dead-info:<queue>``        hash: header id -> JSON of reason, delivery count,
                                size and the start of the body (gearhorn/store/deadletters.py)
``<p>last-report``              string: JSON summary of the last ``gearhorn report``
``<p>handouts:<function>``      hash: unique key -> times a bridge handed that message of
                                a shared queue to a client (gearhorn/store/redeliveries.py)
``<p>returned:<token>``         string: the original of a message a bridge gave back
                                as ``~<token>`` (gearhorn/store/redeliveries.py)
``<p>subscriptions``            hash: subscriber queue -> JSON of its topic, client id,
                                when it was (re)subscribed and the limits it was
                                given (gearhorn/rules/limits.py, gearhorn/worker/warden.py)
``<p>tally:{<queue>}``          list: ``<ms> <copies> <bytes>`` per group of copies a
                                worker queued, oldest first (gearhorn/rules/retention.py)
``<p>tally:{<queue>}:sum``      hash: ``c`` copies and ``b`` bytes the list holds
``<p>watched``                  set: queues whose tally may hold copies: the warden's
                                rounds look at these and the ones gearmand says hold copies
                                (gearhorn/worker/warden.py)
``<p>tallied``                  set: queues tallied since the warden's last round (it
                                takes them all; the sums of the others it remembers)
``<p>tally-version``            string: goes up with every flush of the tallies' writers
``<p>renewed``                  set: queues subscribed or given new limits since the
                                warden's last round; the next one takes and judges them
``<p>expiring``                 set: queues whose subscription has ``expires``: the
                                warden looks for their consumers every round
``<p>warden-scanned``           string: set once a warden round read every subscription
                                (the first in this Redis); later rounds read the ones
                                that changed
``<p>consumed:<queue>``         string: epoch second a consumer of the queue was last
                                seen (subscriptions with ``expires``)
``<p>full``                     set: reject-publish queues at their limit (no new copy)
``<p>store``                    hash: the queue store's state as the warden last saw it:
                                ``used``, ``max``, ``guard``, ``over`` (the one-line
                                reason fanouts are refused, or empty)
``<p>backlogs``                 string: JSON of the largest backlogs, their age, consumers
                                and limits (the warden's last round)
``<p>warden``                   string: the warden's lease (one process of the pool)
``<p>copies:{Q}``               hash: queue Q's held copies (``copies = held``), unique
                                -> holder, precedence, generation and body
                                (gearhorn/store/heldcopies.py)
``<p>holding:<id>``             set: the queues holder (worker) <id> has copies in
``<p>holders``                  set: the holders with copies
``<p>taking-over:<id>``         string: the claim of the process taking over a dead
                                holder's copies
==============================  ====================================================

The matchmaking channel (default ``__matchmaking``, not prefixed so other
tools find it) carries one JSON message per change:
``{"op": "subscribe"|"unsubscribe", "topic": T, "client_id": C, "version": "N"}``,
N being the new change counter of the topic (or of all prefix subscriptions,
for a pattern) as a string; ``{"op": "pressure"}`` when the warden changed
``<p>full`` or the store's state (workers read them again); and
``{"op": "due", "in_ms": N}`` when a delayed message is the first of its time
shard, due in N ms (sleeping workers wake for it: gearhorn/store/delayed.py).
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

    @property
    def workers(self) -> str:
        return self.prefix + "workers"

    def headers(self, header_id: str) -> str:
        return f"{self.prefix}headers:{header_id}"

    @property
    def bridges(self) -> str:
        return self.prefix + "bridges"

    @property
    def holding_bridges(self) -> str:
        return self.prefix + "holding-bridges"

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

    def holding(self, holder: str) -> str:
        return f"{self.prefix}holding:{holder}"

    @property
    def holders(self) -> str:
        return self.prefix + "holders"

    def taking_over(self, holder: str) -> str:
        return f"{self.prefix}taking-over:{holder}"
