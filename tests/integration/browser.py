"""Headless Chromium (Debian's) driven by Playwright for Python."""

from __future__ import annotations

import contextlib
import shutil

from tests.conftest import missing, require_module

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]


def chromium():
    """The system browser's path; a skip on a laptop without it, a failure in CI."""
    path = shutil.which("chromium")
    if path is None:
        missing("chromium is not installed: run tools/ensure-env --test")
    require_module("playwright")
    return path


@contextlib.contextmanager
def browser():
    from playwright.sync_api import sync_playwright

    executable = chromium()
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            launched.close()
