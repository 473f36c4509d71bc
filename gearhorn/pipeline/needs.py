"""What Spark needs on this machine, checked before anything imports pyspark.

``pip install gearhorn`` has no pyspark (it is the ``pipeline`` extra), and
Spark needs Java: either missing is one line a person can act on, not a
traceback from an import or from the JVM's launcher.
"""

from __future__ import annotations

import importlib.util
import os
import shutil

from gearhorn.errors import GearhornError

NO_PYSPARK = ("pyspark is not installed, and the audit and the report run on it: "
              "pip install 'gearhorn[pipeline]' (tools/ensure-env installs it)")
NO_JAVA = ("Java is not installed, and Spark needs it: apt-get install "
           "default-jre-headless (Java 17 or newer)")


class SparkMissing(GearhornError):
    """pyspark or Java is not on this machine (exit status 1, as before)."""


def spark_missing() -> str | None:
    """Why Spark cannot run here, or None."""
    if importlib.util.find_spec("pyspark") is None:
        return NO_PYSPARK
    java_home = os.environ.get("JAVA_HOME")
    if java_home and os.access(os.path.join(java_home, "bin", "java"), os.X_OK):
        return None
    return NO_JAVA if shutil.which("java") is None else None


def require_spark() -> None:
    """Raise :class:`SparkMissing` with the reason, if there is one."""
    reason = spark_missing()
    if reason is not None:
        raise SparkMissing(reason)
