import pytest
import redis

from gearhorn import servers
from tests.conftest import require_binary

from .helpers import PoolProcess


@pytest.fixture(scope="session")
def redis_server():
    require_binary("redis-server", "redis-server")
    server = servers.start_redis()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server):
    url = redis_server.details["url"]
    redis.Redis.from_url(url).flushall()
    return url


@pytest.fixture(scope="session")
def gearmand(tmp_path_factory):
    require_binary("gearmand", "gearman-job-server")
    server = servers.start_gearmand(data_dir=str(tmp_path_factory.mktemp("gearmand")))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gear_server(tmp_path_factory):
    server = servers.start_gear_server(data_dir=str(tmp_path_factory.mktemp("gear")))
    yield server
    server.stop()


@pytest.fixture(params=["gearmand", "gear_server"])
def gearman_server(request):
    """Each test using it runs against C gearmand and against gear.Server."""
    return request.getfixturevalue(request.param)


@pytest.fixture
def gearman_cli_tool():
    return require_binary("gearman", "gearman-tools")


@pytest.fixture
def start_pool(redis_url, tmp_path):
    pools = []

    def start(gearman_servers, processes=2):
        pool = PoolProcess(gearman_servers, redis_url, processes, log_dir=str(tmp_path))
        pools.append(pool)
        return pool.wait_ready()

    yield start
    for pool in pools:
        pool.stop()


@pytest.fixture
def start_bridge(redis_url, tmp_path):
    from .stomp_helpers import BridgeProcess

    bridges = []

    def start(gearman_servers, env=None):
        bridge = BridgeProcess(gearman_servers, redis_url, str(tmp_path), env)
        bridges.append(bridge)
        return bridge

    yield start
    for bridge in bridges:
        bridge.stop()


@pytest.fixture
def stomp_clients():
    from .stomp_helpers import StompClient

    clients = []

    def make(port, **kwargs):
        client = StompClient(port, **kwargs)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()
