"""bench/stomp_load.py's --broker-cpus and --client-cpus: the brokers and the
clients on cores apart (docs/benchmarks.rst, issue 27)."""

import argparse
import json
import os
import subprocess
import sys

import pytest

from bench import stomp_load

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def test_a_cpu_list_is_parsed():
    assert stomp_load.cpu_list("0") == {0}
    assert stomp_load.cpu_list("2,0") == {0, 2}
    with pytest.raises(ValueError):
        stomp_load.cpu_list("zero")


def pinned_by(args: list[str], tmp_path) -> tuple[set[int], set[int]]:
    """The CPUs a process using ``args`` runs on, and those a client it spawns runs on."""
    code = (
        "import argparse, json, multiprocessing, os\n"
        "from bench import stomp_load\n"
        "def client(q):\n"
        "    stomp_load.pin_client(); q.put(sorted(os.sched_getaffinity(0)))\n"
        "if __name__ == '__main__':\n"
        "    parser = argparse.ArgumentParser(); stomp_load.client_options(parser)\n"
        f"    stomp_load.use_client_options(parser.parse_args({args!r}))\n"
        "    ctx = multiprocessing.get_context('spawn'); q = ctx.Queue()\n"
        "    p = ctx.Process(target=client, args=(q,)); p.start()\n"
        "    print(json.dumps([sorted(os.sched_getaffinity(0)), q.get(timeout=60)])); p.join(60)\n")
    script = tmp_path / "pinned.py"  # a file: spawned children import their target from it
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True,
                         text=True, timeout=100, check=True,
                         env={**os.environ, "PYTHONPATH": ROOT}).stdout
    broker, client = json.loads(out)
    return set(broker), set(client)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin apart")
def test_the_brokers_and_the_clients_run_on_the_cpus_given(tmp_path):
    first, second = sorted(os.sched_getaffinity(0))[:2]
    assert pinned_by(["--broker-cpus", str(first), "--client-cpus", str(second)], tmp_path) == (
        {first}, {second})


def test_without_the_options_nothing_is_pinned(tmp_path):
    everywhere = os.sched_getaffinity(0)
    assert pinned_by([], tmp_path) == (everywhere, everywhere)


def test_the_options_parse_into_sets():
    parser = argparse.ArgumentParser()
    stomp_load.client_options(parser)
    args = parser.parse_args(["--broker-cpus", "0", "--client-cpus", "1,2"])
    assert (args.broker_cpus, args.client_cpus) == ({0}, {1, 2})
