"""``restore``: the latest state of a log as a table, written atomically, idempotent."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner
from compactlog.cli.main import cli

import compactlog
from compactlog.errors import ConfigError
from compactlog.spark.restore import RESULT_FILE, restore

from .test_spark_source import build_log, model


def listing(path):
    return sorted((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in path.iterdir())


def test_restore_writes_the_model_and_a_result_file(spark, tmp_path):
    ops = build_log(tmp_path / "log")
    out = tmp_path / "table"
    result = restore(tmp_path / "log", out, spark=spark, partitions=3)
    assert not result.skipped and result.rows == len(model(ops))
    table = spark.read.parquet(str(out))
    assert {bytes(r.key): bytes(r.value) for r in table.collect()} == model(ops)
    document = json.loads((out / RESULT_FILE).read_bytes())
    assert document["source"] == str(tmp_path / "log")
    assert document["end_offset"] == len(ops) and document["rows"] == result.rows
    assert document["seconds"] > 0
    assert not any(p.name.startswith("table.") for p in tmp_path.iterdir())  # no leftovers
    assert os.listdir(tmp_path / "log" / ".snapshots") == []  # its snapshot is gone


def test_restore_is_a_no_op_at_the_same_end_offset_and_redone_after_appends(spark, tmp_path):
    ops = build_log(tmp_path / "log", records=500, keys=30)
    out = tmp_path / "table"
    restore(tmp_path / "log", out, spark=spark)
    before = listing(out)
    again = restore(tmp_path / "log", out, spark=spark)
    assert again.skipped and again.rows == len(model(ops))
    assert listing(out) == before
    with compactlog.open(tmp_path / "log") as log:
        log.append(b"new-key", b"new-value")
    ops.append((b"new-key", b"new-value"))
    third = restore(tmp_path / "log", out, spark=spark)
    assert not third.skipped and third.end_offset == len(ops)
    got = {bytes(r.key): bytes(r.value) for r in spark.read.parquet(str(out)).collect()}
    assert got == model(ops)


def test_restore_as_of_with_json_values(spark, tmp_path):
    ops = build_log(tmp_path / "log", records=800, keys=40, compact_at=())
    out = tmp_path / "table"
    restore(
        tmp_path / "log",
        out,
        spark=spark,
        as_of=400,
        value_format="json",
        value_schema="id INT, balance DOUBLE, name STRING",
        format="json",
    )
    rows = spark.read.json(str(out)).collect()
    expected = {k: json.loads(v) for k, v in model(ops, 400).items()}
    assert {r.id: r.name for r in rows} == {v["id"]: v["name"] for v in expected.values()}


def test_restore_refuses_an_output_that_is_not_a_restore(spark, tmp_path):
    build_log(tmp_path / "log", records=50)
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "data.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="not a compactlog restore"):
        restore(tmp_path / "log", tmp_path / "precious", spark=spark)
    assert (tmp_path / "precious" / "data.txt").read_text() == "keep me"


def test_cli_restore_to_csv(spark, tmp_path):
    ops = build_log(tmp_path / "log", records=300, keys=20)
    result = CliRunner().invoke(
        cli,
        [
            "restore",
            str(tmp_path / "log"),
            "--to",
            str(tmp_path / "csv"),
            "--format",
            "csv",
            "--engine",
            "spark",
        ],
        standalone_mode=False,
    )
    assert result.exception is None, result.output
    assert result.return_value == 0
    rows = spark.read.csv(str(tmp_path / "csv")).collect()
    assert len(rows) == len(model(ops))
    usage = CliRunner().invoke(
        cli,
        ["restore", str(tmp_path / "log"), "--to", str(tmp_path / "x"), "--value-format", "json"],
    )
    assert usage.exit_code == 2 and "--schema" in usage.output


def test_demo_tells_the_whole_story_and_checks_the_table(spark, tmp_path):
    path = tmp_path / "demo" / "log"
    args = ["demo", "--path", str(path), "--updates", "6000", "--keys", "600", "--json"]
    result = CliRunner().invoke(cli, args, standalone_mode=False)
    assert result.exception is None, result.output
    summary = json.loads(result.output)
    assert summary["matches_model"] is True and summary["mismatches"] == 0
    assert summary["rows"] == summary["live_keys"] > 0
    assert summary["snapshot_end_offset"] == 6000
    # a second run replaces what the first made (and only that)
    again = CliRunner().invoke(cli, args, standalone_mode=False)
    assert again.exception is None and json.loads(again.output)["matches_model"] is True


def engine_table(directory, fmt, names):
    """A restored table read with pyarrow (either engine's files), timestamps as ms, sorted
    by key: the form in which the two engines' outputs must be equal."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    if fmt == "csv":
        from pyarrow import csv

        file_format = ds.CsvFileFormat(
            read_options=csv.ReadOptions(column_names=names),
            convert_options=csv.ConvertOptions(column_types={n: pa.string() for n in names}),
        )
    else:
        file_format = fmt
    files = [  # not Spark's empty part files (a CSV without a line has no schema)
        str(p) for p in directory.iterdir() if p.name[0] not in "._" and p.stat().st_size
    ]
    table = ds.dataset(files, format=file_format).to_table()
    columns = {}
    for name in names:
        column = table.column(name)
        if pa.types.is_timestamp(column.type):
            column = column.cast(pa.timestamp("ms")).cast(pa.int64())
        elif pa.types.is_map(column.type):
            column = pa.chunked_array(
                [pa.array([None if m is None else sorted(m) for m in column.to_pylist()])]
            )
        columns[name] = column
    table = pa.table(columns)
    return table.take(pc.sort_indices(table, [("key", "ascending")]))


@pytest.mark.parametrize(
    ("fmt", "value_format", "value_schema"),
    [
        ("parquet", "binary", None),
        ("orc", "string", None),
        ("csv", "binary", None),
        ("parquet", "json", "id INT, balance DOUBLE, name STRING"),
    ],
)
def test_the_arrow_and_spark_engines_write_equal_tables(
    spark, tmp_path, fmt, value_format, value_schema
):
    build_log(tmp_path / "log", records=1500, keys=90)
    with compactlog.open(tmp_path / "log") as log:
        log.append(b"h", b'{"id": 1}', headers={"b": b"2", "a": b"x,y"}, timestamp_ms=1_234_567)
    results = {}
    for engine in ("spark", "arrow"):
        results[engine] = restore(
            tmp_path / "log",
            tmp_path / engine,
            format=fmt,
            value_format=value_format,
            value_schema=value_schema,
            engine=engine,
            spark=spark if engine == "spark" else None,
        )
        assert results[engine].engine == engine
    assert results["spark"].rows == results["arrow"].rows > 0
    names = ["key", "value", "offset", "timestamp", "headers"]
    if value_format == "json":
        names = ["key", "id", "balance", "name", "offset", "timestamp", "headers"]
    spark_table = engine_table(tmp_path / "spark", fmt, names)
    arrow_table = engine_table(tmp_path / "arrow", fmt, names)
    assert spark_table.num_rows == results["arrow"].rows
    assert arrow_table.equals(spark_table)
    for engine in ("spark", "arrow"):
        document = json.loads((tmp_path / engine / RESULT_FILE).read_bytes())
        assert document["engine"] == engine and document["rows"] == results[engine].rows


@pytest.mark.parametrize("value_format, value_schema", [("binary", None), ("json", "id INT")])
def test_the_two_engines_write_one_parquet_schema(spark, tmp_path, value_format, value_schema):
    """Regression: Spark wrote INT96 timestamps (pandas: datetime64[ns]) where the Arrow
    engine writes INT64 microseconds in UTC (pandas: datetime64[us, UTC])."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    build_log(tmp_path / "log", records=300, keys=40)
    schemas, tables = {}, {}
    for engine in ("spark", "arrow"):
        restore(
            tmp_path / "log",
            tmp_path / engine,
            value_format=value_format,
            value_schema=value_schema,
            engine=engine,
            spark=spark if engine == "spark" else None,
        )
        files = sorted(
            p for p in (tmp_path / engine).iterdir() if p.suffix == ".parquet" and p.stat().st_size
        )
        found = {pq.read_schema(p).remove_metadata() for p in files}
        assert len(found) == 1
        schemas[engine] = found.pop()
        table = pq.read_table(files).replace_schema_metadata()
        tables[engine] = table.sort_by("offset")
    assert schemas["spark"].equals(schemas["arrow"]), (schemas["spark"], schemas["arrow"])
    assert schemas["arrow"].field("timestamp").type == pa.timestamp("us", tz="UTC")
    assert tables["spark"].equals(tables["arrow"])
    assert spark.conf.get("spark.sql.parquet.outputTimestampType") == "INT96"  # put back


def test_an_up_to_date_restore_reports_the_engine_that_wrote_it(tmp_path):
    build_log(tmp_path / "log", records=100, keys=10)
    first = restore(tmp_path / "log", tmp_path / "out", engine="arrow")
    again = restore(tmp_path / "log", tmp_path / "out", engine="arrow")
    assert (first.engine, first.skipped) == ("arrow", False)
    assert (again.engine, again.skipped) == ("arrow", True)


def test_an_archive_restores_to_one_table_with_either_engine(spark, tmp_path):
    """``restore(URL)``: the Spark engine reads the archive itself (``archiveSequence``
    naming the manifest the driver pinned), the Arrow engine a local copy of that manifest;
    the same table, recorded under the URL; the archive has not moved until a push with new
    records, and ``as_of`` picks an older manifest."""
    from compactlog.archive import open_store
    from compactlog.archive.push import push_once

    url = f"file://{tmp_path}/archive"
    ops = build_log(tmp_path / "log", records=1500, keys=90)
    first = push_once(str(tmp_path / "log"), open_store(url)).end_offset
    with compactlog.open(tmp_path / "log") as log:
        log.append_batch([(b"customer-%04d" % i, b"late-%d" % i) for i in range(0, 90, 3)])
        ops.extend((b"customer-%04d" % i, b"late-%d" % i) for i in range(0, 90, 3))
    push_once(str(tmp_path / "log"), open_store(url))
    results = {
        engine: restore(
            url, tmp_path / engine, engine=engine, spark=spark if engine == "spark" else None
        )
        for engine in ("spark", "arrow")
    }
    assert results["spark"].rows == results["arrow"].rows == len(model(ops))
    names = ["key", "value", "offset", "timestamp", "headers"]
    spark_table = engine_table(tmp_path / "spark", "parquet", names)
    assert spark_table.equals(engine_table(tmp_path / "arrow", "parquet", names))
    got = dict(zip(spark_table["key"].to_pylist(), spark_table["value"].to_pylist(), strict=True))
    assert got == model(ops)
    for engine in ("spark", "arrow"):
        document = json.loads((tmp_path / engine / RESULT_FILE).read_bytes())
        assert document["source"] == url and document["archive_sequence"] == 1
        assert document["end_offset"] == len(ops) and document["engine"] == engine
    assert restore(url, tmp_path / "spark", spark=spark).skipped  # not moved
    old = restore(url, tmp_path / "old", as_of=first + 10, spark=spark)
    assert old.end_offset == first and old.extra["archive_sequence"] == 0
    old_rows = spark.read.parquet(str(tmp_path / "old")).collect()
    assert {bytes(r.key): bytes(r.value) for r in old_rows} == model(ops, first)
    by_sequence = spark.read.format("compactlog").option("archiveSequence", 0).load(url)
    assert sorted(by_sequence.collect()) == sorted(old_rows)


def test_an_archive_reads_as_the_value_format_its_log_declares(spark, tmp_path):
    from compactlog.archive import open_store
    from compactlog.archive.push import push_once

    url = f"file://{tmp_path}/archive"
    with compactlog.open(tmp_path / "log", value_format="str") as log:
        log.append(b"k", "héllo")
    push_once(str(tmp_path / "log"), open_store(url))
    row = spark.read.format("compactlog").load(url).collect()[0]
    assert row.value == "héllo"
    assert restore(url, tmp_path / "out", spark=spark).value_format == "string"
    missing = spark.read.format("compactlog").option("archiveSequence", 7).load(url)
    with pytest.raises(Exception, match="the archive holds no manifest 7"):
        missing.collect()
