"""``spark.read.format("compactlog")``: what a Spark user gets, checked against a model.

Latest mode equals ``log.latest()`` and a dict model on logs with repeated keys,
tombstones, several segments, compressed batches, a compacted tail and a dirty head whose
keys have versions in several partitions; changelog mode returns every record; as-of reads
are exact, refused or explicitly inexact; values decode into columns.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import compactlog

REPO = Path(__file__).resolve().parents[2]


def build_log(path, *, records=3000, keys=150, compression="zstd", compact_at=(1200,)):
    """A log with a compacted tail and a dirty head; returns the ops appended, in order."""
    ops = []
    with compactlog.open(
        path, segment_bytes=8192, min_compaction_lag_ms=0, compression=compression
    ) as log:
        for start in range(0, records, 25):
            batch = []
            for i in range(start, min(start + 25, records)):
                key = b"customer-%04d" % ((i * 7919) % keys)
                if i % 17 == 0:
                    value = None
                else:
                    value = json.dumps({"id": i % keys, "balance": i * 1.5, "name": f"c{i}"})
                    value = value.encode()
                batch.append((key, value))
            log.append_batch(batch)
            ops.extend(batch)
            if any(start <= c < start + 25 for c in compact_at):
                log.flush()
                log.compact(force=True)
        log.flush()
    return ops


def model(ops, end=None):
    state = {}
    for _offset, (key, value) in enumerate(ops[:end]):
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    return state


def test_latest_equals_the_model_across_partitions(spark, tmp_path):
    ops = build_log(tmp_path / "log")
    df = spark.read.format("compactlog").option("numPartitions", 4).load(str(tmp_path / "log"))
    assert df.rdd.getNumPartitions() == 4
    assert [f.name for f in df.schema.fields] == ["key", "value", "offset", "timestamp", "headers"]
    rows = df.collect()
    got = {bytes(r.key): bytes(r.value) for r in rows}
    assert len(got) == len(rows)
    assert got == model(ops)
    with compactlog.open(tmp_path / "log", read_only=True) as log:
        assert sorted(r.offset for r in rows) == [r.offset for r in log.latest()]


def test_changelog_mode_returns_every_record(spark, tmp_path):
    ops = build_log(tmp_path / "log", compact_at=())
    df = spark.read.format("compactlog").option("mode", "changelog").load(str(tmp_path / "log"))
    assert df.schema.fieldNames()[-1] == "deleted"
    rows = sorted(df.collect(), key=lambda r: r.offset)
    assert [(r.offset, bytes(r.key), r.deleted) for r in rows] == [
        (i, k, v is None) for i, (k, v) in enumerate(ops)
    ]
    assert all((r.value is None) == r.deleted for r in rows)


def test_as_of_offsets_exact_refused_and_inexact(spark, tmp_path):
    ops = build_log(tmp_path / "log", compact_at=(1500,))
    path = str(tmp_path / "log")
    point = json.loads((tmp_path / "log" / "cleaner.checkpoint").read_bytes())["first_dirty_offset"]
    assert point > 0
    exact = spark.read.format("compactlog").option("asOfOffset", point + 100).load(path)
    assert {bytes(r.key): bytes(r.value) for r in exact.collect()} == model(ops, point + 100)
    with pytest.raises(Exception, match=f"lowest offset with an exact state is {point}"):
        spark.read.format("compactlog").option("asOfOffset", point - 1).load(path).collect()
    inexact = (
        spark.read.format("compactlog")
        .option("asOfOffset", point - 50)
        .option("allowInexact", "true")
        .load(path)
        .collect()
    )
    expected = model(ops, point - 50)
    assert inexact and all(expected[bytes(r.key)] == bytes(r.value) for r in inexact)


def test_json_values_decode_into_columns_with_a_schema(spark, tmp_path):
    ops = build_log(tmp_path / "log", records=600, keys=40)
    path = str(tmp_path / "log")
    df = (
        spark.read.format("compactlog")
        .option("valueFormat", "json")
        .option("valueSchema", "id INT, balance DOUBLE, name STRING")
        .load(path)
    )
    assert df.schema.simpleString() == (
        "struct<key:binary,id:int,balance:double,name:string,offset:bigint,"
        "timestamp:timestamp,headers:map<string,binary>>"
    )
    expected = {k: json.loads(v) for k, v in model(ops).items()}
    got = {bytes(r.key): {"id": r.id, "balance": r.balance, "name": r.name} for r in df.collect()}
    assert got == expected
    # a user schema: exactly those columns, metadata and value fields mixed
    user = (
        spark.read.format("compactlog")
        .schema("name STRING, key BINARY, offset BIGINT")
        .option("valueFormat", "json")
        .load(path)
    )
    assert user.columns == ["name", "key", "offset"]
    assert {bytes(r.key): r.name for r in user.collect()} == {
        k: v["name"] for k, v in expected.items()
    }
    text = spark.read.format("compactlog").option("valueFormat", "string").load(path)
    assert {bytes(r.key): r.value for r in text.collect()} == {
        k: v.decode() for k, v in model(ops).items()
    }


def test_headers_and_timestamps_arrive_as_spark_types(spark, tmp_path):
    with compactlog.open(tmp_path / "log") as log:
        log.append(b"a", b"1", timestamp_ms=1_700_000_000_123, headers={"trace": b"\x00\x01"})
        log.append(b"b", b"2", timestamp_ms=1_700_000_000_456)
    rows = spark.read.format("compactlog").load(str(tmp_path / "log")).orderBy("offset").collect()
    assert rows[0].headers == {"trace": bytearray(b"\x00\x01")} and rows[1].headers is None
    assert rows[0].timestamp.isoformat().startswith("2023-11-14T22:13:20.123")


def test_bad_options_fail_with_a_message_naming_the_option(spark, tmp_path):
    build_log(tmp_path / "log", records=50)
    with pytest.raises(Exception, match="valueFormat=json needs the value's schema"):
        spark.read.format("compactlog").option("valueFormat", "json").load(
            str(tmp_path / "log")
        ).collect()
    with pytest.raises(Exception, match="unknown compactlog option"):
        spark.read.format("compactlog").option("asof", "3").load(str(tmp_path / "log")).collect()


AUTO = textwrap.dedent(
    """
    import sys
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
             .getOrCreate())
    print("rows", spark.read.format("compactlog").load(sys.argv[1]).count())
    spark.stop()
    """
)


def test_the_source_registers_itself_in_a_fresh_session(tmp_path):
    """PySpark imports top-level ``pyspark_*`` modules and registers their DefaultSource;
    no ``register`` call happens in this process."""
    build_log(tmp_path / "log", records=100, keys=10)
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    result = subprocess.run(
        [sys.executable, "-c", AUTO, str(tmp_path / "log")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rows 10" in result.stdout
