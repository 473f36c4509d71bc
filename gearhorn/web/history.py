"""Per-topic message rates over the last minutes, from counter samples. Pure.

The console samples the copies and fanouts counters every second or so; a
rate is the difference of two samples over their time apart. A counter
that went down (Redis was emptied) counts as starting over from zero, as
Prometheus's ``rate()`` does.
"""

from __future__ import annotations

from collections import deque


class RateHistory:
    def __init__(self, window_seconds: float = 300.0) -> None:
        self.window = window_seconds
        self._samples: deque[tuple[float, dict[str, float]]] = deque()

    def add(self, at: float, counters: dict[str, float]) -> None:
        self._samples.append((at, dict(counters)))
        while self._samples and self._samples[0][0] < at - self.window:
            self._samples.popleft()

    def rates(self, name: str) -> list[tuple[float, float]]:
        """(time, per second) between consecutive samples of ``name``."""
        points = []
        pairs = zip(self._samples, list(self._samples)[1:], strict=False)
        for (t0, before), (t1, after) in pairs:
            if t1 <= t0:
                continue
            now, then = after.get(name, 0.0), before.get(name, 0.0)
            grown = now - then if now >= then else now
            points.append((round(t1, 3), round(grown / (t1 - t0), 3)))
        return points

    def all_rates(self, names: list[str]) -> dict[str, list[tuple[float, float]]]:
        return {name: self.rates(name) for name in names}
