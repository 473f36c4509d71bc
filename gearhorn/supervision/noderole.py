"""Which role a node's Redis starts in, from what the node sees: the pure
rule of ``gearhorn node`` (gearhorn/supervision/node.py; docs/operations.rst,
"Three nodes").

Never an empty master: a master that comes back empty before the Sentinels
fail over is followed by its replicas, which replace their data with its
empty one (the known Redis trap). So:

- a Sentinel names a master: another node's, start as its replica; this
  node's, start as the master only if its data came back, else wait for the
  Sentinels to promote a replica;
- no Sentinel answers (the deployment's first start, or every node was
  down): each node starts its Redis as a candidate that takes no write
  (``min-replicas-to-write 1``, no replica yet); once a majority of the
  candidates answer, the one holding the most keys leads (ties: the first
  address), and the others follow it.

>>> decide("10.0.0.2", Seen(named="10.0.0.3", has_data=False))
Decision(role='replica', master='10.0.0.3', reason='')
>>> decide("10.0.0.2", Seen(named="10.0.0.2", has_data=False)).role
'wait'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

MASTER, REPLICA, WAIT, CANDIDATE = "master", "replica", "wait", "candidate"


@dataclass(frozen=True)
class Candidate:
    """A node's Redis as it answers: its role, whom it follows, its keys."""

    role: str  # "master" or "slave", as INFO replication says
    keys: int
    master_host: str | None = None


@dataclass(frozen=True)
class Seen:
    """What a node sees before it starts its Redis."""

    named: str | None  # the master a Sentinel names (host), or None
    has_data: bool  # this node's append-only file came back
    # Every node's Redis that answers (this one's included), by address
    candidates: Mapping[str, Candidate] = field(default_factory=dict)
    nodes: int = 3


@dataclass(frozen=True)
class Decision:
    role: str  # master, replica, wait, or candidate (start, and look again)
    master: str | None = None
    reason: str = ""


def decide(me: str, seen: Seen) -> Decision:
    """This node's Redis role now (see the module's rules)."""
    if seen.named is not None:
        if seen.named != me:
            return Decision(REPLICA, seen.named)
        if seen.has_data:
            return Decision(MASTER, me)
        return Decision(WAIT, reason=f"the Sentinels still name {me} the master, and its "
                                     f"data did not come back: waiting for them to promote a "
                                     f"replica (its replicas would copy an empty data set)")
    followed = sorted({c.master_host for c in seen.candidates.values()
                       if c.role == "slave" and c.master_host})
    if followed:  # a bootstrap already decided elsewhere: follow its leader
        return Decision(MASTER, me) if followed[0] == me else Decision(REPLICA, followed[0])
    if me not in seen.candidates:
        return Decision(CANDIDATE, reason="no Sentinel answers: starting as a candidate")
    if len(seen.candidates) * 2 <= seen.nodes:
        return Decision(WAIT, reason=f"no Sentinel answers, and {len(seen.candidates)} of "
                                     f"{seen.nodes} nodes' Redis do: waiting for a majority "
                                     f"to choose the master (the one with the most keys)")
    leader = leader_of(seen.candidates)
    return Decision(MASTER, me) if leader == me else Decision(REPLICA, leader)


def master_to_follow(me: str, role: str, following: str | None, named: str | None,
                     named_role: str | None) -> str | None:
    """The master a running Redis of this node should follow now, or None
    to leave it: a replica whose master the Sentinels no longer name
    follows the one they name, if that one says it is a master (this
    node's Sentinel may be behind the others). A master is the Sentinels'
    to demote.

    >>> master_to_follow("b", "slave", "a", "c", "master")
    'c'
    >>> master_to_follow("b", "slave", "a", "c", "slave") is None  # its Sentinel is behind
    True
    >>> master_to_follow("b", "master", None, "c", "master") is None
    True
    """
    if role != "slave" or named in (None, me, following) or named_role != "master":
        return None
    return named


def leader_of(candidates: Mapping[str, Candidate]) -> str:
    """The candidate with the most keys; among equals, the first address.

    >>> leader_of({"10.0.0.3": Candidate("master", 5), "10.0.0.2": Candidate("master", 0)})
    '10.0.0.3'
    >>> leader_of({"10.0.0.3": Candidate("master", 0), "10.0.0.2": Candidate("master", 0)})
    '10.0.0.2'
    """
    return min(candidates, key=lambda a: (-candidates[a].keys, _address_key(a)))


def _address_key(address: str) -> tuple:
    parts = address.split(".")
    return tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else (address,)
