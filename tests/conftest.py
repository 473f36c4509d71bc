"""Shared by all tests: a missing server is a skip on a laptop, a failure in CI."""

import os

import pytest

from gearhorn import servers

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require_binary(binary: str, package: str) -> str:
    path = servers.find_binary(binary)
    if path is None:
        message = f"{binary} is not installed (apt-get install {package})"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return path
