"""The house's rules, checked on every run: the layers' import contracts
(.importlinter, import-linter) and small modules (docs/design.rst)."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from tests.needs import missing

ROOT = pathlib.Path(__file__).resolve().parents[2]
MAX_MODULE_LINES = 450

pytestmark = pytest.mark.timeout(120)


def test_the_import_contracts_hold():
    linter = pathlib.Path(sys.executable).with_name("lint-imports")
    if not linter.exists():
        missing("import-linter is not installed: run tools/ensure-env --test")
    done = subprocess.run([str(linter), "--config", str(ROOT / ".importlinter")], cwd=ROOT,
                          capture_output=True, text=True, timeout=100,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_no_module_is_over_450_lines():
    long = {str(path.relative_to(ROOT)): lines for path in (ROOT / "gearhorn").rglob("*.py")
            if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert long == {}, "split these by concern (docs/design.rst, The packages)"


def test_tests_import_no_other_test_module_nor_a_conftest():
    """Shared test code lives in helper modules (tests/fakes.py, tests/needs.py,
    tests/integration/*_helpers.py) and fixtures, not in a test or a conftest."""
    pattern = re.compile(r"^\s*(?:from|import)\s+[\w.]*\b(conftest|test_\w+)\b", re.M)
    found = {str(path.relative_to(ROOT)): match.group(0).strip()
             for path in (ROOT / "tests").rglob("*.py")
             if (match := pattern.search(path.read_text()))}
    assert found == {}, "move what they share into a helper module"
