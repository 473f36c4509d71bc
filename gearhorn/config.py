"""One typed configuration object.

Sources, lowest precedence first: built-in defaults, the config file
(``--config`` / ``GEARHORN_CONFIG``, INI section ``[gearhorn]``), ``GEARHORN_*``
environment variables, command-line flags. This is the only module that
reads the environment.
"""

from __future__ import annotations

import configparser
import dataclasses
import functools
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

from gearhorn.errors import GearhornError
from gearhorn.rules.historypolicy import HistoryPolicy, HistoryPolicyError
from gearhorn.rules.limits import OVERFLOWS
from gearhorn.rules.messages import DEFAULT_MAX_PAYLOAD

if TYPE_CHECKING:
    from gearhorn.gearman import TlsFiles

log = logging.getLogger(__name__)

ENV_PREFIX = "GEARHORN_"
# Environment names that are not simply GEARHORN_<FIELD>.
_ENV_ALIASES = {"gearman_servers": "GEARHORN_GEARMAN"}


PERSISTENCE = ("auto", "redis", "sqlite", "none")
# Settings of earlier versions, ignored with a warning (an upgrade starts).
RETIRED = {
    "queue_redis_url": "gearhorn holds its copies in the registry's Redis and no longer "
                       "waits for gearmand's queue Redis (docs/design/gearmand.rst, \"What went\")",
    "pin_queue": "gearhorn up no longer starts a Redis for gearmand's queue",
}
COPIES = ("gearmand", "held")
UP_STORE_BOUND = 1024 * 1024 * 1024  # gearhorn up's queue_maxmemory when it is 0
DURABILITY = ("auto", "fsync", "written")
REDIS_CLUSTER_MODES = ("auto", "yes", "no")


class ConfigError(GearhornError, ValueError):
    exit_code = 2
    """A setting that cannot be used; the message names the setting and source."""


Server = tuple[str, int]


@dataclass(frozen=True)
class Config:
    """Every setting gearhorn has, with its default."""

    gearman_servers: tuple[Server, ...] = (("127.0.0.1", 4730),)
    # TLS to the Gearman servers (gear.Server, or a gearmand built with TLS;
    # Debian's is not): PEM files, all three or none (docs/security.rst).
    gearman_tls_ca: str = ""
    gearman_tls_cert: str = ""
    gearman_tls_key: str = ""
    redis_url: str = "redis://127.0.0.1:6379/0"
    # "auto": ask the node (INFO cluster) and use the Redis Cluster client when
    # it says cluster_enabled:1; "yes" or "no" forces it (gearhorn/store/redisconn.py).
    redis_cluster: str = "auto"
    key_prefix: str = "gearhorn:"
    matchmaking_channel: str = "__matchmaking"
    processes: int = field(default_factory=lambda: os.cpu_count() or 1)
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD
    fanout_timeout: float = 30.0
    submit_batch: int = 1000
    # Jobs a worker takes from a gearmand in one round trip when a backlog
    # waits (one at a time otherwise); plain fanouts among them share one
    # subscriber look-up (all their topics in one round trip) and one write
    # of their copies.
    worker_batch: int = 128
    heartbeat_interval: float = 2.0
    # A worker silent for this long is dead: it leaves the live set.
    worker_ttl: float = 6.0
    cache_size: int = 10_000
    log_level: str = "INFO"
    # Used by `gearhorn up`: where the Redis and gearmand it starts keep data.
    data_dir: str = ".gearhorn"
    # How gearmand keeps the jobs submitted straight to it (gearman -b), and
    # with copies = gearmand the copies too: "sqlite", "none" (memory only),
    # "redis" (a gearmand of yours run with -q redis: said at start, nothing
    # waited for), or "auto": `gearhorn up` starts its gearmand on sqlite, and
    # a worker or bridge beside a gearmand of yours assumes nothing of it.
    # docs/operations.rst, "Beside your gearmand".
    persistence: str = "auto"
    # Who keeps a fanout's background copies until their receivers take them:
    # "held" (gearhorn, in the registry's Redis; gearmand gets each as a
    # foreground job held open and only dispatches it, so any gearmand
    # crash loses none: docs/design/gearmand.rst, "Held copies") or "gearmand" (its
    # queue, as persistence says: only as safe as that queue).
    copies: str = "held"
    # What an acknowledgement (a fanout's result, a STOMP RECEIPT) promises:
    # "fsync": it comes after an fsync of every Redis holding what it
    # acknowledges (the fsync barrier, gearhorn/store/fsync.py; a power cut
    # loses nothing acknowledged), and a Redis no syncer serves stops the
    # start; "written": once Redis has written it (a kill -9 loses nothing,
    # a power cut the last second); "auto": fsync for each Redis a syncer
    # serves (or with appendfsync always), written for the others, as each
    # Redis is set up (the start-up line and gearhorn status say which).
    durability: str = "auto"
    # Seconds an acknowledgement waits for an fsync barrier that became
    # unavailable (its syncer or Redis gone) before the operation fails with
    # the reason; a slow disk that is still syncing is waited for.
    barrier_timeout: float = 5.0
    # Replicas of the registry's Redis that must hold a write before it is
    # acknowledged (WAITAOF, or WAIT before Redis 7.2), so a node lost with
    # its disk loses nothing acknowledged; 0: none waited for. One wait per
    # group commit, of at most replica_timeout seconds; too few refuse the
    # acknowledgement, retried for barrier_timeout (docs/reliability.rst).
    min_replicas: int = 0
    replica_timeout: float = 1.0
    # The STOMP bridge.
    bridge_host: str = "127.0.0.1"
    bridge_port: int = 61613
    # STOMP over WebSocket at ws://bridge_host:bridge_ws_port/ws (browsers); 0: off.
    bridge_ws_port: int = 15674
    # Bridge processes on the same ports (SO_REUSEPORT; the kernel spreads
    # connections): one per core uses every core.
    bridge_processes: int = 1
    # Bind with SO_REUSEPORT, so that several bridges share the ports.
    bridge_reuse_port: bool = False
    stomp_max_frame_bytes: int = DEFAULT_MAX_PAYLOAD + 64 * 1024
    stomp_max_headers: int = 64
    stomp_max_header_length: int = 8192
    stomp_max_connections: int = 10_000
    stomp_max_subscriptions: int = 100
    stomp_heartbeat_ms: int = 10_000
    stomp_connect_timeout: float = 10.0
    # Seconds a client has to finish a frame it started (slow senders are cut off).
    stomp_frame_timeout: float = 30.0
    stomp_max_backlog_bytes: int = 1024 * 1024
    stomp_tls_cert: str = ""
    stomp_tls_key: str = ""
    # Users, hashed passcodes and per-destination rights (gearhorn/rules/auth.py);
    # empty: anyone may connect and do anything.
    stomp_credentials_file: str = ""
    # Deliveries of a STOMP queue message before it is dead-lettered.
    max_deliveries: int = 5
    # Tries of a foreground fanout's copy whose receiver failed (WORK_FAIL,
    # WORK_EXCEPTION): 1 reports the failure at once, as any Gearman client
    # sees it; a fanout may ask for more ("attempts"), retried with backoff.
    fanout_attempts: int = 1
    retry_backoff: float = 0.2
    # Bytes of receivers' answers a foreground fanout with "gather": true
    # returns at most; answers beyond it are listed without their data.
    gather_max_bytes: int = 1024 * 1024
    # Seconds a message's headers are kept for its consumers (gearhorn/store/headers.py).
    headers_ttl: float = 7 * 86_400.0
    # Delayed delivery (gearhorn/store/delayed.py): shard width, the longest
    # a worker sleeps between looks for due messages (it wakes at the first due
    # time it knows of, and when told of an earlier one; half a shard at most),
    # and how long one may take to send them.
    delay_shard_seconds: float = 10.0
    delay_poll_interval: float = 5.0
    delay_lease: float = 60.0
    # Lanes delayed messages are spread over (hash slots on a cluster). Width
    # and lanes are recorded by the first process to use the store, and
    # that is what every process uses (gearhorn/store/delaylayout.py).
    delay_lanes: int = 8
    # Seconds the bridge waits for the answer to a request with reply-to.
    request_timeout: float = 60.0
    # Seconds a fanout's dedup_id (STOMP: x-deduplication-header) is
    # remembered: the same id on the same topic again is answered as a
    # duplicate, with no copies (gearhorn/store/dedup.py). 0: off.
    dedup_window: float = 120.0
    # Topic history (gearhorn/store/history.py): each topic's last messages,
    # about history_size of them (0: off), kept history_ttl seconds after the
    # topic's last message; topic_history and gearhorn history read them.
    history_size: int = 0
    history_ttl: float = 3600.0
    # Per topic or prefix: "chat.*=1000/600,news=50" (PATTERN=SIZE[/TTL];
    # the longest pattern that matches wins; gearhorn/rules/historypolicy.py).
    history_topics: str = ""
    # Real-time topics (docs/design/index.rst "Real-time by default"): a topic with
    # no history above keeps its last realtime_history_size messages, none
    # older than realtime_history_ttl seconds, while it has STOMP stream
    # readers (a plain, non-durable SUBSCRIBE is one: served by the bridge,
    # no gearmand queue of its own), and realtime_history_ttl seconds after
    # the last one left, so a reader resumes from its last offset; a reader
    # falls behind by as much before it is told it lost some. 0: off (a
    # plain subscriber gets a gearmand queue of its own).
    realtime_history_size: int = 10_000
    realtime_history_ttl: float = 300.0
    # Presence events (gearhorn/store/presenceevents.py): every subscription made or
    # removed is broadcast as JSON on the topic <presence_topic_prefix><topic>.
    presence_events: bool = False
    presence_topic_prefix: str = "gearhorn.presence."
    # Metrics (gearhorn/store/stats.py): counters in Redis, written with each fanout.
    metrics_enabled: bool = True
    # Workers sum their counts and write them every 0.1 s (one round trip).
    # True: with each fanout, before it is answered: exact through kill -9,
    # and about 35% fewer fanouts/s to few subscribers (bench/metrics.py).
    metrics_write_through: bool = False
    # Labels per metric (topics, queues): the top N by copies, depth, count.
    metrics_top: int = 100
    # gearhorn web: /metrics, /healthz, /readyz and the console (docs/operations.rst).
    web_host: str = "127.0.0.1"
    web_port: int = 15672
    # Every subscriber queue's limits unless its subscription says otherwise
    # (gearhorn/rules/limits.py, docs/reliability.rst "Bounded queues"): copies and
    # payload bytes queued at most (0: no limit), seconds a copy may wait and
    # seconds a subscription may go without a consumer (0: forever), what
    # happens at the limit (drop-head or reject-publish), and whether
    # dropped and expired copies go to <queue>.dlq.
    queue_max_length: int = 10_000
    queue_max_bytes: int = 16 * 1024 * 1024
    queue_message_ttl: float = 0.0
    queue_expires: float = 0.0
    queue_overflow: str = "drop-head"
    queue_dead_letter: bool = False
    # Seconds between the warden's rounds (gearhorn/worker/warden.py); 0 turns
    # bounded queues off (no tally, no warden, no guard: queues grow unbounded).
    retention_interval: float = 1.0
    # The memory the registry's Redis, which holds the copies, may use
    # (bytes; its own maxmemory, where set, counts instead): above
    # queue_store_guard of it fanouts are refused with the reason until there
    # is room again. 0 (the default): that Redis's own maxmemory alone, as a
    # Redis of yours may hold much else; gearhorn up bounds the Redis it
    # starts at UP_STORE_BOUND. No maxmemory is set on it: a full Redis would
    # refuse heartbeats and subscriptions too.
    queue_maxmemory: int = 0
    queue_store_guard: float = 0.9
    # The delivery ledger (a Redis Stream; gearhorn ledger export reads it).
    ledger_enabled: bool = True
    ledger_maxlen: int = 1_000_000
    # Streams the ledger is spread over (one per writer; hash slots on a cluster).
    ledger_shards: int = 8
    # The live audit (gearhorn audit; gearhorn up runs it): a copy nothing
    # delivered, answered or dropped within audit_deadline seconds of its
    # enqueue, while its subscriber took others, is a finding. Events may
    # reach the ledger audit_lateness seconds late (a writer's flush, clocks
    # of two hosts); the ledger is read every audit_interval seconds.
    audit_enabled: bool = True  # gearhorn up starts the audit (gearhorn up --no-audit: not)
    audit_deadline: float = 60.0
    audit_lateness: float = 5.0
    audit_interval: float = 2.0

    def replace(self, **changes: object) -> Config:
        return dataclasses.replace(self, **changes)

    @property
    def history_policy(self) -> HistoryPolicy:
        return _history_policy(self.history_topics, self.history_size, self.history_ttl,
                               self.realtime_history_size, self.realtime_history_ttl)

    @property
    def gearman_tls(self) -> TlsFiles | None:
        """The files for TLS to the Gearman servers; None for plain TCP.
        Passed to every Gearman connection gearhorn opens."""
        return _tls_files(self.gearman_tls_ca, self.gearman_tls_cert, self.gearman_tls_key)


@functools.cache
def _history_policy(topics: str, size: int, ttl: float, realtime_size: int,
                    realtime_ttl: float) -> HistoryPolicy:
    return HistoryPolicy.parse(topics, size, ttl, (realtime_size, realtime_ttl))


@functools.cache
def _tls_files(ca: str, cert: str, key: str) -> TlsFiles | None:
    """One TlsFiles per set of files, so its SSL context is loaded once, not
    for every request or queue that opens a connection."""
    # Imported here: the config is read before anything talks Gearman
    # (``gearhorn passwd`` never does), and gear is slow to import.
    from gearhorn.gearman import TlsFiles

    return TlsFiles.from_settings(ca, cert, key)


def to_env(config: Config) -> dict[str, str]:
    """``GEARHORN_*`` variables that make a child process load ``config`` exactly."""
    env = {}
    for f in fields(Config):
        value = getattr(config, f.name)
        if f.name == "gearman_servers":
            value = ",".join(f"{host}:{port}" for host, port in value)
        env[_ENV_ALIASES.get(f.name, ENV_PREFIX + f.name.upper())] = str(value)
    return env


def parse_server(text: str) -> Server:
    """``"host:port"`` or ``"host"`` (port 4730) -> ``(host, port)``."""
    text = text.strip()
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = text, "4730"
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"invalid gearman server {text!r}: expected HOST:PORT")
    return host, int(port)


def parse_servers(text: str) -> tuple[Server, ...]:
    servers = tuple(parse_server(part) for part in text.split(",") if part.strip())
    if not servers:
        raise ConfigError("no gearman server given")
    return servers


def _convert(name: str, raw: str, source: str) -> object:
    kind = {f.name: f.type for f in fields(Config)}[name]
    try:
        if name == "gearman_servers":
            return parse_servers(raw)
        if kind == "bool":
            return _boolean(raw)
        if kind == "int":
            value = int(raw)
        elif kind == "float":
            value = float(raw)
        else:
            return raw
    except ValueError as exc:
        raise ConfigError(f"{source}: {name}={raw!r}: {exc}") from None
    if value < 0 or (value == 0 and name not in _ZERO_MEANS_OFF):
        raise ConfigError(f"{source}: {name} must be positive, got {raw!r}")
    return value


# Settings where 0 turns something off.
_ZERO_MEANS_OFF = frozenset({"bridge_ws_port", "web_port", "queue_max_length",
                             "queue_max_bytes", "queue_message_ttl", "queue_expires",
                             "queue_maxmemory", "retention_interval", "dedup_window",
                             "history_size", "realtime_history_size", "min_replicas"})


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _boolean(raw: str) -> bool:
    word = raw.strip().lower()
    if word not in _TRUE | _FALSE:
        raise ValueError(f"expected true or false, got {raw!r}")
    return word in _TRUE


def _from_file(path: str) -> dict[str, object]:
    parser = configparser.ConfigParser()
    try:
        with open(path, encoding="utf-8") as fp:
            parser.read_file(fp)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except configparser.Error as exc:
        raise ConfigError(f"config file {path}: {exc}") from None
    if not parser.has_section("gearhorn"):
        return {}
    known = {f.name for f in fields(Config)}
    values = {}
    for key, raw in parser.items("gearhorn"):
        if key in RETIRED:
            log.warning("config file %s: %s is no longer used: %s", path, key, RETIRED[key])
            continue
        if key not in known:
            raise ConfigError(f"config file {path}: unknown setting {key!r}")
        values[key] = _convert(key, raw, f"config file {path}")
    return values


def _from_env(env: Mapping[str, str]) -> dict[str, object]:
    for name, why in RETIRED.items():
        if env.get(ENV_PREFIX + name.upper()):
            log.warning("%s%s is no longer used: %s", ENV_PREFIX, name.upper(), why)
    values = {}
    for f in fields(Config):
        name = _ENV_ALIASES.get(f.name, ENV_PREFIX + f.name.upper())
        if env.get(name):
            values[f.name] = _convert(f.name, env[name], f"environment {name}")
    return values


def load(
    flags: Mapping[str, object] | None = None,
    config_file: str | None = None,
    env: Mapping[str, str] | None = None,
) -> Config:
    """Build the Config: defaults < file < environment < flags.

    ``flags`` holds already-typed values from the command line; ``None``
    values mean "not given". The file is ``config_file`` or ``GEARHORN_CONFIG``.
    """
    env = os.environ if env is None else env
    path = config_file or env.get(ENV_PREFIX + "CONFIG")
    values: dict[str, object] = _from_file(path) if path else {}
    values.update(_from_env(env))
    values.update({k: v for k, v in (flags or {}).items() if v is not None})
    config = Config(**values)
    if config.persistence not in PERSISTENCE:
        raise ConfigError(f"persistence must be one of {', '.join(PERSISTENCE)}, "
                          f"got {config.persistence!r}")
    if config.copies not in COPIES:
        raise ConfigError(f"copies must be one of {', '.join(COPIES)}, got {config.copies!r}")
    if config.durability not in DURABILITY:
        raise ConfigError(f"durability must be one of {', '.join(DURABILITY)}, "
                          f"got {config.durability!r}")
    if config.min_replicas < 0:
        raise ConfigError(f"min_replicas must be 0 or more, got {config.min_replicas}")
    if config.replica_timeout <= 0:
        raise ConfigError(f"replica_timeout must be above 0 seconds, got "
                          f"{config.replica_timeout}")
    if config.barrier_timeout <= 0:
        raise ConfigError(f"barrier_timeout must be above 0 seconds, got "
                          f"{config.barrier_timeout}")
    if config.redis_cluster not in REDIS_CLUSTER_MODES:
        raise ConfigError(f"redis_cluster must be one of {', '.join(REDIS_CLUSTER_MODES)}, "
                          f"got {config.redis_cluster!r}")
    if "{" in config.key_prefix or "}" in config.key_prefix:
        raise ConfigError(f"key_prefix may not contain {{ or }} (they choose Redis Cluster "
                          f"hash slots), got {config.key_prefix!r}")
    if config.queue_overflow not in OVERFLOWS:
        raise ConfigError(f"queue_overflow must be one of {', '.join(OVERFLOWS)}, "
                          f"got {config.queue_overflow!r}")
    if not 0 < config.queue_store_guard <= 1:
        raise ConfigError(f"queue_store_guard is a fraction of the copies' Redis's maxmemory, "
                          f"above 0 and at most 1, got {config.queue_store_guard}")
    if not re.fullmatch(r"[!-)+-~]{1,64}", config.presence_topic_prefix):
        raise ConfigError(f"presence_topic_prefix must be 1 to 64 printable characters "
                          f"without whitespace or '*', got {config.presence_topic_prefix!r}")
    try:
        config.history_policy  # noqa: B018 (parsed here so a bad item stops the start)
    except HistoryPolicyError as exc:
        raise ConfigError(f"history_topics: {exc}") from None
    if not 1 <= config.bridge_processes <= 256:
        raise ConfigError(f"bridge_processes must be 1 to 256, got {config.bridge_processes}")
    tls = [config.gearman_tls_ca, config.gearman_tls_cert, config.gearman_tls_key]
    if any(tls) and not all(tls):
        raise ConfigError("gearman_tls_ca, gearman_tls_cert and gearman_tls_key go together: "
                          "set all three or none")
    return config
