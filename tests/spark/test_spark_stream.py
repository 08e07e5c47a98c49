"""``spark.readStream.format("compactlog")``: log offsets as stream offsets.

The reader's offset logic is checked without Spark first (starting offsets, admission
control, AvailableNow's target, retention's skip note, a replay after compaction); then real
streaming queries: AvailableNow with ``maxRecordsPerTrigger`` stops at the end seen at start
and a restart picks up the rest; and a query over a log that another process appends to
while the cleaner compacts it, stopped and restarted from its checkpoint, ends with a
changelog sink equal to the log's records and an upserted table equal to the latest-value
model.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

import compactlog
from compactlog.errors import ConfigError
from compactlog.restore.options import parse_options
from compactlog.restore.ranges import split_range
from compactlog.spark.partitioned import prepare_partitioned
from compactlog.spark.stream import current_table, make_stream_reader, upsert_into_parquet
from compactlog.storage.segment import list_segments, segment_path

REPO = Path(__file__).resolve().parents[2]

CHANGELOG = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("headers", MapType(StringType(), BinaryType())),
        StructField("deleted", BooleanType()),
    ]
)


def op(i):
    """The i-th record every writer in this module appends (offset i in a fresh log)."""
    return b"k%d" % (i % 97), None if i % 13 == 0 else b"v%d" % i


def write_ops(path, lo, hi, **config):
    with compactlog.open(path, segment_bytes=4096, min_compaction_lag_ms=0, **config) as log:
        for start in range(lo, hi, 50):
            log.append_batch([op(i) for i in range(start, min(start + 50, hi))])
        log.flush()


def reader(path, **options):
    raw = {"path": str(path), "mode": "changelog", **{k: str(v) for k, v in options.items()}}
    return make_stream_reader(raw, parse_options(raw), CHANGELOG)


def read_range(stream, start, end):
    rows = []
    for partition in stream.partitions({"offset": start}, {"offset": end}):
        for batch in stream.read(partition):
            rows.extend(batch.to_pylist())
    return rows


# -- the offset logic, without Spark ------------------------------------------------------


def test_starting_offsets_earliest_latest_and_a_number(tmp_path):
    write_ops(tmp_path / "log", 0, 300)
    assert reader(tmp_path / "log").initialOffset() == {"offset": 0}
    assert reader(tmp_path / "log", startingOffsets="latest").initialOffset() == {"offset": 300}
    assert reader(tmp_path / "log", startingOffsets=120).initialOffset() == {"offset": 120}
    with pytest.raises(ConfigError, match="startingOffsets"):
        reader(tmp_path / "log", startingOffsets="yesterday").initialOffset()


def test_a_stream_is_in_changelog_mode_by_default_and_refuses_latest_and_a_missing_log(tmp_path):
    """A refused stream raises at the query's first call, not from ``streamReader`` (where
    PySpark would report an ``UnboundLocalError`` instead)."""
    write_ops(tmp_path / "log", 0, 10)
    raw = {"path": str(tmp_path / "log")}
    default = make_stream_reader(raw, parse_options(raw), CHANGELOG)
    assert default.initialOffset() == {"offset": 0}
    assert len(read_range(default, 0, 10)) == 10  # every record, the tombstone too
    latest = {**raw, "mode": "latest"}
    refused = make_stream_reader(latest, parse_options(latest), CHANGELOG)
    with pytest.raises(ConfigError, match="mode=latest cannot be streamed"):
        refused.initialOffset()
    with pytest.raises(compactlog.CompactLogError):
        reader(tmp_path / "missing").initialOffset()
    prepare_partitioned(str(tmp_path / "table"), 2)
    with pytest.raises(ConfigError, match="one query per partition"):
        reader(tmp_path / "table").initialOffset()


def test_admission_control_and_the_available_now_target(tmp_path):
    path = tmp_path / "log"
    write_ops(path, 0, 1000)
    stream = reader(path, maxRecordsPerTrigger=300)
    assert stream.getDefaultReadLimit() == ReadMaxRows(300)
    assert stream.latestOffset({"offset": 0}, ReadMaxRows(300)) == {"offset": 300}
    assert stream.latestOffset({"offset": 900}, ReadMaxRows(300)) == {"offset": 1000}
    assert stream.latestOffset({"offset": 0}, ReadAllAvailable()) == {"offset": 1000}
    assert stream.latestOffset({"offset": 1000}, ReadMaxRows(300)) == {"offset": 1000}
    assert len(read_range(stream, 0, 300)) == 300
    stream.prepareForTriggerAvailableNow()
    write_ops(path, 1000, 1200)
    assert stream.latestOffset({"offset": 900}, ReadAllAvailable()) == {"offset": 1000}
    assert stream.reportLatestOffset() == {"offset": 1200}


def test_max_records_counts_records_so_a_compacted_range_costs_no_empty_trigger(tmp_path):
    """Below the cleaner point a range of offsets may hold no record at all. A stream that
    cut its micro-batches by offsets alone spent its triggers on such emptied ranges, and
    behind a log appended faster than that it never caught up: every batch came out empty
    (the appended-and-compacted query below, on pyspark 4.3 or a loaded machine)."""
    path = tmp_path / "log"
    write_ops(path, 0, 5000)
    with compactlog.open(path, min_compaction_lag_ms=0) as log:
        log.compact(force=True)
    write_ops(path, 5000, 5700)  # past the cleaner point: one record per offset
    stream = reader(path, maxRecordsPerTrigger=300)
    batches, position = [], 0
    while (end := stream.latestOffset({"offset": position}, ReadMaxRows(300))["offset"]) > position:
        batches.append(read_range(stream, position, end))
        position = end
    with compactlog.open(path, read_only=True) as log:
        in_log = [r.offset for r in log.read()]
    assert [r["offset"] for batch in batches for r in batch] == in_log
    assert [len(batch) for batch in batches[:-1]] == [300] * (len(batches) - 1)
    assert 0 < len(batches[-1]) <= 300
    # a start inside the compacted part (mid-batch): still never more than the limit
    for start in range(0, 5000, 613):
        end = stream.latestOffset({"offset": start}, ReadMaxRows(50))["offset"]
        assert 0 < len(read_range(stream, start, end)) <= 50


def test_a_start_below_the_log_start_resumes_there_and_says_so(tmp_path, caplog):
    path = tmp_path / "log"
    write_ops(path, 0, 2000, retention_ms=1, cleanup_policy="compact,delete")
    with compactlog.open(path) as log:
        log.enforce_retention(now_ms=int(time.time() * 1000) + 10_000)
        log_start = log.start_offset
    assert log_start > 0
    stream = reader(path, startingOffsets=0)
    with caplog.at_level("WARNING", logger="compactlog.spark.stream"):
        end = stream.latestOffset({"offset": 0}, ReadMaxRows(100))
    assert end == {"offset": log_start + 100, "skippedFrom": 0, "skippedTo": log_start}
    assert "below the log start" in caplog.text
    rows = read_range(stream, 0, end["offset"])
    assert [r["offset"] for r in rows] == list(range(log_start, log_start + 100))


def test_a_replay_after_compaction_gives_a_subset_with_the_same_latest_values(tmp_path):
    path = tmp_path / "log"
    write_ops(path, 0, 3000)
    stream = reader(path, numPartitions=3)
    first = read_range(stream, 500, 2500)
    assert [r["offset"] for r in first] == list(range(500, 2500))
    assert all((r["key"], r["value"]) == op(r["offset"]) for r in first)
    with compactlog.open(path, min_compaction_lag_ms=0) as log:
        log.compact(force=True)
    replay = read_range(stream, 500, 2500)
    assert len(replay) < len(first)
    assert {r["offset"] for r in replay} <= {r["offset"] for r in first}
    # only records superseded by a later record of their key are gone, so an upsert of the
    # whole stream still ends with every key's latest value
    last_offset = {op(i)[0]: i for i in range(3000)}
    missing = {r["offset"] for r in first} - {r["offset"] for r in replay}
    assert all(last_offset[op(o)[0]] > o for o in missing)


def test_a_micro_batch_is_split_in_equal_shares_cut_inside_segments(tmp_path):
    path = tmp_path / "log"
    write_ops(path, 0, 3000)
    bases = list_segments(str(path))
    assert len(bases) > 10
    # a range over a few segments whose bounds fall mid-segment: cutting only between
    # segments could not make two equal halves
    start, end = bases[2] + 7, bases[5] + 11
    stream = reader(path, numPartitions=2)
    parts = stream.partitions({"offset": start}, {"offset": end})
    assert [(p.start, p.end) for p in parts] == [(start, parts[0].end), (parts[0].end, end)]
    assert parts[0].end not in bases  # the cut is inside a segment
    sizes = [p.end - p.start for p in parts]
    assert abs(sizes[0] - sizes[1]) <= 0.05 * (end - start)
    rows = [r["offset"] for p in parts for b in stream.read(p) for r in b.to_pylist()]
    assert rows == list(range(start, end))  # together exactly the range, in order


def test_the_split_follows_bytes_on_a_compacted_log_and_covers_the_range(tmp_path):
    path = tmp_path / "log"
    write_ops(path, 0, 3000)
    with compactlog.open(path, min_compaction_lag_ms=0) as log:
        log.compact(force=True)  # the tail now holds few records per offset
    write_ops(path, 3000, 4500)  # a dirty head: one record per offset
    stream = reader(path, numPartitions=3)
    parts = stream.partitions({"offset": 0}, {"offset": 4500})
    assert len(parts) == 3 and parts[0].start == 0 and parts[-1].end == 4500
    assert all(a.end == b.start for a, b in itertools.pairwise(parts))
    counts = [sum(b.num_rows for b in stream.read(p)) for p in parts]
    # by offsets the first third would hold the ~100 survivors of 1500 offsets and the
    # others 1000 records each; by bytes each task gets about a third of the records
    assert max(counts) <= 1.5 * min(counts), counts
    with compactlog.open(path, read_only=True) as log:
        assert sum(counts) == sum(1 for _ in log.read())


def test_a_segment_swapped_away_while_planning_only_skews_the_split(tmp_path, monkeypatch):
    path = tmp_path / "log"
    write_ops(path, 0, 2000)
    gone = segment_path(str(path), list_segments(str(path))[3])
    real = os.path.getsize

    def getsize(name):
        if name == gone:
            raise FileNotFoundError(name)
        return real(name)

    monkeypatch.setattr(os.path, "getsize", getsize)
    assert [(p.start, p.end) for p in split_range(str(path), 0, 2000, 1)] == [(0, 2000)]
    parts = split_range(str(path), 0, 2000, 4)
    assert parts[0].start == 0 and parts[-1].end == 2000
    assert all(a.end == b.start for a, b in itertools.pairwise(parts))
    assert split_range(str(path), 500, 500, 4) == []


# -- real streaming queries ---------------------------------------------------------------


def test_available_now_respects_max_records_and_a_restart_reads_the_rest(spark, tmp_path):
    path, checkpoint = str(tmp_path / "log"), str(tmp_path / "checkpoint")
    write_ops(path, 0, 2500)
    seen: list[tuple[int, list[int]]] = []

    def collect(df, batch_id):
        seen.append((batch_id, sorted(r.offset for r in df.select("offset").collect())))
        if batch_id == 0:
            write_ops(path, 2500, 2800)  # arrives after the query started: not in this run

    def run():
        query = (
            spark.readStream.format("compactlog")
            .option("mode", "changelog")
            .option("maxRecordsPerTrigger", 1000)
            .load(path)
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert not query.isActive

    run()
    assert [(b, len(o)) for b, o in seen] == [(0, 1000), (1, 1000), (2, 500)]
    assert [o for _b, offsets in seen for o in offsets] == list(range(2500))
    seen.clear()
    run()  # restarted from the checkpoint: only what came later
    assert [(b, o) for b, o in seen] == [(3, list(range(2500, 2800)))]


APPENDER = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, sys.argv[3])
    import compactlog
    from tests.spark.test_spark_stream import op
    path, finish = sys.argv[1], sys.argv[2]
    end = 1500
    # one open for the whole run, as an application does (see the note in the test)
    with compactlog.open(path) as log:
        while not os.path.exists(finish):  # append until the test says stop
            log.append_batch([op(i) for i in range(end, end + 100)])
            log.flush()
            end += 100
            time.sleep(0.1)
    """
)


def progress_with_rows(query):
    return sum(1 for p in query.recentProgress if p["numInputRows"])


def wait_for_batches(query, count, timeout=120):
    deadline = time.monotonic() + timeout
    while progress_with_rows(query) < count and time.monotonic() < deadline:
        time.sleep(0.2)
    assert progress_with_rows(query) >= count, query.exception()


def test_a_stream_over_a_log_being_appended_and_compacted_survives_a_restart(spark, tmp_path):
    path = str(tmp_path / "log")
    checkpoint, changes, table = (str(tmp_path / n) for n in ("checkpoint", "changes", "table"))
    finish = tmp_path / "finish"
    write_ops(path, 0, 1500)
    # The appender opens the log once: re-opening it in a loop while this process compacts
    # fails now and then in recover_on_open (an index whose segment the cleaner just
    # released), an engine race outside this test's subject, reported separately.
    appender = subprocess.Popen(
        [sys.executable, "-c", APPENDER, path, str(finish), str(REPO)], cwd=str(REPO)
    )
    stop_compacting = threading.Event()
    passes = []

    def compact_while_appending():
        with compactlog.open(path, min_compaction_lag_ms=0) as log:
            while not stop_compacting.is_set():
                passes.append(log.compact(force=True))
                time.sleep(0.5)

    compactor = threading.Thread(target=compact_while_appending)
    compactor.start()

    def sink(df, batch_id):
        # the changelog sink: one directory per batch, overwritten by a replay (idempotent)
        df.write.mode("overwrite").parquet(os.path.join(changes, f"batch={batch_id}"))
        upsert_into_parquet(df, batch_id, table)

    def start(trigger):
        return (
            spark.readStream.format("compactlog")
            .option("mode", "changelog")
            .option("maxRecordsPerTrigger", 2000)
            .load(path)
            .writeStream.foreachBatch(sink)
            .option("checkpointLocation", checkpoint)
            .trigger(**trigger)
            .start()
        )

    try:
        query = start({"processingTime": "0.5 seconds"})
        wait_for_batches(query, 2)
        query.stop()  # possibly mid-batch: the restart replays it
        assert appender.poll() is None  # appends go on while the query is down
        query = start({"processingTime": "0.5 seconds"})  # restarted from the checkpoint
        wait_for_batches(query, 1)
        query.stop()
    finally:
        finish.touch()
        assert appender.wait(timeout=60) == 0
        stop_compacting.set()
        compactor.join()
    assert len(passes) >= 2
    query = start({"availableNow": True})  # drain what is left
    query.awaitTermination(180)
    assert query.exception() is None

    with compactlog.open(path, read_only=True) as log:
        in_log = {r.offset: (r.key, r.value) for r in log.read()}
        total = log.end_offset
    assert total > 1500
    streamed = pq.read_table(changes).to_pylist()
    offsets = [r["offset"] for r in streamed]
    assert len(offsets) == len(set(offsets))  # no duplicates, replays included
    assert set(in_log) <= set(offsets)  # every record still in the log was streamed
    assert all((r["key"], r["value"]) == op(r["offset"]) for r in streamed)
    assert all(r["deleted"] == (r["value"] is None) for r in streamed)
    model = {}
    for i in range(total):
        key, value = op(i)
        if value is None:
            model.pop(key, None)
        else:
            model[key] = value
    upserted = pq.read_table(current_table(table)).to_pylist()
    assert {r["key"]: r["value"] for r in upserted} == model
    assert len(upserted) == len(model)
