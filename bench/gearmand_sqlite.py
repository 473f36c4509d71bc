"""What gearmand's sqlite persistent queue costs: background jobs per second
into gearmand with the queue file on disk, on tmpfs, and with no persistent
queue, in one run.

    python bench/gearmand_sqlite.py             # 20,000 jobs each
    python bench/gearmand_sqlite.py --jobs 2000

Starts gearmand on free loopback ports (stopped at the end) and submits
uniquely keyed background jobs in pipelined batches of 1,000 (as gearhorn's
workers do), then reads them back out (each completion deletes a row).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from gearhorn import gearman  # noqa: E402
from gearhorn.supervision import servers


def measure(jobs: int, data_dir: str, sqlite: bool) -> tuple[float, float]:
    gm = servers.start_gearmand(data_dir=data_dir, queue="sqlite" if sqlite else "none")
    try:
        client = gearman.Client([(gm.host, gm.port)])
        start = time.perf_counter()
        client.submit_background([gearman.Copy("bench", f"u{i}", b"x" * 50)
                                  for i in range(jobs)])
        submit = jobs / (time.perf_counter() - start)
        client.close()
        worker = gearman.WorkerConnection(gm.host, gm.port, ["bench"])
        worker.open()
        start, done = time.perf_counter(), 0
        while done < jobs:
            for job in worker.grab(100):
                worker.complete(job.handle)
                done += 1
        worker.flush()
        drain = jobs / (time.perf_counter() - start)
        worker.close()
        return submit, drain
    finally:
        gm.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    args = parser.parse_args()
    places = [("no persistent queue", tempfile.gettempdir(), False),
              ("sqlite on disk", os.path.expanduser("~"), True)]
    if os.path.isdir("/dev/shm"):
        places.append(("sqlite on tmpfs", "/dev/shm", True))
    print(f"{args.jobs:,} background jobs, batches of 1,000")
    for name, root, sqlite in places:
        folder = tempfile.mkdtemp(prefix="gearhorn-bench-", dir=root)
        try:
            submit, drain = measure(args.jobs, folder, sqlite)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        print(f"  {name:22} submit {submit:>9,.0f} jobs/s   take+complete {drain:>9,.0f} jobs/s",
              flush=True)


if __name__ == "__main__":
    main()
