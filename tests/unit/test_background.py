"""gearhorn/runtime/background.py: what a loop that must go on logs of its faults."""

from __future__ import annotations

import logging

import pytest

from gearhorn.runtime.background import Fault

pytestmark = pytest.mark.timeout(10)


def _fail(fault: Fault, exc: Exception) -> None:
    try:
        raise exc
    except Exception as caught:  # noqa: BLE001 - what the loops do
        fault.failed(caught)


def test_a_fault_logs_its_traceback_once_while_it_repeats(caplog):
    fault = Fault(logging.getLogger("test.fault"), "round")
    with caplog.at_level(logging.DEBUG, logger="test.fault"):
        for _ in range(4):
            _fail(fault, KeyError("topic"))
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and errors[0].exc_info[0] is KeyError
    assert sum("failed again" in r.getMessage() for r in caplog.records) == 3


def test_a_different_fault_is_logged_too(caplog):
    fault = Fault(logging.getLogger("test.fault"), "round")
    with caplog.at_level(logging.INFO, logger="test.fault"):
        _fail(fault, KeyError("topic"))
        _fail(fault, TypeError("not a str"))
        _fail(fault, TypeError("not a str"))
    errors = [r.exc_info[0] for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [KeyError, TypeError]


def test_working_again_is_said_once_and_forgets_the_fault(caplog):
    fault = Fault(logging.getLogger("test.fault"), "round")
    with caplog.at_level(logging.INFO, logger="test.fault"):
        _fail(fault, KeyError("topic"))
        _fail(fault, KeyError("topic"))
        fault.succeeded()
        fault.succeeded()
        _fail(fault, KeyError("topic"))  # after a good pass: logged again
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert infos == ["round works again after 2 failed passes"]
    assert sum(r.levelno == logging.ERROR for r in caplog.records) == 2
