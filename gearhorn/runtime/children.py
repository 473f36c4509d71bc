"""Child processes that stop by themselves when their parent dies."""

from __future__ import annotations

import ctypes
import signal

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """For ``preexec_fn``: the child gets SIGTERM when its parent dies
    (PR_SET_PDEATHSIG), so nothing gearhorn starts outlives it."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
