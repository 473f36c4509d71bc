"""Small helpers every module that talks to Redis shares."""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources

import redis
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import NoScriptError


def text(value: bytes | str) -> str:
    """A Redis reply as text (clients may or may not decode for us)."""
    return value.decode() if isinstance(value, bytes) else value


def script(client: redis.Redis, name: str) -> Script:
    """``gearhorn/store/lua/<name>`` registered on ``client`` (each file's header
    documents its KEYS and ARGV)."""
    lua = resources.files("gearhorn.store").joinpath(f"lua/{name}")
    return client.register_script(lua.read_text())


ScriptCall = tuple[Script, list[str], list[object]]  # a script, its keys, its arguments


def run_scripts(client: redis.Redis, calls: list[ScriptCall]) -> list[object]:
    """Run several scripts (script, keys, args) in one round trip; each may
    touch another hash slot (on a cluster, the nodes are asked in parallel).

    Plain EVALSHA, not redis-py's Script in a pipeline: that asks SCRIPT
    EXISTS first (a round trip per call), and the cluster pipeline asks
    COMMAND GETKEYS per script unless told the node (measured with
    bench/scale.py). A node that answers NOSCRIPT (new, or a replica
    promoted by a failover) gets those scripts loaded, and those calls
    alone are made again: the others ran, and a bridge's history append
    made again after another client's would append twice
    (lua/history_append.lua skips only a repeat of a bridge's last call).
    """
    return with_scripts_loaded(client, calls, lambda some: _pipelined_scripts(client, some))


def with_scripts_loaded(client: redis.Redis, calls: list[ScriptCall],
                        run: Callable[[list[ScriptCall]], list[object]]) -> list[object]:
    """``run(calls)`` (each reply, an error reply as its exception); the
    calls answered NOSCRIPT made once more, alone, after their scripts are
    loaded; the first error raised."""
    replies = run(calls)
    missing = [n for n, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
    if missing:
        for script_ in {calls[n][0].sha: calls[n][0] for n in missing}.values():
            client.script_load(script_.script)
        again = run([calls[n] for n in missing])
        for n, reply in zip(missing, again, strict=True):
            replies[n] = reply
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


def _pipelined_scripts(client: redis.Redis, calls: list[ScriptCall]) -> list[object]:
    """Each call's reply, an error reply as its exception."""
    pipe = client.pipeline(transaction=False)
    add_script_calls(client, pipe, calls)
    return pipe.execute(raise_on_error=False)


def add_script_calls(client: redis.Redis, pipe, calls: list[ScriptCall]) -> None:
    """``calls`` added to ``pipe`` as plain EVALSHA (see :func:`run_scripts`)."""
    cluster = isinstance(client, RedisCluster)
    for script_, keys, args in calls:
        options = {"target_nodes": client.get_node_from_key(keys[0])} if cluster else {}
        pipe.execute_command("EVALSHA", script_.sha, len(keys), *keys, *args, **options)
