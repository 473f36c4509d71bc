"""The command line's parsing and the sample config, without servers."""

import configparser
import dataclasses
import os

import pytest

from gearhorn.cli.main import build_parser
from gearhorn.config import Config

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


@pytest.mark.parametrize(("argv", "url"), [
    (["ledger", "--redis-url", "redis://before", "export", "--out", "o"], "redis://before"),
    (["ledger", "export", "--out", "o", "--redis-url", "redis://after"], "redis://after"),
    (["ledger", "--redis-url", "redis://x", "export", "--out", "o", "--redis-url", "redis://y"],
     "redis://y"),
    (["ledger", "export", "--out", "o"], None),
])
def test_common_options_count_before_and_after_a_sub_command(argv, url):
    assert build_parser().parse_args(argv).redis_url == url


def test_the_sample_config_names_every_setting():
    parser = configparser.ConfigParser()
    with open(os.path.join(ROOT, "etc", "gearhorn.conf"), encoding="utf-8") as fp:
        text = fp.read()
    # Commented-out settings count: the sample shows them without forcing them.
    uncommented = "\n".join(line[2:] if line.startswith("# ") and " = " in line else line
                            for line in text.splitlines())
    parser.read_string(uncommented)
    named = set(parser["gearhorn"])
    missing = {f.name for f in dataclasses.fields(Config)} - named
    assert not missing, f"etc/gearhorn.conf lacks {sorted(missing)}"


def test_the_sample_config_loads_as_it_is():
    from gearhorn.config import load

    config = load({}, os.path.join(ROOT, "etc", "gearhorn.conf"), env={})
    assert config.persistence == "auto" and config.durability == "auto"
    assert config.ledger_enabled is True
