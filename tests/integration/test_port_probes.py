"""What ``gearhorn up`` asks a port it finds taken (gearhorn/runtime/ports.py), against
the real servers: each answers as itself and as nothing else."""

from __future__ import annotations

from urllib.parse import urlparse

import pytest

from gearhorn.runtime import ports
from gearhorn.supervision import servers

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def test_each_server_answers_as_itself_and_nothing_else(redis_url, gearmand, gear_server,
                                                        start_bridge):
    url = urlparse(redis_url)
    redis_at = (url.hostname, url.port)
    bridge = start_bridge([gearmand])
    bridge_at = ("127.0.0.1", bridge.port)
    assert ports.answers_as_redis(*redis_at)
    assert ports.answers_as_gearmand(gearmand.host, gearmand.port)
    assert ports.answers_as_gearmand(gear_server.host, gear_server.port)
    assert ports.answers_as_bridge(*bridge_at)
    assert not ports.answers_as_redis(gearmand.host, gearmand.port)
    assert not ports.answers_as_redis(*bridge_at)
    assert not ports.answers_as_gearmand(*redis_at)
    assert not ports.answers_as_bridge(*redis_at)


def test_a_closed_port_is_nobody():
    # (A silent one is too, after the 5 s deadline: test_stomp_interop's
    # test_up_refuses_a_port_held_by_something_else.)
    closed = servers.free_port()
    assert not ports.answers_as_redis("127.0.0.1", closed)
    assert not ports.answers_as_gearmand("127.0.0.1", closed)
    assert not ports.answers_as_bridge("127.0.0.1", closed)
