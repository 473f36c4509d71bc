"""Shared by all tests: a missing server, tool or package is a skip on a
laptop and a failure in CI, and a CI run with any skipped test fails."""

import importlib
import os

import pytest

from gearhorn import servers

# Any true value, as CI systems set it (GitHub: true, GitLab: true, others: 1).
IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on")


def missing(message: str):
    """A skip on a laptop, a failure in CI."""
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def require_binary(binary: str, package: str) -> str:
    path = servers.find_binary(binary)
    if path is None:
        missing(f"{binary} is not installed (apt-get install {package})")
    return path


def require_module(name: str, install: str = "tools/ensure-env --test"):
    """``pytest.importorskip`` that fails in CI instead of skipping."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        missing(f"{name} cannot be imported ({exc}): run {install}")


# Every test reported skipped in this run (node ids).
_SKIPPED: list[str] = []


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        _SKIPPED.append(report.nodeid)


def pytest_collectreport(report):
    if report.skipped:  # a whole module skipped (allow_module_level)
        _SKIPPED.append(report.nodeid)


def pytest_sessionfinish(session, exitstatus):
    """In CI a skipped test fails the run: something the suite claims to
    test did not run."""
    if IN_CI and _SKIPPED and exitstatus == 0:
        session.exitstatus = 1
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"CI: {len(_SKIPPED)} tests were skipped, which CI does not "
                                f"allow: {', '.join(_SKIPPED[:10])}", red=True)
