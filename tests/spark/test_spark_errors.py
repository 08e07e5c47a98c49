"""What a Spark user sees of a mistake (issue 18, item 5): our message right after Spark's
prefix, not a Python traceback, when reading, in a writing task and in the driver's commit;
a ``valueSchema`` error that quotes the user's text; a stream that is a changelog by
default and refuses ``mode=latest`` with our message (not PySpark's
``UnboundLocalError``)."""

from __future__ import annotations

import pytest

import compactlog


@pytest.fixture
def log_path(tmp_path):
    path = tmp_path / "log"
    with compactlog.open(str(path)) as log:
        log.append(b"a", b'{"n": 1}')
        log.append(b"b", b'{"n": 2}')
        log.append(b"a", None)
    return str(path)


def first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0]


def test_an_unknown_option_is_our_message_first_with_a_suggestion(spark, log_path):
    with pytest.raises(Exception) as caught:
        spark.read.format("compactlog").option("valuefromat", "json").load(log_path).collect()
    line = first_line(caught.value)
    assert "Traceback" not in line
    assert "unknown compactlog option(s) valuefromat (known: " in line
    assert line.endswith("did you mean valueFormat?")


def test_a_bad_value_schema_names_the_users_text_not_the_built_schema(spark, log_path):
    reader = spark.read.format("compactlog").option("valueFormat", "json")
    with pytest.raises(Exception) as caught:
        reader.option("valueSchema", "n int, m strin").load(log_path).collect()
    line = first_line(caught.value)
    assert "Traceback" not in line
    assert "option valueSchema 'n int, m strin'" in line and "did you mean string?" in line
    assert "BINARY" not in str(caught.value)  # not the schema built around the user's fields


def our_line(error: BaseException) -> str:
    """The line naming our exception, checked to come with no Python traceback (whatever
    Spark's own prefix says)."""
    text = str(error)
    assert "Traceback (most recent call last)" not in text, text[:2000]
    lines = [line for line in text.splitlines() if "compactlog.errors." in line]
    assert lines, text[:2000]
    return lines[0][lines[0].index("compactlog.errors.") :]


def test_a_task_refusing_rows_is_our_message_not_a_traceback(spark, log_path):
    df = spark.createDataFrame([(None, b"v")], "key binary, value binary")
    with pytest.raises(Exception) as caught:
        df.write.format("compactlog").mode("append").save(log_path)
    line = our_line(caught.value)
    assert line.startswith("compactlog.errors.InvalidRecordError: "), line
    assert "1 row(s) with a null key: the log is compacted" in line


@pytest.mark.parametrize("partitioned", [False, True])
def test_a_commit_refused_by_the_log_is_our_message_not_a_traceback(spark, tmp_path, partitioned):
    path = str(tmp_path / "held")
    target = f"{path}/partition-0" if partitioned else path
    df = spark.createDataFrame([(b"k", b"v")], "key binary, value binary")
    writer = df.write.format("compactlog").mode("append")
    if partitioned:
        writer = writer.option("numLogs", 1)
    compactlog.open(target).close()
    with compactlog.open(target, exclusive=True), pytest.raises(Exception) as caught:
        writer.save(path)  # the driver's commit cannot open the log for writing
    line = our_line(caught.value)
    assert line.startswith("compactlog.errors.LogLockedError: "), line
    assert "open for writing with exclusive=True by another process" in line


def run_stream(spark, log_path, name, **options):
    df = spark.readStream.format("compactlog").options(**options).load(log_path)
    query = df.writeStream.format("memory").queryName(name).trigger(availableNow=True).start()
    try:
        query.awaitTermination()
    finally:
        query.stop()
    return spark.sql(f"select * from {name} order by offset").collect()


def test_a_stream_is_a_changelog_by_default(spark, log_path):
    rows = run_stream(spark, log_path, "default_stream")
    assert [(r.key, r.value) for r in rows] == [
        (b"a", b'{"n": 1}'),
        (b"b", b'{"n": 2}'),
        (b"a", None),  # the tombstone: every record, as in changelog mode
    ]


def test_a_stream_with_mode_latest_fails_with_our_message(spark, log_path):
    with pytest.raises(Exception) as caught:
        run_stream(spark, log_path, "latest_stream", mode="latest")
    text = str(caught.value)
    assert "UnboundLocalError" not in text
    assert "compactlog.errors.ConfigError: option mode=latest cannot be streamed" in text
    assert "Traceback" not in text.split("ConfigError")[0]
