"""The examples in gearhorn's docstrings run: every module with a ``>>>``."""

from __future__ import annotations

import doctest
import importlib
import pathlib

import pytest

import gearhorn

ROOT = pathlib.Path(gearhorn.__file__).parent
WITH_EXAMPLES = sorted(
    ".".join(("gearhorn", *path.relative_to(ROOT).with_suffix("").parts))
    for path in ROOT.rglob("*.py") if ">>>" in path.read_text(encoding="utf-8"))


def test_the_modules_with_examples_are_found():
    assert {"gearhorn.runtime.background", "gearhorn.rules.naming",
            "gearhorn.stomp.queues.dispatch"} <= set(WITH_EXAMPLES)


@pytest.mark.parametrize("name", WITH_EXAMPLES)
def test_the_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0, result
