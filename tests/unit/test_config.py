import pytest

from gearhorn import config as c


def write(tmp_path, text):
    path = tmp_path / "gearhorn.conf"
    path.write_text(text)
    return str(path)


def test_defaults():
    cfg = c.load({}, env={})
    assert cfg.gearman_servers == (("127.0.0.1", 4730),)
    assert cfg.redis_url == "redis://127.0.0.1:6379/0"
    assert cfg.max_payload_bytes == 1024 * 1024


def test_flags_win_over_env_and_env_over_file(tmp_path):
    path = write(tmp_path, "[gearhorn]\ngearman_servers = f1:1, f2:2\nredis_url = redis://file\n"
                           "processes = 3\n")
    cfg = c.load({}, env={"GEARHORN_CONFIG": path})
    assert cfg.gearman_servers == (("f1", 1), ("f2", 2))
    assert cfg.processes == 3
    env = {"GEARHORN_CONFIG": path, "GEARHORN_GEARMAN": "e1:10", "GEARHORN_REDIS_URL": "redis://env"}
    cfg = c.load({}, env=env)
    assert cfg.gearman_servers == (("e1", 10),)
    assert cfg.redis_url == "redis://env"
    assert cfg.processes == 3
    cfg = c.load({"redis_url": "redis://flag", "gearman_servers": None}, env=env)
    assert cfg.redis_url == "redis://flag"
    assert cfg.gearman_servers == (("e1", 10),)


def test_explicit_config_file_wins_over_env_path(tmp_path):
    a = write(tmp_path, "[gearhorn]\nprocesses = 5\n")
    cfg = c.load({}, config_file=a, env={"GEARHORN_CONFIG": "/nonexistent"})
    assert cfg.processes == 5


@pytest.mark.parametrize("text, reason", [
    ("[gearhorn]\nprocesses = many\n", "processes='many'"),
    ("[gearhorn]\nprocesses = 0\n", "must be positive"),
    ("[gearhorn]\nno_such_setting = 1\n", "unknown setting 'no_such_setting'"),
    ("[gearhorn]\ngearman_servers = host:notaport\n", "expected HOST:PORT"),
    ("not an ini file", "config file"),
    ("[gearhorn]\npresence_topic_prefix = who*\n", "presence_topic_prefix must be 1 to 64"),
    ("[gearhorn]\nhistory_size = -1\n", "must be positive"),
])
def test_bad_file_values_name_the_setting(tmp_path, text, reason):
    with pytest.raises(c.ConfigError, match=reason):
        c.load({}, config_file=write(tmp_path, text), env={})


def test_missing_file_is_an_error_not_a_silent_default():
    with pytest.raises(c.ConfigError, match="cannot read config file"):
        c.load({}, config_file="/nonexistent/gearhorn.conf", env={})


def test_bad_env_value():
    with pytest.raises(c.ConfigError, match="GEARHORN_FANOUT_TIMEOUT"):
        c.load({}, env={"GEARHORN_FANOUT_TIMEOUT": "soon"})


def test_parse_server():
    assert c.parse_server("h:1") == ("h", 1)
    assert c.parse_server("h") == ("h", 4730)
    assert c.parse_server("[::1]:4731") == ("::1", 4731)
    with pytest.raises(c.ConfigError):
        c.parse_server(":0")


def test_sample_config_file_loads_and_matches_defaults():
    import pathlib
    sample = pathlib.Path(__file__).parents[2] / "etc" / "gearhorn.conf"
    assert c.load({}, config_file=str(sample), env={}) == c.Config()


def test_every_config_survives_the_trip_through_the_environment():
    """What ``gearhorn up`` and ``--processes`` hand their children: a
    WebSocket port of 0 (off) included."""
    config = c.Config(bridge_ws_port=0, bridge_processes=3, bridge_reuse_port=True)
    assert c.load({}, env=c.to_env(config)) == config
    with pytest.raises(c.ConfigError, match="bridge_processes must be 1 to 256"):
        c.load({}, env={"GEARHORN_BRIDGE_PROCESSES": "300"})


def test_an_acknowledgement_waits_for_the_registrys_redis_alone():
    """gearmand's queue is its own business, whatever persistence says."""
    import redis

    from gearhorn.store import durability

    for persistence in ("redis", "none", "auto", "sqlite"):
        barriers = durability.for_config(c.Config(persistence=persistence),
                                         redis.Redis.from_url("redis://127.0.0.1:1/0"))
        assert [b.name for b in barriers.barriers] == [
            "the registry's Redis (redis://127.0.0.1:6379/0)"]


def test_settings_of_the_version_before_are_ignored_with_a_warning(tmp_path, caplog):
    path = tmp_path / "gearhorn.conf"
    path.write_text("[gearhorn]\nqueue_redis_url = redis://127.0.0.1:6380/0\n"
                    "pin_queue = true\n")
    config = c.load({}, config_file=str(path), env={"GEARHORN_QUEUE_REDIS_URL": "redis://x"})
    assert config == c.Config()
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "queue_redis_url is no longer used" in said and "pin_queue is no longer used" in said
    assert "GEARHORN_QUEUE_REDIS_URL is no longer used" in said


def test_a_barrier_timeout_of_zero_stops_the_start():
    with pytest.raises(c.ConfigError, match="barrier_timeout must be above 0"):
        c.load({"barrier_timeout": 0.0}, env={})
