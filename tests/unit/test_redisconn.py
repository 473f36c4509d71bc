import pytest
from redis.exceptions import RedisClusterException

from gearhorn import config
from gearhorn.store import redisconn
from gearhorn.supervision.servers import free_port


def test_a_sentinel_url_names_the_sentinels_the_master_and_the_database():
    client = redisconn.connect("redis+sentinel://:s3cret@10.0.0.1:26379,10.0.0.2/orders/3",
                               socket_timeout=7)
    pool = client.connection_pool
    assert pool.service_name == "orders"
    sentinels = [s.connection_pool.connection_kwargs for s in pool.sentinel_manager.sentinels]
    assert [(s["host"], s["port"]) for s in sentinels] == [("10.0.0.1", 26379),
                                                          ("10.0.0.2", 26379)]
    kwargs = pool.connection_kwargs
    assert (kwargs["db"], kwargs["password"], kwargs["socket_timeout"]) == (3, "s3cret", 7)


def test_a_sentinel_url_without_a_master_name_is_refused():
    with pytest.raises(ValueError, match="names the master"):
        redisconn.connect("redis+sentinel://10.0.0.1:26379")


def test_a_node_that_does_not_answer_is_taken_for_a_single_server(caplog):
    url = f"redis://:pw@127.0.0.1:{free_port()}/0"
    client = redisconn.connect(url, socket_connect_timeout=1)
    assert not redisconn.is_cluster_client(client)
    assert "redis_cluster = yes" in caplog.text and "pw" not in caplog.text


def test_cluster_yes_skips_the_question():
    # No node answers here: only the cluster client tries one when it is made
    # (a plain client connects on first use), and says it is the cluster's.
    with pytest.raises(RedisClusterException, match="Redis Cluster cannot be connected"):
        redisconn.connect(f"redis://127.0.0.1:{free_port()}/0", "yes",
                          socket_connect_timeout=1)


@pytest.mark.parametrize("setting, value, message", [
    ("GEARHORN_REDIS_CLUSTER", "maybe", "redis_cluster must be one of"),
    ("GEARHORN_KEY_PREFIX", "app{1}:", "may not contain"),
])
def test_cluster_settings_are_checked(setting, value, message):
    with pytest.raises(config.ConfigError, match=message):
        config.load(env={setting: value})
