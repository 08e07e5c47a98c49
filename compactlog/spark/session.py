"""A local SparkSession set up the way compactlog's tools and tests need it.

Spark's Python workers must run this interpreter (the one that has compactlog and the
same pyarrow), so ``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON`` are set from
``sys.executable`` unless the user set them. Not imported by the data source modules.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any

from ..errors import SparkUnavailableError


def worker_python_env() -> None:
    """Make Spark's Python workers use this interpreter unless the user chose one."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def check_spark_available() -> None:
    """Raise :class:`SparkUnavailableError` naming what is missing."""
    try:
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as error:
        raise SparkUnavailableError(
            f"Spark support needs pyspark and pyarrow ({error}): pip install 'compactlog[spark]'"
        ) from None
    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java or not os.path.exists(java):
        raise SparkUnavailableError(
            "Spark needs a Java runtime (17 or newer) and no `java` was found on PATH "
            "(or under JAVA_HOME): install one, e.g. `apt-get install openjdk-17-jre-headless`"
        )


def register(spark: Any) -> None:
    """Register the ``compactlog`` data source with ``spark`` (a ``SparkSession``).

    Only needed where Spark's discovery cannot see the ``pyspark_compactlog`` module (Spark
    then answers ``[DATA_SOURCE_NOT_FOUND]``): compactlog importable only through
    ``PYTHONPATH``, ``--py-files`` or another installer's import hook. A wheel or an editable
    install is found with no call. Registering twice is harmless.
    """
    from .source import CompactLogDataSource

    spark.dataSource.register(CompactLogDataSource)


def local_session(
    master: str = "local[*]",
    *,
    app_name: str = "compactlog",
    shuffle_partitions: int | None = None,
    config: dict[str, str] | None = None,
) -> Any:
    """A SparkSession (new or the active one) with the UI off and the data source registered."""
    check_spark_available()
    worker_python_env()
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "true")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
    )
    if shuffle_partitions is not None:
        builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
    for key, value in (config or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


__all__ = [
    "SparkUnavailableError",
    "check_spark_available",
    "local_session",
    "register",
    "worker_python_env",
]
