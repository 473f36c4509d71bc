"""A Spark standalone cluster on 127.0.0.1: a master and its workers started
from the installed pyspark (``spark-class``), for the tests and benchmarks
that run ``gearhorn audit --master`` and ``gearhorn report --master`` the
way an operator with a cluster does. Each worker is given a number of
cores (``--cores``): the cluster's capacity is what they add up to."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import time
import urllib.request

from gearhorn.runtime.children import die_with_parent
from gearhorn.supervision import servers


def spark_class() -> str | None:
    """The installed pyspark's launcher, or None without pyspark."""
    found = importlib.util.find_spec("pyspark")
    if found is None or not found.submodule_search_locations:
        return None
    return os.path.join(list(found.submodule_search_locations)[0], "bin", "spark-class")


class SparkStandalone:
    """A master and ``workers`` workers of ``cores`` cores and ``memory``
    each, logging into ``log_dir``. Starts them and returns at once (the
    workers retry until the master listens); :meth:`wait_ready` waits."""

    def __init__(self, log_dir: str, workers: int = 1, cores: int = 1,
                 memory: str = "1g") -> None:
        launcher = spark_class()
        if launcher is None:
            raise RuntimeError("pyspark is not installed (tools/ensure-env --test)")
        self.workers = workers
        self.port, self.ui_port = servers.free_port(), servers.free_port()
        self.env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
        self.processes = [self._start(log_dir, "master", [
            launcher, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
            "--port", str(self.port), "--webui-port", str(self.ui_port)])]
        for n in range(workers):
            self.processes.append(self._start(log_dir, f"worker-{n}" if n else "worker", [
                launcher, "org.apache.spark.deploy.worker.Worker", self.url, "--host",
                "127.0.0.1", "--cores", str(cores), "--memory", memory, "--webui-port",
                str(servers.free_port())]))

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float = 120) -> SparkStandalone:
        """Until the master lists every worker alive."""
        deadline = time.monotonic() + timeout
        while self.read_state().get("aliveworkers") != self.workers:
            if time.monotonic() > deadline:
                raise TimeoutError(f"a Spark master with {self.workers} workers: not after "
                                   f"{timeout:g} s")
            time.sleep(0.5)  # polling the master's web UI
        return self

    def read_state(self) -> dict:
        """The master's view (its web UI's /json/), or {} while it cannot
        give it: not listening yet, or (seen in CI) its UI answering /json
        with the HTML page of its status while it starts."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/",
                                        timeout=10) as response:
                return json.loads(response.read())
        except (OSError, ValueError):
            return {}

    def _start(self, log_dir: str, name: str, argv: list[str]) -> subprocess.Popen:
        with open(os.path.join(log_dir, f"spark-{name}.log"), "ab") as log:
            return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                    preexec_fn=die_with_parent)

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.terminate()
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
