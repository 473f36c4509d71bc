"""The bridge's per-message Redis calls on connections of their own.

Why it is shaped so: docs/design/notes.rst, "gearhorn/store/directcalls.py".
"""

from __future__ import annotations

from collections.abc import Sequence

import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gearhorn.store.redisutil import ScriptCall, run_scripts, with_scripts_loaded

_POOLS = (redis.ConnectionPool, redis.BlockingConnectionPool)
_LOST = (RedisConnectionError, RedisTimeoutError, OSError)


class DirectCalls:
    """Script calls and stream reads of ``client``'s server, past its pool."""

    def __init__(self, client: redis.Redis, most_open: int = 32) -> None:
        self.client = client
        pool = getattr(client, "connection_pool", None)
        self.direct = type(client) is redis.Redis and type(pool) in _POOLS
        self._pool = pool
        self._idle: list[redis.Connection] = []
        self._open = 0
        self.most_open = most_open

    @classmethod
    def pooled(cls, client: redis.Redis) -> DirectCalls:
        """Every call through ``client`` and its pool: for everyone but the bridge."""
        return cls(client, most_open=0)

    def run_scripts(self, calls: list[ScriptCall]) -> list[object]:
        """As :func:`gearhorn.store.redisutil.run_scripts`: every call in one
        round trip, the scripts loaded if the server lacks them."""
        if not self.direct or (not self._idle and self._open >= self.most_open):
            return run_scripts(self.client, calls)
        return with_scripts_loaded(self.client, calls, lambda some: self._execute(
            [("EVALSHA", s.sha, len(keys), *keys, *args) for s, keys, args in some]))

    def xread(self, streams: dict[str, str], count: int, block_ms: int
              ) -> list[list]:
        """XREAD COUNT ``count`` BLOCK ``block_ms`` STREAMS ...: as redis-py's
        ``xread`` returns it ([] when nothing came in time)."""
        if not self.direct or (not self._idle and self._open >= self.most_open):
            return self.client.xread(streams, count=count, block=block_ms) or []
        (reply,) = self._execute([("XREAD", "COUNT", count, "BLOCK", block_ms, "STREAMS",
                                   *streams, *streams.values())])
        if isinstance(reply, ResponseError):
            raise reply
        by_stream = reply.items() if isinstance(reply, dict) else reply or ()  # RESP3, RESP2
        return [[key, [(entry_id, _pairs(fields)) for entry_id, fields in entries]]
                for key, entries in by_stream]

    def close(self) -> None:
        while self._idle:
            self._idle.pop().disconnect()
            self._open -= 1

    def _execute(self, commands: Sequence[tuple]) -> list[object]:
        """Each command's reply (an error reply as its exception), in order."""
        for attempt in range(2):
            connection = self._take()
            try:
                replies = _pipelined(connection, commands)
            except _LOST:
                self._drop(connection)
                self.close()  # what lost one (a restart) lost the idle ones too
                if attempt:
                    raise
                continue
            except BaseException:  # killed mid-call: the replies may be unread
                self._drop(connection)
                raise
            self._idle.append(connection)
            return replies
        raise AssertionError("unreachable")

    def _take(self) -> redis.Connection:
        if self._idle:
            return self._idle.pop()
        self._open += 1
        return self._pool.connection_class(**self._pool.connection_kwargs)

    def _drop(self, connection: redis.Connection) -> None:
        self._open -= 1
        connection.disconnect()


def _pipelined(connection: redis.Connection, commands: Sequence[tuple]) -> list[object]:
    connection.send_packed_command(connection.pack_commands(commands), check_health=False)
    replies: list[object] = []
    for _ in commands:
        try:
            replies.append(connection.read_response())
        except ResponseError as exc:  # the replies after it are still to be read
            replies.append(exc)
    return replies


def _pairs(fields: list) -> dict:
    """A stream entry's fields, as a flat list of names and values."""
    return dict(zip(fields[0::2], fields[1::2], strict=True))
