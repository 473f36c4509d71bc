"""Spark's needs (pyspark, Java) said in one line, and `gearhorn up`
running the live audit (which needs neither) and starting it again when it
stopped: without Spark or servers."""

import subprocess
import sys

import pytest

from gearhorn.cli import main as cli
from gearhorn.cli import up
from gearhorn.config import Config
from gearhorn.pipeline import needs
from gearhorn.supervision.servers import Managed

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def no_pyspark(monkeypatch):
    real = needs.importlib.util.find_spec
    monkeypatch.setattr(needs.importlib.util, "find_spec",
                        lambda name, *a: None if name == "pyspark" else real(name, *a))


def test_pyspark_missing_is_said_first(no_pyspark):
    assert needs.spark_missing() == needs.NO_PYSPARK


def test_java_missing_is_said_when_pyspark_is_there(monkeypatch):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setattr(needs.shutil, "which", lambda name: None)
    assert needs.spark_missing() == needs.NO_JAVA
    monkeypatch.setattr(needs.shutil, "which", lambda name: "/usr/bin/java")
    assert needs.spark_missing() is None


@pytest.mark.parametrize("argv", [["audit", "--master", "local[*]"],
                                  ["report", "--ledger", "x", "--out", "y"]])
def test_audit_on_spark_and_report_without_pyspark_say_one_line(no_pyspark, capsys, argv):
    assert cli.main(argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"gearhorn {argv[0]}: {needs.NO_PYSPARK}"]


def test_up_runs_the_count_first_audit_by_default_without_pyspark(no_pyspark, tmp_path,
                                                                    monkeypatch):
    monkeypatch.setattr(up.servers, "start_audit",
                        lambda env, folder: Managed("live audit", _ended(), 0))
    embedded = up.Embedded(Config(data_dir=str(tmp_path)))
    embedded._ensure_audit()
    assert embedded.notes["audit"].startswith("live: a copy not delivered within 60 s")
    assert embedded.started == [embedded.audit]


def test_up_without_the_audit_says_so(tmp_path):
    embedded = up.Embedded(Config(audit_enabled=False, data_dir=str(tmp_path)))
    embedded._ensure_audit()
    assert embedded.notes["audit"] == "off (--no-audit)"
    assert embedded.audit is None and embedded.started == []


def _ended() -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    process.wait(30)
    return process


def test_up_starts_an_audit_that_stopped_again_after_a_growing_pause(monkeypatch, tmp_path):
    started = []

    def start_audit(env, folder):
        started.append(folder)
        return Managed("live audit", _ended(), 0)

    monkeypatch.setattr(up.servers, "start_audit", start_audit)
    clock = [1000.0]
    monkeypatch.setattr(up.time, "monotonic", lambda: clock[0])
    embedded = up.Embedded(Config(data_dir=str(tmp_path)))
    embedded.audit = Managed("live audit", _ended(), 0)
    embedded.started.append(embedded.audit)
    waits = []
    for _ in range(4):
        embedded._restart_audit()  # sees it stopped: due after a pause
        waits.append(embedded.audit_due - clock[0])
        embedded._restart_audit()  # not yet
        assert len(started) == len(waits) - 1
        clock[0] = embedded.audit_due
        embedded._restart_audit()  # due: started again, in the same place
        assert len(started) == len(waits)
        assert embedded.started == [embedded.audit]
    assert waits == [1.0, 2.0, 4.0, 8.0]
    assert started == [embedded.audit_folder] * 4
