"""etc/three-nodes/rejoin-redis: a node's Redis started again never as an
empty master (the known Redis trap: its replicas would copy its empty data
set over theirs). Real redis-server and Sentinel on loopback ports; the
Sentinel's down-after is long, so it still names the lost master when the
script asks, as in the seconds after a crash before a failover."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import redis

from gearhorn.runtime.children import die_with_parent
from gearhorn.supervision import redisclusters, servers
from tests.needs import require_binary

from .helpers import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "etc", "three-nodes",
                      "rejoin-redis")


def write_conf(folder, port: int) -> str:
    os.makedirs(folder, exist_ok=True)
    conf = os.path.join(folder, "redis.conf")
    with open(conf, "w") as fp:
        fp.write(f"bind 127.0.0.1\nport {port}\ndir {folder}\nappendonly yes\n"
                 "appendfsync always\nsave \"\"\n")
    return conf


def rejoin(conf: str, sentinel: servers.Managed) -> subprocess.Popen:
    return subprocess.Popen([SCRIPT, conf, "127.0.0.1", "127.0.0.1"],
                            env={**os.environ, "SENTINEL_PORT": str(sentinel.port)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=die_with_parent)


def refused(process: subprocess.Popen) -> str:
    _out, err = process.communicate(timeout=60)
    assert process.returncode == 1, err
    return err


def started(process: subprocess.Popen, port: int) -> redis.Redis:
    wait_for(lambda: process.poll() is not None or servers.is_listening("127.0.0.1", port),
             timeout=60, message="the rejoined Redis to listen")
    assert process.poll() is None, process.communicate()[1]
    return redis.Redis("127.0.0.1", port, socket_timeout=5)


@pytest.fixture
def master_and_sentinel(tmp_path):
    require_binary("redis-server", "redis-server")
    require_binary("redis-cli", "redis-tools")
    port = servers.free_port()
    conf = write_conf(str(tmp_path / "master"), port)
    master = subprocess.Popen(["redis-server", conf], stdout=subprocess.DEVNULL,
                              preexec_fn=die_with_parent)
    wait_for(lambda: servers.is_listening("127.0.0.1", port), timeout=60)
    managed = servers.Managed("redis", master, port)
    sentinel = redisclusters.start_redis_sentinel(managed, "gearhorn", str(tmp_path / "s"),
                                                  down_after_ms=600_000)
    processes = [master]
    yield managed, conf, sentinel, processes
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()
    sentinel.stop()


def test_an_empty_master_is_refused_and_one_with_its_data_starts(master_and_sentinel):
    master, conf, sentinel, processes = master_and_sentinel
    redis.Redis("127.0.0.1", master.port).set("acknowledged", "kept")
    master.process.kill()  # the master's node lost before any failover
    master.process.wait()
    data = os.path.dirname(conf)
    kept = data + ".kept"
    shutil.copytree(data, kept)
    shutil.rmtree(os.path.join(data, "appendonlydir"))  # its disk: gone

    err = refused(rejoin(conf, sentinel))
    assert "comes back empty" in err and "Not started" in err
    assert not servers.is_listening("127.0.0.1", master.port)

    shutil.rmtree(data)
    shutil.copytree(kept, data)  # a reboot: the data came back
    process = rejoin(conf, sentinel)
    processes.append(process)
    client = started(process, master.port)
    assert client.info("replication")["role"] == "master"
    assert client.get("acknowledged") == b"kept"


def test_a_node_joins_as_a_replica_of_the_named_master(master_and_sentinel, tmp_path):
    master, _conf, sentinel, processes = master_and_sentinel
    redis.Redis("127.0.0.1", master.port).set("acknowledged", "kept")
    port = servers.free_port()
    process = rejoin(write_conf(str(tmp_path / "empty-node"), port), sentinel)
    processes.append(process)
    client = started(process, port)
    info = wait_for(lambda: (i := client.info("replication")).get("master_link_status") == "up"
                    and i, timeout=60, message="the replica to sync")
    assert info["role"] == "slave" and info["master_port"] == master.port
    assert client.get("acknowledged") == b"kept"


def test_no_sentinel_answering_is_refused(tmp_path):
    require_binary("redis-cli", "redis-tools")
    silent = servers.Managed("none", None, servers.free_port())  # nobody listens there
    err = refused(rejoin(write_conf(str(tmp_path / "n"), servers.free_port()), silent))
    assert "no Sentinel" in err
