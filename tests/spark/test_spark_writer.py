"""``df.write.format("compactlog")``: a DataFrame into a log, staged by tasks, appended by the
driver.

A round trip keeps keys, values, tombstones, timestamps and headers; overwrite and unknown
columns are refused before anything is written; a failed job leaves the log unchanged and no
staging files; a task that fails once and is retried (``local[2,4]`` in a child process)
leaves every row in the log exactly once. The tasks' encoder makes the batches
``batch_encode.encode_batch`` makes; the commit refuses a damaged staged file, and keys the log
does not allow, before appending anything; staged batches roll segments as
``append_batch`` does.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


# -- the tasks' encoder and the commit's checks (no Spark job: the writer's methods are
# called as a task and the driver would call them) ---------------------------------------

keys_st = st.one_of(st.none(), st.binary(max_size=12))
headers_st = st.one_of(
    st.none(), st.dictionaries(st.text(max_size=4), st.binary(max_size=6), max_size=3)
)
rows_st = st.lists(
    st.tuples(keys_st, keys_st, st.one_of(st.none(), st.integers(0, 1 << 45)), headers_st),
    min_size=1,
    max_size=40,
)


def arrow_table(rows, with_timestamps, with_headers, cut, skip):
    """``rows`` as a normalized table of two chunks (cut at ``cut``), the first sliced
    from ``skip`` dropped rows (Arrow offsets that do not start at 0)."""
    import pyarrow as pa

    padded = [(b"x", b"y", 1, {"p": b"q"})] * skip + rows
    columns = {
        "key": pa.array([r[0] for r in padded], pa.binary()),
        "value": pa.array([r[1] for r in padded], pa.binary()),
    }
    if with_timestamps:
        columns["timestamp"] = pa.array([r[2] for r in padded], pa.int64())
    if with_headers:
        columns["headers"] = pa.array(
            [None if r[3] is None else list(r[3].items()) for r in padded],
            pa.map_(pa.string(), pa.binary()),
        )
    table = pa.table(columns).slice(skip)
    cut = min(cut, len(rows))
    return pa.concat_tables([table.slice(0, cut), table.slice(cut)])


@settings(max_examples=150, deadline=None)
@given(
    rows=rows_st,
    with_timestamps=st.booleans(),
    with_headers=st.booleans(),
    zstd=st.booleans(),
    cut=st.integers(0, 40),
    skip=st.integers(0, 3),
)
def test_the_tasks_encoder_makes_the_batches_encode_batch_makes(
    rows, with_timestamps, with_headers, zstd, cut, skip
):
    """Byte for byte: the batch a task encodes from Arrow buffers is the one
    ``batch_encode.encode_batch`` encodes from the same rows as Python objects."""
    from compactlog.arrow.encode import LogEncoding, encode_table
    from compactlog.encoding.batch_encode import encode_batch
    from compactlog.encoding.format import CODEC_NONE, CODEC_ZSTD

    now = 1_700_000_000_000
    codec = CODEC_ZSTD if zstd else CODEC_NONE
    encoding = LogEncoding(codec, 3, "delete", 1 << 20, 1 << 26)
    table = arrow_table(rows, with_timestamps, with_headers, cut, skip)
    got = encode_table(table, encoding, now)
    stamps = [now if r[2] is None else r[2] for r in rows] if with_timestamps else now
    want = encode_batch(
        [r[0] for r in rows],
        [r[1] for r in rows],
        stamps,
        headers=[r[3] for r in rows] if with_headers else None,
        codec=codec,
        level=3,
    )
    assert got.to_bytes(1234) == want.to_bytes(1234)
    assert (got.largest_record, got.null_keys) == (want.largest_record, want.null_keys)


def stage(path, batches, **log_config):
    """Stage ``batches`` (Arrow) as one task would; returns the writer and its message."""
    from compactlog.arrow.encode import log_encoding
    from compactlog.spark.writer import CompactLogWriter, parse_write_options, start_job

    with compactlog.open(path, update_config=True, **log_config):  # (stored on a log made before)
        pass
    options = parse_write_options({"path": path})
    writer = CompactLogWriter(options, start_job(options.staging_dir), {path: log_encoding(path)})
    return writer, writer.write(iter(batches))


def key_value_batch(n, start=0, with_null_key=False):
    import pyarrow as pa

    keys = [b"key-%06d" % i for i in range(start, start + n)]
    if with_null_key:
        keys[n // 2] = None
    return pa.RecordBatch.from_pydict(
        {
            "key": pa.array(keys, pa.binary()),
            "value": pa.array(
                [hashlib.sha256(b"%d" % i).digest() for i in range(start, start + n)], pa.binary()
            ),
            "timestamp": pa.array(range(start, start + n), pa.int64()),
        }
    )


@pytest.mark.parametrize("damage", ["flip a body byte", "flip a header byte", "truncate"])
def test_a_damaged_staged_file_is_refused_at_commit_and_nothing_is_appended(tmp_path, damage):
    from compactlog.spark.writer import StagedFileError

    path = str(tmp_path / "log")
    with compactlog.open(path) as log:
        log.append(b"a", b"1")
        log.flush()
    # small segments: the file holds many batches, so a damaged last one is found after
    # sound ones (whose views of the mapped file must be released for it to close)
    batches = [key_value_batch(300, 0), key_value_batch(300, 300)]
    writer, message = stage(path, batches, segment_bytes=4096)
    assert len(message.batches) > 3
    second = stage(path, [key_value_batch(10, 600)])[1]  # a sound file of another task
    data = bytearray(Path(message.path).read_bytes())
    if damage == "truncate":
        data = data[:-1]
    else:
        data[-5 if damage == "flip a body byte" else 16 + 30] ^= 0x40
    Path(message.path).write_bytes(bytes(data))
    with pytest.raises(StagedFileError, match="damaged"):
        writer.commit([second, message])
    assert [(r.key, r.value) for r in records(path)] == [(b"a", b"1")]
    writer.abort([second, message])
    assert not os.path.exists(writer.job_dir)


def test_staged_batches_roll_segments_as_append_batch_does(tmp_path):
    """Same rows, same log config: the staged path writes the very segment files (and
    indexes) that ``append_batch`` writes, batches cut to respect ``segment_bytes``."""
    config = {"segment_bytes": 4096, "compression": "zstd", "index_interval_bytes": 1024}
    staged, direct = str(tmp_path / "staged"), str(tmp_path / "direct")
    batches = [key_value_batch(100, start) for start in range(0, 1000, 100)]
    writer, message = stage(staged, batches, **config)
    writer.commit([message])
    with compactlog.open(direct, **config) as log:
        rows = [r for b in batches for r in zip(*b.to_pydict().values(), strict=True)]
        log.append_batch([(k, v) for k, v, _t in rows], timestamps_ms=[t for _k, _v, t in rows])
        log.flush()
    names = sorted(n for n in os.listdir(direct) if n.endswith((".log", ".idx")))
    assert len([n for n in names if n.endswith(".log")]) > 3  # rolled
    assert sorted(n for n in os.listdir(staged) if n.endswith((".log", ".idx"))) == names
    for name in names:
        assert Path(staged, name).read_bytes() == Path(direct, name).read_bytes(), name


def test_a_null_key_on_a_compacted_log_is_refused_with_a_clear_error(spark, tmp_path):
    path = str(tmp_path / "log")
    with compactlog.open(path) as log:
        log.append(b"a", b"1")
        log.flush()
    df = spark.createDataFrame([(b"k1", b"1"), (None, b"2")], "key binary, value binary")
    with pytest.raises(Exception, match="null key: the log is compacted"):
        df.write.format("compactlog").mode("append").save(path)
    assert [(r.key, r.value) for r in records(path)] == [(b"a", b"1")]
    assert staging_leftovers(path) == []


def test_a_value_that_is_not_json_is_refused_on_a_json_log(spark, tmp_path):
    """The Spark writer's tasks encode with append_arrow's encoder, which checks the
    declared formats: a reader of the log would stop at a value that is not JSON."""
    path = str(tmp_path / "log")
    with compactlog.open(path, value_format="json") as log:
        log.append(b"a", 1)
    df = spark.createDataFrame([(b"k1", '{"x": 1}'), (b"k2", "nope")], "key binary, value string")
    with pytest.raises(Exception, match="the value b'nope' is not json"):
        df.write.format("compactlog").mode("append").save(path)
    assert [(r.key, r.value) for r in records(path)] == [(b"a", 1)]
    assert staging_leftovers(path) == []


def test_null_keys_staged_for_a_log_that_became_compacted_are_refused_at_commit(tmp_path):
    from compactlog.errors import InvalidRecordError

    path = str(tmp_path / "log")
    writer, message = stage(
        path, [key_value_batch(50, with_null_key=True)], cleanup_policy="delete"
    )
    with compactlog.open(path) as log:  # as an earlier version let a reopen change the policy
        log.update_meta(config=dataclasses.replace(log.meta.config, cleanup_policy="compact"))
    with pytest.raises(InvalidRecordError, match="no key"):
        writer.commit([message])
    assert records(path) == []
