"""Acknowledgements after replication: the replica wait of a group commit.

Why it is shaped so: docs/design/notes.rst, "gearhorn/store/replicas.py".
"""

from __future__ import annotations

import logging

import redis

from gearhorn.store.fsync import BarrierUnavailable
from gearhorn.store.redisconn import REDIS_ERRORS

log = logging.getLogger(__name__)

# The write each wait makes, so that WAIT covers everything written before.
MARK = "gearhorn:replicated"

RECEIVED = "received"  # WAIT: in the replicas' memory
FSYNCED = "fsynced"  # WAITAOF: on the replicas' disks


class NotReplicated(BarrierUnavailable):
    """Fewer replicas than ``min_replicas`` confirmed the writes in time:
    nothing is acknowledged; after ``barrier_timeout`` the operation fails
    with this reason (the writes may still reach the replicas later)."""


def shortfall(needed: int, confirmed: int, name: str, how: str, timeout: float) -> str:
    """The reason a wait that found too few replicas gives, or "".

    >>> shortfall(1, 1, "the registry's Redis", RECEIVED, 1.0)
    ''
    >>> shortfall(2, 1, "R", FSYNCED, 0.5)
    'only 1 of the 2 replicas of R that min_replicas asks for fsynced the writes within 0.5s'
    """
    if confirmed >= needed:
        return ""
    return (f"only {confirmed} of the {needed} replicas of {name} that min_replicas asks "
            f"for {how} the writes within {timeout:g}s")


class ReplicaWait:
    """Waits for ``needed`` replicas of one Redis (a single server or the
    master a Sentinel names; not a Redis Cluster)."""

    def __init__(self, client: redis.Redis, name: str, needed: int, timeout: float) -> None:
        self.client, self.name = client, name
        self.needed, self.timeout = needed, timeout
        self.how = FSYNCED  # until the server says it has no WAITAOF
        self.waits = 0

    def wait(self) -> None:
        """Return once ``needed`` replicas hold what was written before
        the call; raises NotReplicated, or Redis's errors (the connection
        broke: the writes may be lost with the master)."""
        confirmed = self._confirmed()
        reason = shortfall(self.needed, confirmed, self.name, self.how, self.timeout)
        if reason:
            raise NotReplicated(reason)
        self.waits += 1

    def _confirmed(self) -> int:
        """How many replicas confirmed, within ``timeout``."""
        milliseconds = max(1, round(self.timeout * 1000))
        pipe = self.client.pipeline(transaction=False)
        pipe.incr(MARK)
        if self.how == FSYNCED:
            pipe.execute_command("WAITAOF", 0, self.needed, milliseconds)
        else:
            pipe.execute_command("WAIT", self.needed, milliseconds)
        _, reply = pipe.execute(raise_on_error=False)
        if isinstance(reply, redis.ResponseError):
            if self.how == FSYNCED and "unknown command" in str(reply).lower():
                log.info("%s has no WAITAOF (Redis before 7.2): acknowledgements wait for "
                         "replicas to receive the writes, not to fsync them", self.name)
                self.how = RECEIVED
                return self._confirmed()
            raise reply
        return int(reply[1]) if isinstance(reply, list) else int(reply)

    def connected(self) -> int | None:
        """Replicas connected to the master now (INFO), None if unknown."""
        try:
            return int(self.client.info("replication").get("connected_slaves", 0))
        except REDIS_ERRORS:
            return None
