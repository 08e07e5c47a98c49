"""``df.write.format("compactlog")``: a DataFrame into a log, staged by tasks, appended by the
driver.

A round trip keeps keys, values, tombstones, timestamps and headers; overwrite and unknown
columns are refused before anything is written; a failed job leaves the log unchanged and no
staging files; a task that fails once and is retried (``local[2,4]`` in a child process)
leaves every row in the log exactly once.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import compactlog
from compactlog.spark.writer import STAGING_DIR

REPO = Path(__file__).resolve().parents[2]


def records(path):
    with compactlog.open(path, read_only=True) as log:
        return list(log.read())


def staging_leftovers(path):
    root = os.path.join(path, STAGING_DIR)
    return sorted(os.listdir(root)) if os.path.isdir(root) else []


def test_round_trip_keeps_keys_values_tombstones_timestamps_and_headers(spark, tmp_path):
    path = str(tmp_path / "log")
    when = dt.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=dt.UTC)
    rows = [
        (f"k{i % 7}".encode(), None if i % 5 == 0 else f"v{i}", when, {"h": b"%d" % i})
        for i in range(60)
    ]
    df = spark.createDataFrame(
        rows, "key binary, value string, timestamp timestamp, headers map<string,binary>"
    ).repartition(3)
    df.write.format("compactlog").mode("append").save(path)
    got = records(path)
    assert {r.headers["h"]: (r.key, r.value) for r in got} == {
        h["h"]: (k, None if v is None else v.encode()) for k, v, _t, h in rows
    }
    assert {r.timestamp for r in got} == {int(when.timestamp() * 1000)}
    assert [r.offset for r in got] == list(range(60))
    assert staging_leftovers(path) == []


def test_appends_after_existing_records_and_reads_back_through_the_source(spark, tmp_path):
    path = str(tmp_path / "log")
    with compactlog.open(path) as log:
        log.append(b"old", b"0")
        log.flush()
    df = spark.range(0, 500, numPartitions=2).selectExpr(
        "cast(concat('k', id % 50) as binary) as key", "cast(cast(id as string) as binary) as value"
    )
    df.write.format("compactlog").mode("append").save(path)
    got = records(path)
    assert len(got) == 501 and got[0].key == b"old"
    assert sorted(r.key for r in got[1:]) == sorted(b"k%d" % (i % 50) for i in range(500))
    latest = spark.read.format("compactlog").load(path)
    assert latest.count() == 51


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        (
            "string(id) as key, string(id) as value, id as extra",
            "extra",
        ),
        ("string(id) as key", "no 'value' column"),
        ("id as key, cast(cast(id as string) as binary) as value", "must be binary or string"),
    ],
)
def test_bad_columns_are_refused_before_anything_is_written(spark, tmp_path, columns, message):
    path = str(tmp_path / "log")
    df = spark.range(3).selectExpr(*[c.strip() for c in columns.split(", ")])
    with pytest.raises(Exception, match=message):
        df.write.format("compactlog").mode("append").save(path)
    assert not os.path.exists(path) or records(path) == []


def test_overwrite_is_refused_and_the_log_is_unchanged(spark, tmp_path):
    path = str(tmp_path / "log")
    with compactlog.open(path) as log:
        log.append(b"a", b"1")
        log.flush()
    df = spark.createDataFrame([(b"b", b"2")], "key binary, value binary")
    with pytest.raises(Exception, match="append-only"):
        df.write.format("compactlog").mode("overwrite").save(path)
    assert [(r.key, r.value) for r in records(path)] == [(b"a", b"1")]


def test_a_failed_job_leaves_the_log_unchanged_and_no_staging_files(spark, tmp_path):
    from pyspark.sql.functions import udf

    path = str(tmp_path / "log")
    with compactlog.open(path) as log:
        log.append(b"a", b"1")
        log.flush()

    @udf("binary", useArrow=False)
    def fail_late(i):
        if i == 1900:
            raise RuntimeError("task failure injected by the test")
        return b"%d" % i

    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")
    try:
        df = spark.range(0, 2000, numPartitions=2).select(
            fail_late("id").alias("key"), fail_late("id").alias("value")
        )
        with pytest.raises(Exception, match="task failure injected"):
            df.write.format("compactlog").mode("append").save(path)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    assert [(r.key, r.value) for r in records(path)] == [(b"a", b"1")]
    assert staging_leftovers(path) == []


RETRY_JOB = textwrap.dedent(
    """
    import os, sys
    from pyspark.sql.functions import udf
    from compactlog.spark.session import local_session

    path, marks = sys.argv[1], sys.argv[2]
    spark = local_session(
        "local[2,4]", config={"spark.sql.execution.arrow.maxRecordsPerBatch": "100"}
    )

    @udf("binary", useArrow=False)
    def fail_once(i):
        # partition 1's first attempt dies after it staged most of its rows
        if i == 3900 and not os.path.exists(os.path.join(marks, "failed")):
            open(os.path.join(marks, "failed"), "w").close()
            raise RuntimeError("first attempt fails")
        return b"k%d" % i

    df = spark.range(0, 4000, numPartitions=2).select(
        fail_once("id").alias("key"), fail_once("id").alias("value")
    )
    df.write.format("compactlog").mode("append").save(path)
    spark.stop()
    """
)


def test_a_task_that_fails_once_is_retried_and_its_rows_land_exactly_once(tmp_path):
    path, marks = tmp_path / "log", tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "job.py"
    script.write_text(RETRY_JOB)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run(
        [sys.executable, str(script), str(path), str(marks)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (marks / "failed").exists()  # the failure happened, so a retry did the work
    got = records(path)
    assert sorted(r.key for r in got) == sorted(b"k%d" % i for i in range(4000))
    assert staging_leftovers(str(path)) == []
