"""What a test needs from the machine: a missing server, tool or package is
a skip on a laptop and a failure in CI (tests/conftest.py fails a CI run
with any skipped test)."""

import importlib
import os

import pytest

from gearhorn.supervision import servers

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
