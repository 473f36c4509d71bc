"""gearmand ingest rate as its queue grows, default vs. large job hash tables.

    python bench/gearmand_buckets.py

Pipelines 200,000 background jobs with unique keys into a fresh gearmand
twice: with its default --hashtable-buckets (991) and with 1,000,003, and
prints the rate for each 50,000 jobs. This is why gearhorn starts gearmand
with large tables and recommends them (docs/benchmarks.rst).
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from gearhorn import gearman  # noqa: E402
from gearhorn.supervision import servers

JOBS, STEP, WIDTH = 200_000, 50_000, 1000


def measure(buckets: int) -> list[float]:
    gm = servers.start_gearmand(hash_buckets=buckets)
    client = gearman.Client([(gm.host, gm.port)])
    rates, last = [], time.perf_counter()
    try:
        for batch in range(JOBS // 1000):
            client.submit_background([gearman.Copy(f"q_c{i % WIDTH}", f"m{batch}:c{i}", b"x")
                                      for i in range(1000)])
            if (batch + 1) * 1000 % STEP == 0:
                now = time.perf_counter()
                rates.append(STEP / (now - last))
                last = now
    finally:
        client.close()
        gm.stop()
    return rates


def main() -> None:
    results = {buckets: measure(buckets) for buckets in (991, servers.GEARMAND_HASH_BUCKETS)}
    print(f"{'jobs queued':>12} " + " ".join(f"{f'{b:,} buckets':>18}" for b in results))
    for i in range(JOBS // STEP):
        cells = " ".join(f"{rates[i]:>13,.0f} /s  " for rates in results.values())
        print(f"{(i + 1) * STEP:>12,} {cells}")


if __name__ == "__main__":
    main()
