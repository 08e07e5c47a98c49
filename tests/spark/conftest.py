"""One SparkSession for every Spark test (a cold session costs 5-9 s and 0.5 GB here).

Only tests under ``tests/spark/`` use it, so the rest of the suite never starts a JVM.
Without ``java`` the Spark tests fail (not skip) with a message naming what is missing:
``make test`` is meant to run them.
"""

from __future__ import annotations

import os
import sys

import pytest


@pytest.fixture(scope="session")
def spark():
    from compactlog.spark.session import SparkUnavailableError, check_spark_available

    try:
        check_spark_available()
    except SparkUnavailableError as error:
        pytest.fail(f"the Spark tests cannot run: {error}", pytrace=False)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from compactlog.spark import register

    session = (
        SparkSession.builder.master("local[2]")
        .appName("compactlog-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()
