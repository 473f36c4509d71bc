"""The garbage collector's settings for a long-running gearhorn server.

Why it is shaped so: docs/design/notes.rst, "gearhorn/runtime/collector.py".
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
