"""What a foreground fanout of held copies waits for: each copy's answer,
on whichever generation of it comes (gearhorn/store/holding.py)."""

from __future__ import annotations

import threading
import time

from gearhorn import gearman


class HeldAnswers:
    """The answers a foreground fanout waits for, one per held copy (its
    queue and record key), in the order the copies came."""

    def __init__(self, waiting: dict[tuple[str, str], HeldAnswers], lock: threading.Lock,
                 keys: list[tuple[str, str]]) -> None:
        # The holder's waiting fanouts by copy, and the lock that guards them
        self._waiting, self._lock, self.keys = waiting, lock, keys
        self._outcomes: dict[tuple[str, str], gearman.Outcome] = {}
        self._settled = threading.Condition()

    def settle(self, key: tuple[str, str], outcome: gearman.Outcome) -> None:
        with self._settled:
            self._outcomes[key] = outcome
            self._settled.notify_all()

    def wait(self, timeout: float) -> list[gearman.Outcome]:
        """The outcomes within ``timeout`` s; ``timeout`` for a copy not
        answered by then (it stays held)."""
        deadline = time.monotonic() + timeout
        with self._settled:
            while len(self._outcomes) < len(set(self.keys)):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._settled.wait(left)
            outcomes = dict(self._outcomes)
        self.let_go()
        late = gearman.Outcome("timeout", reason=f"no answer within {timeout:.3g}s")
        return [outcomes.get(key, late) for key in self.keys]

    def let_go(self) -> None:
        """Answers that come from now on are not waited for."""
        with self._lock:
            for key in self.keys:
                if self._waiting.get(key) is self:
                    del self._waiting[key]
