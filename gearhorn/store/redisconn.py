"""One way to open Redis: a single server, a Redis Cluster, or Sentinel.

Every process gets its Redis client from :func:`connect`. With
``redis_cluster = auto`` it asks the node at the URL (``INFO cluster``) and
uses redis-py's cluster client when it says ``cluster_enabled:1``; ``yes``
and ``no`` force it. Both clients take the same commands: every key layout
in gearhorn/store/keys.py keeps the keys of one script or transaction in one hash
slot, so the code above never asks which it has. A ``redis+sentinel://``
URL names Sentinels and a master name instead (:func:`_sentinel_master`).
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

from gearhorn.gearman import CONNECT_TIMEOUT, keepalive_options

if TYPE_CHECKING:
    from gearhorn.config import Config

log = logging.getLogger(__name__)

AnyRedis = redis.Redis | RedisCluster

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")

# A failover takes the cluster node timeout plus an election (seconds):
# retry MOVED/ASK, CLUSTERDOWN and lost connections that long before an
# error reaches the caller, which then backs off and logs the outage once.
_CLUSTER_RETRY = Retry(ExponentialBackoff(cap=2.0, base=0.05), 8)

# Every connection notices a silent Redis within seconds (gearhorn/gearman/tcp.py).
SILENCE_WATCHED = {"socket_keepalive": True, "socket_keepalive_options": keepalive_options(),
                   "socket_connect_timeout": CONNECT_TIMEOUT}


def connect(url: str, cluster: str = "auto", *, max_connections: int | None = None,
            **options: object) -> AnyRedis:
    """A client for ``url``: the cluster client if ``cluster`` is ``"yes"``,
    or ``"auto"`` and the node is a cluster node. ``options`` go to the client
    (socket timeouts); ``max_connections`` caps its pool (per node on a
    cluster) and makes a caller wait up to 30 s for a free connection instead
    of failing (the bridge: thousands of greenlets may need Redis at once)."""
    options = {**SILENCE_WATCHED, **options}
    # One SYN per attempt: after a partition heals, the next attempt connects.
    options["socket_connect_timeout"] = min(float(options.get("socket_connect_timeout")
                                                  or CONNECT_TIMEOUT), CONNECT_TIMEOUT)
    if max_connections:
        options.update(max_connections=max_connections, timeout=30,
                       connection_pool_class=redis.BlockingConnectionPool)
    if urlsplit(url).scheme in SENTINEL_SCHEMES:
        return _sentinel_master(url, **options)
    if cluster == "yes" or (cluster == "auto" and is_cluster(url)):
        return RedisCluster.from_url(url, retry=_CLUSTER_RETRY, **options)
    pool_class = options.pop("connection_pool_class", redis.ConnectionPool)
    return redis.Redis(connection_pool=pool_class.from_url(url, **options))


def _sentinel_master(url: str, **options: object) -> redis.Redis:
    """``redis+sentinel://[:password@]host:port[,host:port...]/<master name>[/<db>]``:
    the master the Sentinels name now; after a failover the client asks them
    again and follows the new master."""
    parts = urlsplit(url)
    path = [p for p in parts.path.split("/") if p]
    if not path:
        raise ValueError(f"{safe(url)}: a Sentinel URL names the master: .../<name>[/<db>]")
    hosts = []
    for address in parts.netloc.rpartition("@")[2].split(","):
        host, _, port = address.rpartition(":")
        hosts.append((host or address, int(port) if host else 26379))
    connection = dict(options)
    if connection.pop("connection_pool_class", None) is not None:
        connection["connection_pool_class"] = BlockingSentinelPool
    if parts.password:
        connection["password"] = unquote(parts.password)
    if parts.scheme.startswith("rediss"):
        connection["ssl"] = True
    # A Sentinel answers at once: one that does not is skipped for the next
    # at once too (redis-py's default retries a silent one three times with
    # growing pauses: 9 s before the next Sentinel was asked, measured).
    sentinel = Sentinel(hosts, sentinel_kwargs={**SILENCE_WATCHED, "socket_timeout": 2.0,
                                                "retry": Retry(NoBackoff(), 0)})
    client = sentinel.master_for(path[0], db=int(path[1]) if len(path) > 1 else 0,
                                 **connection)
    MasterWatch.of(tuple(hosts), path[0], parts.password).add(client.connection_pool)
    return client


class MasterWatch:
    """Hears every Sentinel of a master name say it moved (``+switch-master``)
    and closes the connections of each pool to it at once: a command in
    flight to a master gone silent (its node lost, its cable pulled) would
    otherwise wait TCP's 10 s before it fails and the pool asks the
    Sentinels again; now it fails as the failover ends, and is tried on the
    new master (docs/reliability.rst, "Partitions"). One a process per
    master name and Sentinels, a thread per Sentinel."""

    _watches: dict[tuple, MasterWatch] = {}
    _lock = threading.Lock()

    def __init__(self, hosts: tuple[tuple[str, int], ...], name: str,
                 password: str | None) -> None:
        self.name, self.password = name, password
        self.pools: weakref.WeakSet = weakref.WeakSet()
        self.moves = 0  # failovers heard (tests)
        self.master = ""  # where the last move went: each Sentinel tells of it
        for host, port in hosts:
            threading.Thread(target=self._listen, args=(host, port), daemon=True,
                             name=f"gearhorn-sentinel-watch-{host}:{port}").start()

    @classmethod
    def of(cls, hosts: tuple[tuple[str, int], ...], name: str,
           password: str | None = None) -> MasterWatch:
        with cls._lock:
            watch = cls._watches.get((hosts, name))
            if watch is None:
                watch = cls._watches[(hosts, name)] = cls(hosts, name, password)
            return watch

    def add(self, pool: redis.ConnectionPool) -> None:
        self.pools.add(pool)

    def moved(self, to: str) -> None:
        """The master moved (to ``to``: host port): every connection to the
        old one goes now, once (every Sentinel says so: the later ones must
        not cut the connections just made to the new master)."""
        with self._lock:
            if to == self.master:
                return
            self.master = to
            self.moves += 1
        for pool in list(self.pools):
            pool.disconnect(inuse_connections=True)

    def _listen(self, host: str, port: int) -> None:
        backoff = ExponentialBackoff(cap=5.0, base=0.2)
        failures = 0
        while True:
            client = redis.Redis(host, port, socket_timeout=None, **SILENCE_WATCHED)
            try:
                pubsub = client.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe("+switch-master")
                failures = 0
                for message in pubsub.listen():
                    data = message.get("data")
                    words = (data.decode() if isinstance(data, bytes) else str(data)).split()
                    if len(words) == 5 and words[0] == self.name:  # name old-host port host port
                        if words[3:] != self.master.split():
                            log.warning("the Sentinels moved master %s from %s:%s to %s:%s",
                                        *words)
                        self.moved(" ".join(words[3:]))
            except redis.RedisError:
                failures += 1
            finally:
                client.close()
            time.sleep(backoff.compute(failures))


class BlockingSentinelPool(SentinelConnectionPool, redis.BlockingConnectionPool):
    """Sentinel's pool (connections to the master the Sentinels name), which
    waits for a free connection when full like the bridge's pool on a single
    server. redis-py's own raises "Too many connections" past 100: a burst
    of greenlets needing Redis at once would fail."""


def is_cluster(url: str) -> bool:
    """True if the node at ``url`` runs in cluster mode. A node that does not
    answer counts as a single server (logged: set redis_cluster = yes to
    start against a cluster that is down)."""
    probe = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    try:
        return bool(probe.info("cluster").get("cluster_enabled"))
    except redis.RedisError as exc:
        log.warning("cannot ask %s whether it is a Redis Cluster (%s): taking it for a "
                    "single server; set redis_cluster = yes if it is a cluster", safe(url), exc)
        return False
    finally:
        probe.close()


def is_cluster_client(client: object) -> bool:
    return isinstance(client, RedisCluster)


def for_config(config: Config, **options: object) -> AnyRedis:
    """:func:`connect` with the configured URL and cluster mode."""
    return connect(config.redis_url, config.redis_cluster, **options)


def safe(url: str) -> str:
    """The URL without its password, for logs."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{parts.path}"


# What "Redis is away" looks like: redis-py's errors, and the cluster client's
# own (a slot no node serves during a failover, no node reachable), which do
# not derive from RedisError. Every outage handler catches both.
REDIS_ERRORS: tuple[type[Exception], ...] = (redis.RedisError, RedisClusterException)
