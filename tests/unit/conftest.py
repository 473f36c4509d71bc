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


# A test's JVM lives a minute: the quick compiler only (58 -> 51 s for
# test_pipeline.py alone, on a quiet machine).
TEST_JAVA_OPTIONS = "-XX:+UseParallelGC -XX:TieredStopAtLevel=1"


@pytest.fixture(scope="session")
def spark():
    """One local Spark per test process (test_pipeline.py, test_live_audit.py)."""
    from tests.needs import require_binary, require_module

    require_module("pyspark")
    require_binary("java", "default-jre-headless")
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("gearhorn-tests")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.driver.extraJavaOptions", TEST_JAVA_OPTIONS + " -Xss8m")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
