"""``gearhorn web`` as a child process, and reading it over HTTP."""

from __future__ import annotations

import base64
import json
import os
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from gearhorn.supervision import servers

from .helpers import ChildProcess


class WebProcess(ChildProcess):
    """``gearhorn web`` as a child process on a free loopback port."""

    name = "gearhorn web"

    def __init__(self, gearman_servers, redis_url, log_dir, env=None):
        self.port = servers.free_port()
        argv = ["web", "--port", str(self.port), "--redis-url", redis_url]
        for server in gearman_servers:
            argv += ["--gearman", server.address]
        super().__init__(argv, os.path.join(log_dir, f"web-{self.port}.log"), env)
        self.wait_listening(self.port)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

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

