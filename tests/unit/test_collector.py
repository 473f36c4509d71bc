"""The collector's settings for a serving process (gearhorn/runtime/collector.py)."""

import gc

import pytest

from gearhorn.runtime import collector


@pytest.fixture
def restored_collector():
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_start_up_is_frozen_and_the_young_are_collected_less_often(restored_collector):
    gc.set_threshold(700, 10, 10)
    survivor = [object()]  # start-up's state: frozen, never walked again
    collector.tune_for_serving()
    assert gc.get_threshold() == (collector.GEN0, 10, 10)
    assert gc.get_freeze_count() > 0
    walked = (o for generation in range(3) for o in gc.get_objects(generation))
    assert not any(o is survivor for o in walked)


def test_garbage_made_after_start_up_is_still_collected(restored_collector):
    collector.tune_for_serving()

    class Node:
        pass

    made = 0
    for _ in range(5 * collector.GEN0):  # cycles: only the collector frees them
        a, b = Node(), Node()
        a.other, b.other = b, a
        made += 2
    del a, b
    alive = sum(1 for o in gc.get_objects() if type(o) is Node)
    assert alive < made / 2, f"{alive} of {made} cycles' nodes left: the collector did not run"
