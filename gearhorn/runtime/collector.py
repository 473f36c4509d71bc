"""The garbage collector's settings for a long-running gearhorn server.

CPython collects its youngest generation after every 700 net allocations
of container objects, and every tenth of those passes also walks the next
generation. The bridge allocates several such objects per delivery (the
delivery, its callbacks, the entry in its connection's queue) and, under
load, holds many at once (what each connection has yet to write). So the
collector ran thousands of times a second: at 100 subscribers per topic it
took about half of the bridge's time, and topic x100 went from about
70,000 to 117,000 deliveries/s with the settings below (docs/benchmarks.rst,
"The collector").

- The youngest generation is collected every ``GEN0`` allocations instead
  of 700: still many times a second at full load, each pass still short.
- What exists once the server has started (modules, settings, connection
  pools) is frozen (``gc.freeze``): it is never garbage, and no full
  collection walks it again.

The older generations keep CPython's thresholds, so cyclic garbage is still
collected, in larger batches.
"""

from __future__ import annotations

import gc

GEN0 = 10_000


def tune_for_serving() -> None:
    """Call once, when start-up is done and before serving."""
    gc.collect()  # what start-up left as garbage goes now, not frozen with the rest
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GEN0, gen1, gen2)
