"""A thread's own gearman client whose background copies are held by its
process's one holder (gearhorn/store/holding.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gearhorn import gearman


class Holds(Protocol):
    """What this uses of a HoldingClient."""

    def submit_background(self, copies: Sequence[gearman.Copy],
                          precedence: str = "normal") -> int: ...


class Beside:
    """A thread's own ``gearman.Client`` whose background copies go to a
    shared HoldingClient (one holder per process)."""

    def __init__(self, holding: Holds, client: gearman.Client) -> None:
        self.holding, self.client = holding, client

    def __getattr__(self, name: str) -> object:
        return getattr(self.client, name)

    def submit_background(self, copies: Sequence[gearman.Copy],
                          precedence: str = "normal") -> int:
        return self.holding.submit_background(copies, precedence)
