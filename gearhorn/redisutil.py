"""Small helpers every module that talks to Redis shares."""

from __future__ import annotations

from importlib import resources

import redis
from redis.commands.core import Script


def text(value: bytes | str) -> str:
    """A Redis reply as text (clients may or may not decode for us)."""
    return value.decode() if isinstance(value, bytes) else value


def script(client: redis.Redis, name: str) -> Script:
    """``gearhorn/lua/<name>`` registered on ``client`` (each file's header
    documents its KEYS and ARGV)."""
    return client.register_script(resources.files("gearhorn").joinpath(f"lua/{name}").read_text())
