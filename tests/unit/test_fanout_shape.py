"""bench/fanout_shape.py: the first and last delivery of each message, and
the subscriber wake-ups it took (docs/benchmarks.rst, issue 27)."""

from __future__ import annotations

import doctest

from bench import fanout_shape as module
from bench.fanout_shape import fanout_shape


def test_its_example_runs():
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


def test_a_process_reading_two_sockets_in_one_wake_up_is_one_wake_up():
    # message 1: process 0 reads sockets 0 and 1 in one wake-up, then again
    # for socket 2; process 1 once. Message 2: process 0 once.
    arrivals = [(1.0, 0, 0, 0.0002, 0.0001), (1.0, 0, 1, 0.0003, 0.0001),
                (1.0, 0, 2, 0.0009, 0.0008), (1.0, 1, 0, 0.0005, 0.0004),
                (2.0, 0, 0, 0.0004, 0.0003)]
    shape = fanout_shape(arrivals)
    assert shape["wakeups_per_message"] == 2.0  # (3 + 1) / 2
    assert shape["first_p99_ms"] == 0.4  # message 2's only delivery, the later first
    assert round(shape["last_p99_ms"], 6) == 0.9
