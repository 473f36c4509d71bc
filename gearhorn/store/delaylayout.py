"""How delayed messages are laid out in Redis: the width of a time shard
and the number of lanes (gearhorn/store/delayed.py).

Why it is shaped so: docs/design/notes.rst, "gearhorn/store/delaylayout.py".
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import redis

from gearhorn.store.keys import Keys

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Layout:
    width_ms: int  # of a time shard
    lanes: int

    def to_json(self) -> str:
        return json.dumps({"width_ms": self.width_ms, "lanes": self.lanes},
                          separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> Layout:
        """Raises ValueError for anything but a layout this module wrote."""
        try:
            obj = json.loads(text)
            layout = cls(int(obj["width_ms"]), int(obj["lanes"]))
        except (TypeError, KeyError, json.JSONDecodeError) as exc:
            raise ValueError(f"not a delayed-message layout: {text!r}") from exc
        if layout.width_ms < 1 or layout.lanes < 1:
            raise ValueError(f"not a delayed-message layout: {text!r}")
        return layout

    def describe(self) -> str:
        return f"delay_shard_seconds = {self.width_ms / 1000:g}, delay_lanes = {self.lanes}"


def record(pipe: redis.client.Pipeline, keys: Keys, layout: Layout) -> None:
    """Queue on ``pipe``: ``layout`` recorded unless one is already."""
    pipe.set(keys.due_layout(), layout.to_json(), nx=True)


def recorded(client: redis.Redis, keys: Keys, configured: Layout) -> Layout:
    """The store's layout: ``configured`` if it is the first to be recorded."""
    pipe = client.pipeline(transaction=False)
    record(pipe, keys, configured)
    pipe.get(keys.due_layout())
    text = pipe.execute()[-1]
    try:
        stored = Layout.from_json(text)
    except ValueError:  # written by hand, or deleted in between: not ours to guess
        log.error("delayed messages: unreadable %s %r; using the configured %s",
                  keys.due_layout(), text, configured.describe())
        return configured
    if stored != configured:
        log.warning("delayed messages: this store was laid out with %s; using that, not "
                    "the configured %s (docs/operations.rst, \"Delayed delivery\")",
                    stored.describe(), configured.describe())
    return stored
