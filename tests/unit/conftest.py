import fakeredis
import pytest

from gearhorn.keys import Keys
from gearhorn.registry import Registry


@pytest.fixture
def fake_redis():
    server = fakeredis.FakeServer()
    return fakeredis.FakeRedis(server=server)


@pytest.fixture
def registry(fake_redis):
    return Registry(fake_redis, Keys("t:", "chan"))
