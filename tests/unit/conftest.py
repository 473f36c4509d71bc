import fakeredis
import pytest

from gearhorn.store.keys import Keys
from gearhorn.store.registry import Registry


@pytest.fixture
def fake_redis():
    server = fakeredis.FakeServer()
    return fakeredis.FakeRedis(server=server)


@pytest.fixture
def registry(fake_redis):
    return Registry(fake_redis, Keys("t:", "chan"))
