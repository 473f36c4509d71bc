"""The bridge's per-message Redis calls past redis-py's pool
(gearhorn/store/directcalls.py), on a real redis-server: the same replies
as through the client, scripts loaded when the server lost them, a lost
connection made again, and the client itself used when it must be."""

import pytest
import redis

from gearhorn.store import redisconn
from gearhorn.store.directcalls import DirectCalls
from gearhorn.store.redisutil import run_scripts

pytestmark = pytest.mark.timeout(60)

COUNTER = "return redis.call('INCRBY', KEYS[1], ARGV[1])"
FAILING = "return redis.error_reply('ERR refused by the script')"


@pytest.fixture
def client(redis_url):
    client = redisconn.connect(redis_url, "no", max_connections=8, socket_timeout=10)
    yield client
    client.close()


def test_scripts_answer_as_through_the_client(client):
    direct = DirectCalls(client)
    counter = client.register_script(COUNTER)
    calls = [(counter, ["a"], [1]), (counter, ["b"], [5]), (counter, ["a"], [2])]
    assert direct.direct
    assert direct.run_scripts(calls) == [1, 5, 3]
    assert run_scripts(client, calls) == [4, 10, 6]
    assert direct.run_scripts(calls) == [7, 15, 9]
    assert direct._open == 1  # one connection, used again


def test_scripts_the_server_lost_are_loaded_again(client):
    direct = DirectCalls(client)
    counter = client.register_script(COUNTER)
    assert direct.run_scripts([(counter, ["n"], [1])]) == [1]
    client.script_flush()
    assert direct.run_scripts([(counter, ["n"], [1]), (counter, ["n"], [1])]) == [2, 3]


@pytest.mark.parametrize("through", ["direct", "client"])
def test_only_the_calls_of_a_lost_script_are_made_again(client, through):
    """An append made again after another client's appends twice
    (lua/history_append.lua): the calls that ran must not run again."""
    run = DirectCalls(client).run_scripts if through == "direct" else (
        lambda calls: run_scripts(client, calls))
    loaded = client.register_script(COUNTER)
    client.script_flush()
    client.script_load(COUNTER)
    lost = client.register_script(COUNTER + " -- another script")
    assert run([(loaded, [f"ran-{through}"], [1]), (lost, [f"lost-{through}"], [1]),
                (loaded, [f"ran-{through}"], [1])]) == [1, 1, 2]
    assert client.get(f"ran-{through}") == b"2"  # once each, not again


def test_an_error_reply_is_raised_and_the_connection_stays_usable(client):
    direct = DirectCalls(client)
    counter, failing = client.register_script(COUNTER), client.register_script(FAILING)
    client.script_load(FAILING)
    with pytest.raises(redis.ResponseError, match="refused by the script"):
        direct.run_scripts([(counter, ["e"], [1]), (failing, ["e"], []),
                            (counter, ["e"], [1])])
    assert client.get("e") == b"2"  # the calls around it ran
    # Every reply of the failed round trip was read: the next call's is its own.
    assert direct.run_scripts([(counter, ["e"], [10])]) == [12]


def test_stream_reads_answer_as_through_the_client(client):
    direct = DirectCalls(client)
    client.xadd("s", {"m": "one", "p": b"\x00\xff"}, id="1-0")
    client.xadd("s", {"m": "two"}, id="2-0")
    assert direct.xread({"s": "0-0"}, 10, 100) == client.xread({"s": "0-0"}, count=10,
                                                                 block=100)
    assert direct.xread({"s": "1-0"}, 10, 100) == [[b"s", [(b"2-0", {b"m": b"two"})]]]
    assert direct.xread({"s": "2-0"}, 10, 50) == []  # nothing came within the block


def test_a_lost_connection_is_made_again(client):
    direct = DirectCalls(client)
    counter = client.register_script(COUNTER)
    assert direct.run_scripts([(counter, ["k"], [1])]) == [1]
    killed = client.client_kill_filter(_type="normal", skipme=True)
    assert killed >= 1
    assert direct.run_scripts([(counter, ["k"], [1])]) == [2]
    assert direct._open == 1


def test_after_a_restart_the_idle_connections_are_not_tried_one_by_one(client):
    direct = DirectCalls(client)
    counter = client.register_script(COUNTER)
    idle = [direct._take() for _ in range(3)]
    for connection in idle:
        connection.connect()
    direct._idle.extend(idle)
    client.client_kill_filter(_type="normal", skipme=True)  # as a restart would
    assert direct.run_scripts([(counter, ["r"], [1])]) == [1]
    assert direct._open == 1


def test_past_most_open_calls_go_through_the_client(client):
    direct = DirectCalls.pooled(client)
    counter = client.register_script(COUNTER)
    assert direct.run_scripts([(counter, ["c"], [3])]) == [3]
    assert direct.xread({"none": "0-0"}, 1, 10) == []
    assert direct._open == 0


def test_a_cluster_client_keeps_its_own_routing(redis_cluster):
    client = redisconn.connect(redis_cluster.url, "yes")
    try:
        direct = DirectCalls(client)
        counter = client.register_script(COUNTER)
        assert not direct.direct
        assert direct.run_scripts([(counter, ["{x}a"], [1]), (counter, ["{y}b"], [2])]) == [1, 2]
        assert direct._open == 0
    finally:
        client.close()
