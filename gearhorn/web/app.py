"""``gearhorn web``: one gevent WSGI server for metrics, health and the console.

Why it is shaped so: docs/design/notes.rst, "gearhorn/web/app.py".
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from importlib import resources
from urllib.parse import parse_qs

import gevent
import gevent.event
from gevent.pywsgi import WSGIServer
from prometheus_client import CollectorRegistry, make_wsgi_app

from gearhorn import gearman
from gearhorn.config import Config
from gearhorn.errors import BadRequest
from gearhorn.rules import auth
from gearhorn.rules.messages import PresenceQuery, validate_queue, validate_topic
from gearhorn.rules.naming import dead_letter_queue
from gearhorn.runtime.background import Fault
from gearhorn.runtime.ports import WEB_PORT, listen
from gearhorn.store import deadletters, fsync, redisconn
from gearhorn.store.keys import Keys
from gearhorn.store.presence import Presence
from gearhorn.store.redisconn import REDIS_ERRORS
from gearhorn.store.registry import Registry
from gearhorn.web import access
from gearhorn.web.history import RateHistory
from gearhorn.web.metrics import SnapshotCollector
from gearhorn.web.snapshot import Collector

log = logging.getLogger(__name__)

REFRESH_SECONDS = 1.0
# Nobody watching the console: the rate history still fills, at this pace.
UNWATCHED_SECONDS = 10.0
STATIC = {"console.html": "text/html; charset=utf-8",
          "console.js": "text/javascript; charset=utf-8",
          "console.css": "text/css; charset=utf-8",
          "favicon.svg": "image/svg+xml"}
ACTION_HEADER = "HTTP_X_REQUESTED_WITH"
PRESENCE_PAGE = 200  # subscribers a topic's presence lists in the console
MAX_BODY = 64 * 1024

Start = Callable[[str, list[tuple[str, str]]], object]


class HttpError(Exception):
    def __init__(self, status: str, reason: str, headers: list[tuple[str, str]] = ()) -> None:
        super().__init__(reason)
        self.status = status
        self.headers = list(headers)


class Console:
    """Samples the snapshot every second and tells every watcher."""

    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self.history = RateHistory()
        self.latest: dict | None = None
        self._changed = gevent.event.Event()
        self._watchers = 0
        self._arrived = gevent.event.Event()  # a watcher came: sample at once

    def sample(self) -> dict:
        snap = self.collector.collect()
        self.history.add(snap["at"], {t["topic"]: t["copies"] for t in snap.get("topics", [])})
        snap["rates"] = {t["topic"]: (r[-1][1] if (r := self.history.rates(t["topic"])) else 0.0)
                         for t in snap.get("topics", [])}
        self.latest = snap
        changed, self._changed = self._changed, gevent.event.Event()
        changed.set()
        return snap

    def fresh(self) -> dict:
        """The latest snapshot if under a second old, else a new one (scrapes
        and the console share the work)."""
        latest = self.latest
        if latest is not None and time.time() - latest["at"] < REFRESH_SECONDS:
            return latest
        return self.sample()

    def run(self) -> None:
        """Sample every second while someone watches, or less often when a
        sample is slow (100,000 queues: bench/metrics.py), so sampling takes
        at most a quarter of the time; every 10 s while nobody does (a tenth
        of the time at most): a sample reads gearmand's whole status, and
        an unwatched console took 16% of a core at 100,000 queues. Scrapes
        sample on demand (:meth:`fresh`)."""
        fault = Fault(log, "console sample")
        while True:
            started = time.monotonic()
            try:
                self.sample()
                fault.succeeded()
            except Exception as exc:  # a bad sample must not end the console
                fault.failed(exc)
            took = time.monotonic() - started
            self._arrived.clear()
            if self._watchers:
                gevent.sleep(max(REFRESH_SECONDS, 3 * took))
            else:
                self._arrived.wait(max(UNWATCHED_SECONDS, 9 * took))

    def events(self) -> Iterator[bytes]:
        """Server-Sent Events: the history once, then every new snapshot."""
        self._watchers += 1
        self._arrived.set()
        try:
            snap = self.fresh()
            topics = [t["topic"] for t in snap.get("topics", [])]
            yield _event("history", self.history.all_rates(topics))
            yield _event("snapshot", snap)
            while True:
                if self._changed.wait(15):
                    yield _event("snapshot", self.latest)
                else:
                    yield b": keep-alive\n\n"
        finally:
            self._watchers -= 1


def _event(name: str, data: object) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class WebApp:
    def __init__(self, config: Config, registry: Registry,
                 credentials: auth.Credentials) -> None:
        self.config = config
        self.credentials = credentials
        self.collector = Collector(registry, config.gearman_servers, config.metrics_top,
                                   config.gearman_tls)
        self.console = Console(self.collector)
        self.index, self.mover = deadletters.for_config(config, registry.redis)
        self.presence = Presence(registry)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(SnapshotCollector(self.console.fresh))
        self.metrics = make_wsgi_app(registry)

    def __call__(self, environ: dict, start: Start) -> Iterator[bytes]:
        path, method = environ.get("PATH_INFO", "/"), environ["REQUEST_METHOD"]
        try:
            if path == "/metrics":
                return self.metrics(environ, start)
            return self._route(path, method, environ, start)
        except HttpError as exc:
            return _json(start, exc.status, {"error": str(exc)}, exc.headers)

    def _route(self, path: str, method: str, environ: dict, start: Start) -> Iterator[bytes]:
        if path == "/healthz":
            return _json(start, "200 OK", {"status": "alive", "pid": os.getpid()})
        if path == "/readyz":
            ready = self.collector.readiness()
            return _json(start, "200 OK" if ready["ready"] else "503 Service Unavailable", ready)
        if path.startswith("/static/"):
            return _static(start, path.removeprefix("/static/"))
        who = self._principal(environ)
        if method == "POST" and path in ("/api/dlq/requeue", "/api/dlq/purge"):
            return self._act(path.rsplit("/", 1)[1], who, environ, start)
        if method != "GET":
            raise HttpError("405 Method Not Allowed", f"{method} {path} is not served")
        if path in ("/", "/index.html"):
            return _static(start, "console.html")
        if path == "/api/whoami":
            return _json(start, "200 OK", {"name": who.name, "admin": who.admin})
        if path == "/api/overview":
            return _json(start, "200 OK", self.console.fresh())
        if path == "/api/events":
            start("200 OK", [("Content-Type", "text/event-stream"),
                             ("Cache-Control", "no-cache"), ("X-Accel-Buffering", "no")])
            return self.console.events()
        query = parse_qs(environ.get("QUERY_STRING", ""))
        if path == "/api/dlq":
            return _json(start, "200 OK", self._dead_letters(_queue(query.get("queue", [""])[0])))
        if path == "/api/presence":
            return _json(start, "200 OK", self._presence(query.get("topic", [""])[0]))
        raise HttpError("404 Not Found", f"nothing at {path}")

    def _principal(self, environ: dict) -> auth.Principal:
        # A passcode check is ~0.05 s of CPU: in a thread, as the bridge does,
        # so that a guesser does not hold up the console and the scrapes.
        who = gevent.get_hub().threadpool.apply(
            access.principal, (self.credentials, environ.get("HTTP_AUTHORIZATION")))
        if who is None:
            raise HttpError("401 Unauthorized", "log in with a user of the bridge's "
                            "credentials file", [("WWW-Authenticate", access.REALM)])
        return who

    def _dead_letters(self, queue: str) -> dict:
        try:
            queued = deadletters.queued(self.config.gearman_servers, dead_letter_queue(queue),
                                        self.config.gearman_tls)
            letters = [d.to_dict() for d in self.index.list(queue)]
        except (*REDIS_ERRORS, OSError) as exc:
            raise HttpError("503 Service Unavailable", f"{type(exc).__name__}: {exc}") from None
        return {"queue": queue, "queued": queued, "letters": letters}

    def _presence(self, topic: str) -> dict:
        """Who is subscribed to ``topic`` (the first PRESENCE_PAGE of them)."""
        try:
            return self.presence.of(PresenceQuery(validate_topic(topic, allow_prefix=True),
                                                  PRESENCE_PAGE))
        except BadRequest as exc:
            raise HttpError("400 Bad Request", str(exc)) from None
        except REDIS_ERRORS as exc:
            raise HttpError("503 Service Unavailable", f"{type(exc).__name__}: {exc}") from None

    def _act(self, action: str, who: auth.Principal, environ: dict,
             start: Start) -> Iterator[bytes]:
        if environ.get(ACTION_HEADER) != "gearhorn":
            raise HttpError("403 Forbidden", "actions need the header X-Requested-With: gearhorn")
        if not who.admin:
            raise HttpError("403 Forbidden", f"{who.name} may look but not act (admin = true "
                            "in the credentials file allows it)")
        request = _read_json(environ)
        queue = _queue(request.get("queue"))
        count = request.get("count")
        if count is not None and (not isinstance(count, int) or isinstance(count, bool)
                                  or count < 1):
            raise HttpError("400 Bad Request", "count must be a positive integer")
        try:
            moved = (self.mover.requeue(queue, count) if action == "requeue"
                     else self.mover.purge(queue))
        except (gearman.GearmanError, *REDIS_ERRORS, OSError, *fsync.ERRORS) as exc:
            raise HttpError("503 Service Unavailable", f"{type(exc).__name__}: {exc}") from None
        log.info("%s: %s %d dead letters of %s", who.name, action, moved, queue)
        return _json(start, "200 OK", {"queue": queue, "action": action, "moved": moved})


def _queue(value: object) -> str:
    if not isinstance(value, str):
        raise HttpError("400 Bad Request", "queue must be a string")
    try:
        validate_queue(value)
    except BadRequest as exc:
        raise HttpError("400 Bad Request", str(exc)) from None
    return value


def _read_json(environ: dict) -> dict:
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        length = -1
    if not 0 < length <= MAX_BODY:
        raise HttpError("400 Bad Request", f"a JSON body of at most {MAX_BODY} bytes is needed")
    try:
        body = json.loads(environ["wsgi.input"].read(length))
    except ValueError as exc:
        raise HttpError("400 Bad Request", f"body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise HttpError("400 Bad Request", "body must be a JSON object")
    return body


def _json(start: Start, status: str, body: object,
          headers: list[tuple[str, str]] = ()) -> list[bytes]:
    data = json.dumps(body, separators=(",", ":")).encode()
    start(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data))),
                   ("Cache-Control", "no-store"), *headers])
    return [data]


def _static(start: Start, name: str) -> list[bytes]:
    if name not in STATIC:
        raise HttpError("404 Not Found", f"no file {name}")
    data = resources.files("gearhorn.web").joinpath(f"static/{name}").read_bytes()
    start("200 OK", [("Content-Type", STATIC[name]), ("Content-Length", str(len(data))),
                     ("X-Content-Type-Options", "nosniff"),
                     ("Content-Security-Policy", "default-src 'self'; style-src 'self'")])
    return [data]


def build_app(config: Config) -> WebApp:
    credentials = (auth.load(config.stomp_credentials_file) if config.stomp_credentials_file
                   else auth.Credentials.open())
    """The console's composition root: one Redis client and one registry."""
    client = redisconn.for_config(config, socket_timeout=5, socket_connect_timeout=2)
    return WebApp(config, Registry(client, Keys.for_config(config)), credentials)


def run_web(config: Config) -> int:
    """Serve until SIGTERM or SIGINT."""
    app = build_app(config)
    server = WSGIServer(listen(config.web_host, config.web_port, WEB_PORT), app, log=None)
    server.start()
    gevent.spawn(app.console.run)
    log.info("gearhorn web on http://%s:%d/ (metrics at /metrics)", config.web_host,
             server.server_port)
    stop = gevent.event.Event()
    gevent.signal_handler(signal.SIGTERM, stop.set)
    gevent.signal_handler(signal.SIGINT, stop.set)
    stop.wait()
    server.stop(timeout=2)
    return 0
