"""``restore`` with the Arrow engine (no JVM): the table, the manifest, the atomic replace,
the ``auto`` choice. Equality with the Spark engine's output: tests/spark/test_spark_restore.py.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.orc as orc
import pyarrow.parquet as pq
import pytest

import compactlog
from compactlog.errors import ConfigError
from compactlog.restore import arrow_restore
from compactlog.restore.arrow_restore import base64_array
from compactlog.restore.ddl import DdlError, arrow_schema
from compactlog.restore.plan import InexactReadError
from compactlog.restore.progress import RestoreStep
from compactlog.spark.restore import RESULT_FILE, choose_engine, restore

from .spark.test_spark_source import build_log, model

CLI = os.path.join(os.path.dirname(sys.executable), "compactlog")


def parquet_state(out):
    table = pq.read_table(out / "part-00000.parquet")
    return dict(
        zip(table.column("key").to_pylist(), table.column("value").to_pylist(), strict=True)
    )


def test_restore_writes_the_model_one_file_and_the_manifest(tmp_path):
    ops = build_log(tmp_path / "log")
    out = tmp_path / "table"
    result = restore(tmp_path / "log", out, engine="arrow")
    assert result.engine == "arrow" and not result.skipped
    assert sorted(os.listdir(out)) == [RESULT_FILE, "part-00000.parquet"]
    assert parquet_state(out) == model(ops)
    document = json.loads((out / RESULT_FILE).read_bytes())
    assert document["engine"] == "arrow" and document["rows"] == len(model(ops))
    assert document["source"] == str(tmp_path / "log") and document["end_offset"] == len(ops)
    assert not any(p.name.startswith("table.") for p in tmp_path.iterdir())  # no leftovers
    assert os.listdir(tmp_path / "log" / ".snapshots") == []


def test_the_table_has_the_spark_sources_columns_and_types(tmp_path):
    build_log(tmp_path / "log", records=300, keys=20)
    with compactlog.open(tmp_path / "log") as log:
        log.append(b"with-headers", b"v", headers={"h": b"x"}, timestamp_ms=1_700_000_000_123)
    restore(tmp_path / "log", tmp_path / "out", engine="arrow", value_format="string")
    table = pq.read_table(tmp_path / "out")
    assert table.schema.names == ["key", "value", "offset", "timestamp", "headers"]
    assert table.schema.field("value").type == pa.string()
    assert table.schema.field("timestamp").type == pa.timestamp("us", tz="UTC")
    row = table.filter(pa.compute.equal(table.column("key"), b"with-headers")).to_pylist()[0]
    assert row["headers"] == [("h", b"x")] and row["timestamp"].timestamp() == 1_700_000_000.123


def test_a_second_restore_at_the_same_end_offset_does_nothing_and_appends_redo_it(tmp_path):
    ops = build_log(tmp_path / "log", records=500, keys=30)
    out = tmp_path / "table"
    restore(tmp_path / "log", out, engine="arrow")
    before = sorted((p.name, p.stat().st_mtime_ns) for p in out.iterdir())
    assert restore(tmp_path / "log", out, engine="arrow").skipped
    assert sorted((p.name, p.stat().st_mtime_ns) for p in out.iterdir()) == before
    with compactlog.open(tmp_path / "log") as log:
        log.append(b"new-key", b"new-value")
    ops.append((b"new-key", b"new-value"))
    assert not restore(tmp_path / "log", out, engine="arrow").skipped
    assert parquet_state(out) == model(ops)


def test_a_failed_write_leaves_the_old_table_and_no_temporary_directory(tmp_path, monkeypatch):
    ops = build_log(tmp_path / "log", records=400, keys=30)
    out = tmp_path / "table"
    restore(tmp_path / "log", out, engine="arrow")
    with compactlog.open(tmp_path / "log") as log:
        log.append(b"new-key", b"new-value")
    real = arrow_restore.csv_ready

    def half_written(batch):
        raise OSError("disk full")

    monkeypatch.setattr(arrow_restore, "csv_ready", half_written)
    with pytest.raises(OSError, match="disk full"):
        restore(tmp_path / "log", out, engine="arrow", format="csv")
    monkeypatch.setattr(arrow_restore, "csv_ready", real)
    assert parquet_state(out) == model(ops)  # the old table, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log", "table"]


def test_orc_and_csv_hold_the_same_table_as_parquet(tmp_path):
    build_log(tmp_path / "log", records=600, keys=40)
    with compactlog.open(tmp_path / "log") as log:
        log.append(b'a,"quoted"', b"v", headers={"h": b"x,y"}, timestamp_ms=1_700_000_000_123)
    for fmt in ("parquet", "orc", "csv"):
        restore(tmp_path / "log", tmp_path / fmt, engine="arrow", format=fmt)
    parquet = pq.read_table(tmp_path / "parquet" / "part-00000.parquet")
    from_orc = orc.read_table(str(tmp_path / "orc" / "part-00000.orc"))
    assert from_orc.cast(parquet.schema).equals(parquet)  # ORC reads timestamps back in ns
    csv = pa_csv.read_csv(
        tmp_path / "csv" / "part-00000.csv",
        read_options=pa_csv.ReadOptions(column_names=parquet.schema.names),
        convert_options=pa_csv.ConvertOptions(
            column_types={n: pa.string() for n in parquet.schema.names}
        ),
    )
    assert csv.column("key").to_pylist() == [
        base64.b64encode(k).decode() for k in parquet.column("key").to_pylist()
    ]
    row = next(r for r in csv.to_pylist() if r["headers"])
    assert json.loads(row["headers"]) == {"h": base64.b64encode(b"x,y").decode()}
    assert row["timestamp"] == "2023-11-14T22:13:20.123Z"


def test_json_values_become_columns(tmp_path):
    ops = build_log(tmp_path / "log", records=800, keys=40, compact_at=())
    restore(
        tmp_path / "log",
        tmp_path / "out",
        engine="arrow",
        as_of=400,
        value_format="json",
        value_schema="id INT, balance DOUBLE, name STRING",
    )
    table = pq.read_table(tmp_path / "out")
    assert table.schema.field("id").type == pa.int32()
    expected = {json.loads(v)["id"]: json.loads(v)["name"] for v in model(ops, 400).values()}
    got = dict(zip(table.column("id").to_pylist(), table.column("name").to_pylist(), strict=True))
    assert got == expected


def test_as_of_below_the_cleaner_point_is_refused_unless_inexact(tmp_path):
    build_log(tmp_path / "log", records=2000, keys=50, compact_at=(1500,))
    with pytest.raises(InexactReadError, match="allowInexact"):
        restore(tmp_path / "log", tmp_path / "out", engine="arrow", as_of=100)
    assert not (tmp_path / "out").exists()
    inexact = restore(
        tmp_path / "log", tmp_path / "out", engine="arrow", as_of=100, allow_inexact=True
    )
    assert inexact.as_of == 100 and inexact.rows == pq.read_table(tmp_path / "out").num_rows


def test_the_arrow_engine_refuses_what_needs_spark_before_any_work(tmp_path):
    build_log(tmp_path / "log", records=50)
    for kwargs, message in [
        ({"format": "json"}, "pyarrow has no json writer"),
        ({"master": "local[1]"}, "needs engine='spark'"),
        ({"value_format": "json", "value_schema": "id INT NOT NULL"}, "Spark engine"),
        ({"engine": "jvm"}, "engine must be one of"),
    ]:
        with pytest.raises(ConfigError, match=message):
            restore(tmp_path / "log", tmp_path / "out", **{"engine": "arrow", **kwargs})
    assert not (tmp_path / "out").exists()
    assert not (tmp_path / "log" / ".snapshots").exists()  # refused before the snapshot


def test_auto_takes_arrow_unless_the_job_needs_spark_or_the_snapshot_is_large():
    def choose(**kwargs):
        args = {
            "format": "parquet",
            "value_schema": None,
            "master": None,
            "spark": None,
            "snapshot_bytes": 1 << 20,
            "memory_bytes": 8 << 30,
        }
        return choose_engine(**{**args, **kwargs})

    assert choose() == "arrow"
    assert choose(format="orc") == choose(format="csv") == "arrow"
    assert choose(value_schema="id INT, name STRING") == "arrow"
    assert choose(snapshot_bytes=2 << 30) == "arrow"  # a quarter of 8 GiB: still Arrow
    assert choose(snapshot_bytes=(2 << 30) + 1) == "spark"
    assert choose(master="local[4]") == "spark"
    assert choose(spark=object()) == "spark"
    assert choose(format="json") == "spark"
    assert choose(value_schema="id INT NOT NULL") == "spark"


def test_ddl_schemas_map_to_the_arrow_types_spark_uses():
    schema = arrow_schema(
        "a TINYINT, b SMALLINT, c INT, d BIGINT, e FLOAT, f DOUBLE, g DECIMAL(10, 2), "
        "h BOOLEAN, i STRING, j BINARY, k DATE, l TIMESTAMP, m TIMESTAMP_NTZ, "
        "n ARRAY<STRING>, o MAP<STRING, INT>, p STRUCT<x: INT, `y z`: STRING>"
    )
    assert [f.type for f in schema] == [
        pa.int8(),
        pa.int16(),
        pa.int32(),
        pa.int64(),
        pa.float32(),
        pa.float64(),
        pa.decimal128(10, 2),
        pa.bool_(),
        pa.string(),
        pa.binary(),
        pa.date32(),
        pa.timestamp("us", tz="UTC"),
        pa.timestamp("us"),
        pa.list_(pa.string()),
        pa.map_(pa.string(), pa.int32()),
        pa.struct([pa.field("x", pa.int32()), pa.field("y z", pa.string())]),
    ]
    for bad, message in [
        ("id INTEGR", "unknown type 'integr'; did you mean integer"),
        ("a STRUCT<b: DUOBLE>", "did you mean double"),
        ("a INTERVAL", "type 'interval' has no Arrow type here; it needs the Spark engine"),
        ("id", "expected"),
        ("a INT b INT", "expected ','"),
    ]:
        with pytest.raises(DdlError, match=message):
            arrow_schema(bad)


def test_every_type_the_arrow_engine_maps_is_a_spark_type():
    from compactlog.restore.ddl import PRIMITIVES
    from compactlog.restore.options import SPARK_TYPES

    assert set(PRIMITIVES) <= set(SPARK_TYPES)


def test_base64_matches_the_standard_library():
    values = [None, b"", b"a", b"ab", b"abc", b"abcd", bytes(range(256)), b"\xff\xfe"]
    array = pa.array(values * 3, pa.binary())
    for part in (array, array.slice(5, 13)):
        want = [None if v is None else base64.b64encode(v).decode() for v in part.to_pylist()]
        assert base64_array(part).to_pylist() == want


def test_cli_restores_without_a_jvm(tmp_path):
    ops = build_log(tmp_path / "log", records=500, keys=40)
    out = tmp_path / "table"
    env = {
        **os.environ,
        "JAVA_HOME": str(tmp_path / "no-java"),
        "PATH": os.path.dirname(sys.executable),
    }
    done = subprocess.run(
        [CLI, "restore", str(tmp_path / "log"), "--to", str(out), "--json"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["engine"] == "arrow" and document["rows"] == len(model(ops))
    assert parquet_state(out) == model(ops)
    usage = subprocess.run(
        [CLI, "restore", str(tmp_path / "log"), "--to", str(out), "--engine", "jvm"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert usage.returncode == 2 and "--engine" in usage.stderr


def test_restore_reads_values_as_the_log_declares_them(tmp_path):
    """With no value format given, restore takes the log's declared one, as the data source's
    ``valueFormat`` does: ``str`` values become a string column; declared ``json`` with a
    schema becomes columns."""
    with compactlog.open(tmp_path / "text", value_format="str") as log:
        log.append_batch([(b"a", "alpha"), (b"b", "beta")])
    restore(tmp_path / "text", tmp_path / "text-out", engine="arrow")
    table = pq.read_table(tmp_path / "text-out")
    assert table.schema.field("value").type == pa.string()
    assert sorted(table.column("value").to_pylist()) == ["alpha", "beta"]
    with compactlog.open(tmp_path / "doc", value_format="json") as log:
        log.append_batch([(b"a", {"id": 1, "name": "x"}), (b"b", {"id": 2, "name": "y"})])
    restore(
        tmp_path / "doc", tmp_path / "doc-out", engine="arrow", value_schema="id INT, name STRING"
    )
    table = pq.read_table(tmp_path / "doc-out")
    ids, names = table.column("id").to_pylist(), table.column("name").to_pylist()
    assert sorted(zip(ids, names, strict=True)) == [
        (1, "x"),
        (2, "y"),
    ]
    with compactlog.open(tmp_path / "raw") as log:
        log.append(b"a", b"\xff")
    with pytest.raises(ConfigError, match="value_schema needs value_format='json'"):
        restore(tmp_path / "raw", tmp_path / "raw-out", engine="arrow", value_schema="id INT")


NO_PYSPARK = """
import sys, importlib.abc

class NoSpark(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "pyspark" or name.startswith(("pyspark.", "py4j")):
            raise ImportError("blocked: " + name)
        return None

sys.meta_path.insert(0, NoSpark())
import compactlog
from compactlog.restore.arrow_restore import write_arrow_table
from compactlog.restore.options import ReadOptions

with compactlog.open(sys.argv[1]) as log:
    for i in range(100):
        log.append(b"k%d" % (i % 10), b"v%d" % i)
rows = write_arrow_table(ReadOptions(path=sys.argv[1]), sys.argv[2], "parquet")
assert rows == 10, rows
spark = [m for m in sys.modules if m.startswith(("pyspark", "py4j", "compactlog.spark"))]
assert not spark, spark
print("ok")
"""


def test_the_arrow_engine_runs_with_pyspark_imports_blocked(tmp_path):
    """The Arrow engine lives below ``spark/`` and imports nothing of Spark (issue 25)."""
    out = tmp_path / "out"
    child = subprocess.run(
        [sys.executable, "-c", NO_PYSPARK, str(tmp_path / "log"), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "ok"
    assert len(pq.read_table(out / "part-00000.parquet")) == 10


def test_cli_restore_shows_its_phases_and_progress_on_stderr(tmp_path):
    """As ``compact`` does: plain lines in a pipe (the phases, then the read's first and
    last event), JSON Lines on request with stdout keeping its one document."""
    build_log(tmp_path / "log", records=3000, keys=200)
    lines = subprocess.run(
        [CLI, "restore", str(tmp_path / "log"), "--to", str(tmp_path / "a")],
        capture_output=True,
        text=True,
        check=True,
    ).stderr.splitlines()
    assert any(line.startswith("compactlog: restore: snapshot of ") for line in lines)
    progress = [line for line in lines if line.startswith("compactlog: progress: write ")]
    assert progress[0].startswith("compactlog: progress: write 0 records of ")
    assert "(100%)" in progress[-1]
    assert lines[-1].startswith("compactlog: restore: ") and lines[-1].endswith(" in place")
    argv = [CLI, "restore", str(tmp_path / "log"), "--to", str(tmp_path / "b"), "--json"]
    done = subprocess.run(
        [*argv, "--progress", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    document = json.loads(done.stdout)
    events = [json.loads(line) for line in done.stderr.splitlines()]
    assert events and all(set(e) == {"phase", "records_done", "records_planned"} for e in events)
    done_counts = [e["records_done"] for e in events]
    assert done_counts == sorted(done_counts) and done_counts[0] == 0
    assert done_counts[-1] == events[-1]["records_planned"] == document["end_offset"]


def test_restore_reports_progress_to_a_callback(tmp_path):
    build_log(tmp_path / "log", records=3000, keys=200)
    events: list[RestoreStep] = []
    result = restore(tmp_path / "log", tmp_path / "out", engine="arrow", on_progress=events.append)
    assert events[0] == RestoreStep("write", 0, result.end_offset)
    assert events[-1] == RestoreStep("write", result.end_offset, result.end_offset)
    assert all(a.records_done <= b.records_done for a, b in itertools.pairwise(events))
