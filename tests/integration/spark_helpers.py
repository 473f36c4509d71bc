"""A real Spark standalone cluster for tests: a master and a worker started
from the installed pyspark (``spark-class``) on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

from gearhorn import servers
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
    """``gearhorn ledger export`` and ``gearhorn report``: (kind, subscriber)
    of every problem in the reconciliation, and the copies of each untracked
    (plain Gearman) subscriber that gearmand no longer held at the export."""
    import pyarrow.parquet as pq

    ledger, out = folder / "ledger", folder / "report"
    export_ledger(redis_url, ledger, gearmand)
    gearhorn_command("report", "--ledger", str(ledger), "--out", str(out))
    table = pq.read_table(f"{out}/tables/reconciliation").to_pylist()
    untracked = pq.read_table(f"{out}/tables/untracked").to_pylist()
    return (sorted((row["kind"], row["subscriber"]) for row in table),
            {row["subscriber"]: row["unaccounted"] for row in untracked})


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
        wait_for(lambda: self.state().get("aliveworkers") == 1, timeout=120,
                 message="a Spark master with its worker")
        return self

    def _start(self, log_dir, name, argv):
        with open(os.path.join(log_dir, f"spark-{name}.log"), "ab") as log:
            return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                    preexec_fn=servers.die_with_parent)

    @property
    def url(self):
        return f"spark://127.0.0.1:{self.port}"

    def state(self):
        """The master's own view (its web UI's /json)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json",
                                        timeout=10) as response:
                return json.loads(response.read())
        except OSError:
            return {}

    def stop(self):
        for process in reversed(self.processes):
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


