"""A partition that heals: service resumes within seconds, and nothing
acknowledged is lost.

bench/partition.py runs ``gearhorn up`` inside a network namespace of its
own (``unshare -n``), with a Gearman producer (foreground fanouts, a fresh
connection each) and a STOMP producer (SENDs with receipts, one connection
to the bridge), and drops every packet to and from Redis's port, then
gearmand's, for 20 s each with nftables. Before every connection noticed a
silent peer (gearhorn/gearman/tcp.py), the bridge's SENDs were answered
6.4 s after gearmand's port healed: its connections waited out TCP's
retransmission backoff. The figures of several rounds are in
docs/benchmarks.rst; the bound here leaves room for a loaded machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.needs import require_binary

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "partition.py")
# Seconds from a heal until answers come again (measured: 0.06-0.85 s).
RESUMES_WITHIN = 3.0


def test_service_resumes_soon_after_a_partition_heals_and_loses_nothing(tmp_path):
    require_binary("unshare", "util-linux")
    require_binary("nft", "nftables")
    require_binary("redis-server", "redis-server")
    require_binary("gearmand", "gearman-job-server")
    done = subprocess.run([sys.executable, BENCH, "--rounds", "1", "--seconds", "20", "--json"],
                          capture_output=True, text=True, timeout=360, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    print(done.stdout)
    assert figures["missing"] == [], figures  # every acknowledged id delivered
    assert figures["acknowledged"] > 100, figures
    heals = figures["heals"]
    assert {(h["target"], h["producer"]) for h in heals} == {
        (t, p) for t in ("redis", "gearman") for p in ("fanout", "STOMP")}
    for heal in heals:
        assert heal["resumed_after_s"] is not None, heal
        assert heal["resumed_after_s"] < RESUMES_WITHIN, heal
        # "all_answered_after_s" (every attempt in the second after the heal
        # answered) is printed, not asserted: beside another suite one such
        # attempt once failed (its fresh connection; the note of 12-04).
