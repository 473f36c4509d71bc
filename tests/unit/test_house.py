"""The house's rules, checked on every run: the layers' import contracts
(.importlinter, import-linter) and small modules (docs/design/index.rst)."""

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
    assert long == {}, "split these by concern (docs/design/index.rst, The packages)"


def test_tests_import_no_other_test_module_nor_a_conftest():
    """Shared test code lives in helper modules (tests/fakes.py, tests/needs.py,
    tests/integration/*_helpers.py) and fixtures, not in a test or a conftest."""
    pattern = re.compile(r"^\s*(?:from|import)\s+[\w.]*\b(conftest|test_\w+)\b", re.M)
    found = {str(path.relative_to(ROOT)): match.group(0).strip()
             for path in (ROOT / "tests").rglob("*.py")
             if (match := pattern.search(path.read_text()))}
    assert found == {}, "move what they share into a helper module"


def _defined_names(path: pathlib.Path) -> set[str]:
    """What a module defines itself (functions, classes, assignments), not
    what it imports."""
    import ast

    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.update(t.id for t in ast.walk(target) if isinstance(t, ast.Name))
    return names


def test_each_name_has_one_import_path():
    """A name is imported from the module that defines it (a package's
    ``__init__`` may gather its own modules' names as its one way in: the
    Gearman protocol package does), never through a module that imports it
    for convenience."""
    import ast

    wrong = []
    for path in [*(ROOT / "gearhorn").rglob("*.py"), *(ROOT / "tests").rglob("*.py"),
                 *(ROOT / "bench").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module
                    and node.module.startswith("gearhorn.")):
                continue
            source = ROOT / (node.module.replace(".", "/") + ".py")
            if not source.exists():
                continue  # a package: its __init__ is its way in
            defined = _defined_names(source)
            wrong += [f"{path.relative_to(ROOT)}: {alias.name} from {node.module}"
                      for alias in node.names if alias.name not in defined]
    assert wrong == [], "import these from where they are defined"


def test_the_protocol_package_has_one_way_in():
    """Outside gearhorn/gearman/, its names come from the package itself."""
    pattern = re.compile(r"gearhorn\.gearman\.[a-z]+ import")
    found = [str(path.relative_to(ROOT)) for folder in ("gearhorn", "tests", "bench")
             for path in (ROOT / folder).rglob("*.py")
             if "gearman" not in path.relative_to(ROOT).parts[:2]
             and pattern.search(path.read_text())]
    assert found == [], "import them from gearhorn.gearman"
