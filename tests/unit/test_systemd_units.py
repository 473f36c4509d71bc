"""etc/systemd/: one service per part of a node, each started again when it
stops, in order, all under gearhorn-node.target. ``systemd-analyze verify``
reads them as systemd would (an unknown key, a command that is not there,
an ordering on a unit that does not exist); installed where this checkout
is, instead of /opt/gearhorn."""

from __future__ import annotations

import configparser
import pathlib
import subprocess
import sys

import pytest

from gearhorn.supervision.node import PARTS
from tests.needs import require_binary

pytestmark = pytest.mark.timeout(60)

ROOT = pathlib.Path(__file__).resolve().parents[2]
UNITS = ROOT / "etc" / "systemd"


def units() -> list[pathlib.Path]:
    return sorted([*UNITS.glob("*.service"), *UNITS.glob("*.target")])


def test_every_part_of_a_node_has_a_unit_that_restarts_it():
    assert {p.stem.removeprefix("gearhorn-") for p in UNITS.glob("*.service")} == set(PARTS)
    for path in UNITS.glob("*.service"):
        unit = configparser.ConfigParser(interpolation=None, strict=False)
        unit.read(path)
        assert unit["Service"]["Restart"] == "always", path.name
        assert f"--only {path.stem.removeprefix('gearhorn-')}" in unit["Service"]["ExecStart"]
        assert unit["Install"]["WantedBy"] == "gearhorn-node.target"
    target = configparser.ConfigParser(interpolation=None, strict=False)
    target.read(UNITS / "gearhorn-node.target")
    assert set(target["Unit"]["Wants"].split()) == {f"gearhorn-{p}.service" for p in PARTS}


def test_the_pool_and_the_bridge_start_after_what_they_need():
    for part in ("worker", "bridge"):
        unit = configparser.ConfigParser(interpolation=None, strict=False)
        unit.read(UNITS / f"gearhorn-{part}.service")
        after = unit["Unit"]["After"].split()
        assert {"gearhorn-sentinel.service", "gearhorn-gearmand.service",
                "gearhorn-fsyncd.service"} <= set(after)


def test_systemd_reads_every_unit_without_a_word(tmp_path):
    analyze = require_binary("systemd-analyze", "systemd")
    venv = pathlib.Path(sys.executable).parent.parent  # .venv: its gearhorn command
    env_file = tmp_path / "node.env"
    env_file.write_text((UNITS / "node.env").read_text())
    for path in units():
        text = path.read_text().replace("/opt/gearhorn/.venv", str(venv))
        (tmp_path / path.name).write_text(text.replace("/etc/gearhorn/node.env", str(env_file)))
    done = subprocess.run([analyze, "verify", "--man=no", *sorted(map(str, tmp_path.glob(
        "gearhorn-*")))], capture_output=True, text=True, timeout=50)
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), (
        done.stdout + done.stderr)
