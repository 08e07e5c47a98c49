"""``Log.append_arrow``, ``read_arrow`` and ``latest_arrow``: Arrow in and out, columnar."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import compactlog
from compactlog.errors import ConfigError, InvalidRecordError, RecordTooLargeError

HEADERS = pa.map_(pa.string(), pa.binary())
NOW = 1_700_000_000_000


def open_log(path, **config):
    return compactlog.open(path, clock=lambda: NOW, **config)


def table_rows(table):
    stamps = table.column("timestamp").cast(pa.int64()).to_pylist()  # ms since the epoch
    rows = []
    for row, stamp in zip(table.to_pylist(), stamps, strict=True):
        headers = dict(row["headers"]) if row["headers"] is not None else None
        rows.append((row["offset"], row["key"], row["value"], stamp, headers))
    return rows


def record_rows(log):
    return [(r.offset, r.key, r.value, r.timestamp, r.headers or None) for r in log.read()]


record = st.tuples(
    st.binary(max_size=12),
    st.none() | st.binary(max_size=40),
    st.none() | st.integers(0, 2**41),
    st.none() | st.dictionaries(st.text(max_size=4), st.binary(max_size=6), max_size=2),
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=st.lists(record, max_size=60), zstd=st.booleans())
def test_append_arrow_then_read_arrow_round_trips_every_column(tmp_path_factory, rows, zstd):
    path = tmp_path_factory.mktemp("log")
    table = pa.table(
        {
            "key": pa.array([r[0] for r in rows], pa.binary()),
            "value": pa.array([r[1] for r in rows], pa.binary()),
            "timestamp": pa.array([r[2] for r in rows], pa.int64()),
            "headers": pa.array(
                [None if r[3] is None else list(r[3].items()) for r in rows], HEADERS
            ),
        }
    )
    with open_log(path, compression="zstd" if zstd else "none") as log:
        offsets = log.append_arrow(table)
        assert offsets == range(0, len(rows))
        want = [
            (i, k, v, NOW if t is None else t, h or None) for i, (k, v, t, h) in enumerate(rows)
        ]
        assert record_rows(log) == want  # what the log holds, read as records
        got = log.read_arrow()
        assert got.schema == log.read_arrow(0, 0).schema
        assert table_rows(got) == want  # and read back as Arrow


def test_append_arrow_writes_the_bytes_append_batch_writes(tmp_path):
    keys = [b"k%05d" % (i % 700) for i in range(3000)]
    values = [None if i % 11 == 0 else b"v" * (i % 50) for i in range(3000)]
    with open_log(tmp_path / "a") as log:
        log.append_batch(list(zip(keys, values, strict=True)))
    with open_log(tmp_path / "b") as log:
        log.append_arrow(pa.table({"key": keys, "value": pa.array(values, pa.binary())}))
    segments = sorted(n for n in os.listdir(tmp_path / "a") if n.endswith(".log"))
    assert segments == sorted(n for n in os.listdir(tmp_path / "b") if n.endswith(".log"))
    for name in segments:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_a_record_batch_strings_large_and_view_types_and_timestamp_units_are_taken(tmp_path):
    stamp = pa.array([NOW * 1000 + 999], pa.timestamp("us", tz="Europe/Paris"))
    inputs = [
        pa.record_batch({"key": pa.array(["a"]), "value": pa.array(["1"])}),
        pa.table(
            {
                "KEY": pa.array([b"b"], pa.large_binary()),
                "Value": pa.array(["2"], pa.large_string()),
            }
        ),
        pa.table(
            {"key": pa.array(["c"], pa.string_view()), "value": pa.array([b"3"], pa.binary_view())}
        ),
        pa.table({"key": [b"d"], "value": [b"4"], "timestamp": stamp}),
        pa.table({"key": [b"e"], "value": [b"5"], "timestamp": pa.array([7], pa.timestamp("s"))}),
        pa.table(
            {"key": [b"f"], "value": [b"6"], "timestamp": pa.array([8_000_000], pa.timestamp("ns"))}
        ),
        pa.table({"key": [b"g"], "value": pa.nulls(1)}),
        pa.table(
            {
                "key": [b"h"],
                "value": [b"8"],
                "headers": pa.array([[("x", "text")]], pa.map_(pa.string(), pa.string())),
            }
        ),
    ]
    with open_log(tmp_path / "log") as log:
        for data in inputs:
            log.append_arrow(data)
        assert record_rows(log) == [
            (0, b"a", b"1", NOW, None),
            (1, b"b", b"2", NOW, None),
            (2, b"c", b"3", NOW, None),
            (3, b"d", b"4", NOW, None),  # sub-millisecond part cut, time zone irrelevant
            (4, b"e", b"5", 7000, None),
            (5, b"f", b"6", 8, None),
            (6, b"g", None, NOW, None),  # a null value: a tombstone
            (7, b"h", b"8", NOW, {"x": b"text"}),
        ]


def test_large_values_round_trip_and_roll_segments(tmp_path):
    big = [os.urandom(300_000) for _ in range(8)]
    with open_log(tmp_path / "log", segment_bytes=1 << 20, max_record_bytes=1 << 20) as log:
        log.append_arrow(pa.table({"key": [b"k%d" % i for i in range(8)], "value": big}))
        assert len(log.get_segments()) > 1
        table = log.read_arrow()
        assert table.column("value").to_pylist() == big
        with pytest.raises(RecordTooLargeError, match="max_record_bytes"):
            log.append_arrow(pa.table({"key": [b"x"], "value": [b"v" * (1 << 20)]}))
        assert log.end_offset == 8


def test_an_empty_table_appends_nothing_and_an_empty_log_reads_as_an_empty_table(tmp_path):
    with open_log(tmp_path / "log") as log:
        assert log.append_arrow(
            pa.table({"key": pa.array([], pa.binary()), "value": pa.array([], pa.binary())})
        ) == range(0, 0)
        assert log.end_offset == 0
        for table in (log.read_arrow(), log.latest_arrow()):
            assert table.num_rows == 0
            assert table.schema.names == ["key", "value", "offset", "timestamp", "headers"]


@pytest.mark.parametrize(
    ("data", "error", "message"),
    [
        (
            pa.table({"key": [1], "value": [b"v"]}),
            ConfigError,
            "column key must be binary or string",
        ),
        (pa.table({"key": [b"k"]}), ConfigError, "no 'value' column"),
        (pa.table({"key": [b"k"], "value": [b"v"], "extra": [1]}), ConfigError, "extra"),
        (
            pa.table({"key": [b"k"], "value": [b"v"], "timestamp": [1.5]}),
            ConfigError,
            "column timestamp must be",
        ),
        (
            pa.table({"key": [b"k"], "value": [b"v"], "headers": [b"h"]}),
            ConfigError,
            "column headers must be",
        ),
        (
            pa.table({"key": [b"k"], "value": [b"v"], "timestamp": [-5]}),
            InvalidRecordError,
            "before 1970",
        ),
        (
            pa.table({"key": pa.array([b"k", None]), "value": [b"v", b"w"]}),
            InvalidRecordError,
            "null key",
        ),
        (
            {"key": [b"k"], "value": [b"v"]},
            InvalidRecordError,
            "pyarrow.Table or pyarrow.RecordBatch",
        ),
    ],
)
def test_bad_input_is_refused_naming_the_problem_and_nothing_is_written(
    tmp_path, data, error, message
):
    with open_log(tmp_path / "log") as log:
        log.append(b"before", b"1")
        with pytest.raises(error, match=message):
            log.append_arrow(data)
        assert log.end_offset == 1 and [r.key for r in log.read()] == [b"before"]


def test_null_keys_are_taken_by_a_log_that_is_not_compacted(tmp_path):
    with open_log(tmp_path / "log", cleanup_policy="delete") as log:
        log.append_arrow(pa.table({"key": pa.array([None, b"k"]), "value": [b"v", b"w"]}))
        assert [r.key for r in log.read()] == [None, b"k"]
        assert log.read_arrow().column("key").to_pylist() == [None, b"k"]


def test_read_arrow_takes_a_range_and_outlives_the_log(tmp_path):
    with open_log(tmp_path / "log", segment_bytes=4096) as log:
        for i in range(0, 2000, 100):
            log.append_batch([(b"k%d" % (j % 300), b"v%d" % j) for j in range(i, i + 100)])
        log.flush()
        part = log.read_arrow(250, 1250)
        whole = log.read_arrow()
        want = record_rows(log)
    assert part.column("offset").to_pylist() == list(range(250, 1250))
    assert table_rows(whole) == want  # readable after close: no view of a segment's memory


def test_latest_arrow_is_latest_as_a_table_before_and_after_compaction(tmp_path):
    with open_log(tmp_path / "log", segment_bytes=4096, min_compaction_lag_ms=0) as log:
        for i in range(0, 3000, 50):
            log.append_batch(
                [
                    (b"k%03d" % (j * 37 % 400), None if j % 13 == 0 else b"v%d" % j)
                    for j in range(i, i + 50)
                ]
            )
        for as_of in (None, 1700):
            want = [(r.offset, r.key, r.value) for r in log.latest(as_of)]
            table = log.latest_arrow(as_of)
            got = list(
                zip(*(table.column(c).to_pylist() for c in ("offset", "key", "value")), strict=True)
            )
            assert got == want and len(want) > 0
        log.flush()
        log.compact(force=True)
        want = [(r.offset, r.key, r.value) for r in log.latest()]
        table = log.latest_arrow()
        assert table.column("offset").to_pylist() == [w[0] for w in want]
        assert table.column("value").null_count == 0


# -- declared formats ---------------------------------------------------------------------

ROWS = [("user:1", {"name": "Ada", "age": 36}), ("user:2", {"name": "\u00e9"}), ("user:3", None)]


def json_log(path):
    log = open_log(path, key_format="str", value_format="json")
    for key, value in ROWS:
        log.append(key, value)
    return log


def test_read_arrow_gives_declared_formats_their_types(tmp_path):
    """Regression: every column was binary, whatever the log declared."""
    with json_log(tmp_path / "log") as log:
        for table in (log.read_arrow(), log.latest_arrow()):
            assert table.schema.field("key").type == pa.string()
            assert table.schema.field("value").type == pa.string()  # the JSON text
        assert log.read_arrow().column("key").to_pylist() == ["user:1", "user:2", "user:3"]
        values = log.read_arrow().column("value").to_pylist()
        assert values == ['{"name":"Ada","age":36}', '{"name":"\u00e9"}', None]
    with compactlog.open(tmp_path / "log", raw=True) as raw:
        assert raw.read_arrow().schema.field("value").type == pa.binary()
    with open_log(tmp_path / "plain") as plain:
        plain.append(b"k", b"\xff")
        assert plain.read_arrow().schema == compactlog.arrow.convert.RECORD_SCHEMA


def test_a_json_log_reads_into_a_struct_type(tmp_path):
    person = pa.struct([("name", pa.string()), ("age", pa.int32())])
    with json_log(tmp_path / "log") as log:
        table = log.read_arrow(value_type=person)
        assert table.schema.field("value").type == person
        assert table.column("value").to_pylist() == [
            {"name": "Ada", "age": 36},
            {"name": "\u00e9", "age": None},
            None,
        ]
        assert log.latest_arrow(value_type=person).num_rows == 2  # (the tombstone's key is gone)
    with open_log(tmp_path / "bytes") as log, pytest.raises(InvalidRecordError, match="struct"):
        log.read_arrow(value_type=person)


def test_a_str_log_that_holds_bad_utf8_names_the_offset(tmp_path):
    with open_log(tmp_path / "log", raw=True, value_format="str") as log:
        log.append_batch([(b"a", b"ok"), (b"b", b"\xff")])
    with (
        open_log(tmp_path / "log") as log,
        pytest.raises(compactlog.errors.ValueDecodeError, match="offset 1"),
    ):
        log.read_arrow()


@pytest.mark.parametrize(
    "declared, column, value, message",
    [
        (
            {"value_format": "json"},
            "value",
            b"not json",
            "row 1: the value b'not json' is not json",
        ),
        ({"value_format": "json"}, "value", "", "row 1: the value b'' is not json"),
        ({"value_format": "str"}, "value", b"\xff", "row 1: the value b'\\\\xff' is not str"),
        ({"key_format": "str"}, "key", b"\xfe", "row 1: the key b'\\\\xfe' is not str"),
        ({"key_format": "json"}, "key", "k", "row 1: the key b'k' is not json"),
    ],
)
def test_append_arrow_refuses_what_the_declared_format_cannot_decode(
    tmp_path, declared, column, value, message
):
    """Regression: append_arrow stored non-JSON values on a json log; a table following
    it then stopped for good."""
    good = {"key": '"k"' if declared.get("key_format") == "json" else "k", "value": "[1]"}
    rows = {"key": [good["key"], good["key"]], "value": [good["value"], good["value"]]}
    rows[column][1] = value
    data = pa.table({name: pa.array(items) for name, items in rows.items()})
    with open_log(tmp_path / "log", **declared) as log:
        with pytest.raises(InvalidRecordError, match=message):
            log.append_arrow(data)
        assert log.end_offset == 0
        rows[column][1] = rows[column][0]
        assert log.append_arrow(pa.table(rows)) == range(0, 2)
        tombstone = pa.table({"key": [good["key"]], "value": pa.array([None], pa.string())})
        assert log.append_arrow(tombstone) == range(2, 3)
