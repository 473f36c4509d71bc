"""The docs are valid reStructuredText: docutils drops a malformed table or
section whole (it did, twice, unseen), so a warning here is a failure."""

from __future__ import annotations

import io
import pathlib

import docutils.core
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.rst", *(ROOT / "docs").rglob("*.rst"), ROOT / "bench" / "log.rst"])


def problems(text: str) -> str:
    """docutils' warnings and errors for ``text`` ('' when there are none)."""
    stream = io.StringIO()
    docutils.core.publish_doctree(text, settings_overrides={
        "warning_stream": stream, "report_level": 2, "halt_level": 5})
    return stream.getvalue()


def test_the_docs_are_found():
    assert {"README.rst", "index.rst", "benchmarks.rst", "gearmand.rst", "log.rst"} <= {
        p.name for p in DOCS}


def test_a_malformed_table_is_caught():
    assert "Malformed table" in problems("====  ====\nabcdefgh  x\n====  ====\n")


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_the_doc_renders_without_warnings(path):
    assert problems(path.read_text(encoding="utf-8")) == ""
