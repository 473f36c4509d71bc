"""A real Spark standalone cluster for tests: a master and a worker started
from the installed pyspark (``spark-class``) on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

from gearhorn.runtime.children import die_with_parent
from gearhorn.supervision import servers
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


def spark_class():
    pyspark = require_module("pyspark")
    return os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")


class SparkCluster:
    """A standalone master and one worker (1 core, 1 GiB) on 127.0.0.1."""

    def __init__(self, log_dir):
        """Starts both and returns at once (the worker retries until the
        master listens); :meth:`wait_ready` waits for them."""
        self.port, self.ui_port = servers.free_port(), servers.free_port()
        self.env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
        launcher = spark_class()
        self.processes = [
            self._start(log_dir, "master", [
                launcher, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                "--port", str(self.port), "--webui-port", str(self.ui_port)]),
            self._start(log_dir, "worker", [
                launcher, "org.apache.spark.deploy.worker.Worker", self.url, "--host",
                "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port",
                str(servers.free_port())])]

    def wait_ready(self):
        wait_for(lambda: self._read_state().get("aliveworkers") == 1, timeout=120,
                 message="a Spark master with its worker")
        return self

    def _start(self, log_dir, name, argv):
        with open(os.path.join(log_dir, f"spark-{name}.log"), "ab") as log:
            return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                    preexec_fn=die_with_parent)

    @property
    def url(self):
        return f"spark://127.0.0.1:{self.port}"

    def state(self):
        """The master's own view (its web UI's /json/)."""
        return wait_for(self._read_state, timeout=60, message="the Spark master's /json/")

    def _read_state(self):
        """The master's view, or {} while it cannot give it: not listening
        yet, or (seen in CI) its UI answering /json with the HTML page of
        its status while it starts."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/",
                                        timeout=10) as response:
                return json.loads(response.read())
        except (OSError, ValueError):
            return {}

    def stop(self):
        for process in reversed(self.processes):
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


