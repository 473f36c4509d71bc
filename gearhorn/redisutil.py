"""Small helpers every module that talks to Redis shares."""

from __future__ import annotations

from importlib import resources

import redis
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import NoScriptError


def text(value: bytes | str) -> str:
    """A Redis reply as text (clients may or may not decode for us)."""
    return value.decode() if isinstance(value, bytes) else value


def script(client: redis.Redis, name: str) -> Script:
    """``gearhorn/lua/<name>`` registered on ``client`` (each file's header
    documents its KEYS and ARGV)."""
    return client.register_script(resources.files("gearhorn").joinpath(f"lua/{name}").read_text())


def run_scripts(client: redis.Redis, calls: list[tuple[Script, list[str], list[object]]]
                ) -> list[object]:
    """Run several scripts (script, keys, args) in one round trip; each may
    touch another hash slot (on a cluster, the nodes are asked in parallel).

    redis-py's cluster pipeline does not load scripts, so a node that lacks
    one (new, or a replica promoted by a failover) answers NOSCRIPT: then
    every script is loaded on every primary and the calls are made again.
    """
    if not isinstance(client, RedisCluster):
        pipe = client.pipeline(transaction=False)
        for script_, keys, args in calls:
            script_(keys=keys, args=args, client=pipe)
        return pipe.execute()
    for attempt in range(2):
        pipe = client.pipeline(transaction=False)
        for script_, keys, args in calls:
            pipe.execute_command("EVALSHA", script_.sha, len(keys), *keys, *args)
        try:
            return pipe.execute()
        except NoScriptError:
            if attempt:
                raise
            for script_, _, _ in calls:
                client.script_load(script_.script)
    raise AssertionError("unreachable")
