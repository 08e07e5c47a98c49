"""Spark reads of logs that declare a value format: ``valueFormat`` defaults to it."""

from __future__ import annotations

import compactlog
from compactlog.restore.options import parse_options

VALUES = {"a": {"id": 1, "name": "Ada"}, "b": {"id": 2, "name": "Bo"}}


def declared_log(path, value_format: str) -> str:
    with compactlog.open(path, key_format="str", value_format=value_format) as log:
        for key, value in VALUES.items():
            log.append(key, value if value_format == "json" else value["name"])
        log.append("gone", None)
    return str(path)


def test_a_declared_json_value_decodes_with_only_a_value_schema(spark, tmp_path):
    path = declared_log(tmp_path / "log", "json")
    df = spark.read.format("compactlog").option("valueSchema", "id INT, name STRING").load(path)
    assert {bytes(r.key).decode(): {"id": r.id, "name": r.name} for r in df.collect()} == VALUES
    # without a schema Spark cannot parse JSON: the value is its text
    text = spark.read.format("compactlog").load(path)
    assert dict(text.select("key", "value").dtypes) == {"key": "binary", "value": "string"}
    assert {bytes(r.key).decode(): r.value for r in text.collect()} == {
        "a": '{"id":1,"name":"Ada"}',
        "b": '{"id":2,"name":"Bo"}',
    }
    # an explicit valueFormat still wins
    raw = spark.read.format("compactlog").option("valueFormat", "binary").load(path)
    assert dict(raw.dtypes)["value"] == "binary"


def test_a_declared_str_value_reads_as_a_string(spark, tmp_path):
    path = declared_log(tmp_path / "log", "str")
    df = spark.read.format("compactlog").load(path)
    assert {bytes(r.key).decode(): r.value for r in df.collect()} == {"a": "Ada", "b": "Bo"}


def test_the_default_value_format_follows_the_declared_one(tmp_path):
    json_log = declared_log(tmp_path / "json", "json")
    str_log = declared_log(tmp_path / "str", "str")
    compactlog.open(tmp_path / "plain").close()
    assert parse_options({"path": json_log}).value_format == "string"
    assert parse_options({"path": json_log, "valueSchema": "id INT"}).value_format == "json"
    assert parse_options({"path": str_log}).value_format == "string"
    assert parse_options({"path": str(tmp_path / "plain")}).value_format == "binary"
    assert parse_options({"path": str(tmp_path / "missing")}).value_format == "binary"
    # a directory of partition-N logs: its first log's declaration
    declared_log(tmp_path / "table" / "partition-0", "str")
    assert parse_options({"path": str(tmp_path / "table")}).value_format == "string"
