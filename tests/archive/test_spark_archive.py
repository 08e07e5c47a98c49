"""Spark reading an archive straight from S3 (SeaweedFS): ``load("s3://...")`` with no
shared disk, the executors fetching objects themselves with credentials from their own
environment. The read runs in a child process whose driver and executors get the S3
settings only through the environment (as on a cluster), never through the plan."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap

import pytest

import compactlog
from compactlog.archive import open_store
from compactlog.archive.push import Archiver

from .helpers import Model, new_log

CHILD = textwrap.dedent(
    """
    import json, os, sys
    from pyspark.sql import SparkSession
    from compactlog.spark import register

    url, as_of = sys.argv[1], int(sys.argv[2])
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    read = lambda: spark.read.format("compactlog")  # a reader keeps its options: one each
    latest = read().option("numPartitions", 3).load(url).collect()
    changelog = read().option("mode", "changelog").load(url).count()
    old = read().option("asOfOffset", as_of).load(url).collect()
    out = {
        "latest": {r.key.hex(): r.value.hex() for r in latest},
        "changelog": changelog,
        "old": {r.key.hex(): r.value.hex() for r in old},
    }
    print("RESULT " + json.dumps(out))
    spark.stop()
    """
)


@pytest.mark.slow  # a Spark driver of its own: 40 s idle, minutes on a loaded machine
def test_spark_reads_the_archive_from_s3(tmp_path, seaweed, s3_url):
    rng = random.Random(71)
    log = new_log(tmp_path / "source")
    reader = compactlog.open(tmp_path / "source", read_only=True)
    archiver = Archiver(reader, open_store(s3_url))
    archiver.start()
    model = Model()
    model.append(log, rng, 300)
    first = archiver.push().end_offset
    for round_ in range(3):
        model.append(log, rng, 300)
        if round_ == 1:
            log.compact(force=True)
        archiver.push()
    archiver.stop()
    reader.close()
    records = sum(1 for _ in log.read())
    log.close()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, s3_url, str(first)],
        capture_output=True,
        text=True,
        timeout=240,
        env={**seaweed_env(seaweed), "PYSPARK_PYTHON": sys.executable},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line[len("RESULT ") :])
    hexed = lambda state: {k.hex(): v.hex() for k, v in state.items()}  # noqa: E731
    assert out["latest"] == hexed(model.state())
    assert out["old"] == hexed(model.state(first))
    assert out["changelog"] == records  # the compacted archive's records, as the log holds


def seaweed_env(seaweed) -> dict[str, str]:
    import os

    return {**os.environ, **seaweed.env}
