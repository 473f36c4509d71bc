"""A real Spark standalone cluster for tests: a master and a worker started
from the installed pyspark (``spark-class``) on loopback."""

from __future__ import annotations

import subprocess
import sys

from gearhorn.supervision import sparkcluster
from tests.needs import require_module

from .helpers import wait_for


def gearhorn_command(*args, timeout=240):
    done = subprocess.run([sys.executable, "-m", "gearhorn", *args], capture_output=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr.decode()[-3000:]


def export_ledger(redis_url, out, gearmand):
    """``gearhorn ledger export`` into ``out``: its rows."""
    import pyarrow.parquet as pq

    gearhorn_command("ledger", "export", "--out", str(out), "--redis-url", redis_url,
                     "--gearman", gearmand.address)
    return pq.read_table(str(out)).to_pylist()


def reconcile(redis_url, folder, gearmand):
    """``gearhorn ledger export``, then the report job's reconciliation and
    untracked tables (``job.reconcile``, ``T.untracked``: what ``gearhorn
    report`` writes): (kind, subscriber) of every problem, and the copies of
    each untracked (plain Gearman) subscriber that gearmand no longer held
    at the export.

    In this process, so one local Spark serves every reconciliation of a
    test worker instead of a JVM started per test (it ends with the worker:
    Spark's gateway exits when its parent does), and without the report's
    other tables. test_pipeline_e2e.py runs ``gearhorn report`` itself, on a
    standalone cluster."""
    from gearhorn.pipeline import job
    from gearhorn.pipeline import transforms as T

    ledger = str(folder / "ledger")
    export_ledger(redis_url, ledger, gearmand)
    spark = local_spark()
    events, _ = job.load_events(spark, job.Options(ledger, str(folder / "report")))
    problems = job.reconcile(events)
    untracked = T.untracked(T.copies(events), events, job.queue_snapshot(spark, ledger))
    try:
        return (sorted((row["kind"], row["subscriber"]) for row in problems.collect()),
                {row["subscriber"]: row["unaccounted"] for row in untracked.collect()})
    finally:
        problems.unpersist()


def local_spark():
    """This process's Spark, on loopback only and without its web UI."""
    from pyspark.sql import SparkSession

    from gearhorn.pipeline import job

    session = (SparkSession.builder.master("local[2]").appName("gearhorn-tests")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")  # tests' ledgers are small
               .config("spark.sql.session.timeZone", "UTC")
               # short-lived: the quick compiler only (tests/unit/test_pipeline.py)
               .config("spark.driver.extraJavaOptions",
                       job.LOCAL_JAVA_OPTIONS + " -XX:TieredStopAtLevel=1")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    return session


class SparkCluster(sparkcluster.SparkStandalone):
    """A standalone master and one worker (1 core, 1 GiB) on 127.0.0.1."""

    def __init__(self, log_dir):
        require_module("pyspark")
        super().__init__(log_dir, workers=1, cores=1, memory="1g")

    def wait_ready(self):
        wait_for(lambda: self.read_state().get("aliveworkers") == 1, timeout=120,
                 message="a Spark master with its worker")
        return self

    def state(self):
        """The master's own view (its web UI's /json/)."""
        return wait_for(self.read_state, timeout=60, message="the Spark master's /json/")
