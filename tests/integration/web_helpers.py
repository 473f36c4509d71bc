"""``gearhorn web`` as a child process, and reading it over HTTP."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from gearhorn import servers

from .helpers import wait_for


class WebProcess:
    def __init__(self, gearman_servers, redis_url, log_dir, env=None):
        self.port = servers.free_port()
        argv = [sys.executable, "-m", "gearhorn", "web", "--port", str(self.port),
                "--redis-url", redis_url]
        for server in gearman_servers:
            argv += ["--gearman", server.address]
        self.log_path = os.path.join(log_dir, f"web-{self.port}.log")
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                            env=dict(os.environ, **(env or {})),
                                            preexec_fn=servers.die_with_parent)
        wait_for(self._listening, timeout=30, message="gearhorn web to listen")

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def _listening(self):
        if self.process.poll() is not None:
            raise AssertionError(f"gearhorn web exited:\n{self.log()}")
        return servers.is_listening("127.0.0.1", self.port)

    def log(self):
        with open(self.log_path, errors="replace") as fp:
            return fp.read()[-5000:]

    def request(self, path, body=None, login=None, headers=None, timeout=20):
        """(status, headers, body bytes); HTTP errors are answers, not exceptions."""
        headers = dict(headers or {})
        if login is not None:
            token = base64.b64encode(f"{login[0]}:{login[1]}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers.setdefault("Content-Type", "application/json")
        request = urllib.request.Request(self.url + path, data=data, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, dict(response.headers), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    def json(self, path, **kwargs):
        status, _, body = self.request(path, **kwargs)
        return status, json.loads(body)

    def metrics(self):
        """{(sample name, labels as a sorted tuple): value}, parsed by prometheus_client."""
        status, _, body = self.request("/metrics")
        assert status == 200, body
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(body.decode())
                for s in family.samples}

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
