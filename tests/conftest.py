"""Shared by all tests: a missing server, tool or package is a skip on a
laptop and a failure in CI, and a CI run with any skipped test fails."""

import os

from tests.needs import IN_CI


def pytest_configure(config):
    """Under pytest-xdist (tools/run-tests runs two workers), each worker and
    what it starts picks its servers' ports from its own stripe
    (``servers.free_port``)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ...
    if worker:
        count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")
        os.environ["GEARHORN_PORT_STRIPE"] = f"{worker.removeprefix('gw')}/{count}"


# Every test reported skipped in this run (node ids).
_SKIPPED: list[str] = []
# What tests measured and said (the ``report`` fixture), for the summary.
_REPORTED: list[str] = []


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        _SKIPPED.append(report.nodeid)
    if report.when == "call":
        _REPORTED.extend(f"[{report.nodeid}] {value}"
                         for name, value in report.user_properties if name == "report")


def pytest_terminal_summary(terminalreporter):
    """The figures tests report, shown whether they ran in this process or in
    a pytest-xdist worker (whose own output is not shown)."""
    if _REPORTED:
        terminalreporter.section("what the tests measured")
        for line in _REPORTED:
            terminalreporter.write_line(line)


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
