"""A directory of ``partition-<N>`` logs read and written as one table.

(The key hash is pinned in ``tests/test_routing.py``.) The directory's shape is checked
before writing; written keys land in exactly the log their hash names; a read
of the directory equals the union of its logs, with the ``partition`` column, in changelog
and latest mode.
"""

from __future__ import annotations

import pytest

import compactlog
from compactlog.errors import ConfigError
from compactlog.routing import partition_for
from compactlog.spark.partitioned import (
    is_partitioned,
    list_partitions,
    partition_dir,
    prepare_partitioned,
)


def test_the_directory_shape_is_checked_before_writing(tmp_path):
    table = str(tmp_path / "table")
    prepare_partitioned(table, 3)
    assert [n for n, _d in list_partitions(table)] == [0, 1, 2]
    assert is_partitioned(table)
    prepare_partitioned(table, 3)  # the same count again is fine
    with pytest.raises(ConfigError, match="not numLogs=4"):
        prepare_partitioned(table, 4)
    compactlog.open(tmp_path / "single").close()
    with pytest.raises(ConfigError, match="single log"):
        prepare_partitioned(str(tmp_path / "single"), 2)
    assert not is_partitioned(str(tmp_path / "single"))


def test_written_keys_land_in_their_hashed_log_and_the_directory_reads_as_their_union(
    spark, tmp_path
):
    table = str(tmp_path / "table")
    rows = [(b"key-%d" % (i % 40), b"v%d" % i) for i in range(400)]
    df = spark.createDataFrame(rows, "key binary, value binary").repartition(2)
    df.write.format("compactlog").option("numLogs", 3).mode("append").save(table)

    per_log = {}
    for number, directory in list_partitions(table):
        with compactlog.open(directory, read_only=True) as log:
            per_log[number] = list(log.read())
    assert sorted(per_log) == [0, 1, 2]
    assert sorted((r.key, r.value) for recs in per_log.values() for r in recs) == sorted(rows)
    for number, recs in per_log.items():
        assert all(partition_for(r.key, 3) == number for r in recs)
        assert recs  # 40 keys over 3 logs: none is empty

    changelog = spark.read.format("compactlog").option("mode", "changelog").load(table)
    assert changelog.schema.fieldNames()[-1] == "partition"
    assert changelog.rdd.getNumPartitions() >= 3
    got = sorted((r.partition, r.offset, bytes(r.key), bytes(r.value)) for r in changelog.collect())
    assert got == sorted((n, r.offset, r.key, r.value) for n, recs in per_log.items() for r in recs)

    latest = spark.read.format("compactlog").load(table).collect()
    expected = {}
    for n, recs in per_log.items():
        for r in recs:
            expected[r.key] = (n, r.value)
    assert {bytes(r.key): (r.partition, bytes(r.value)) for r in latest} == expected
    assert len(latest) == 40

    df.write.format("compactlog").option("numLogs", 3).mode("append").save(table)
    assert spark.read.format("compactlog").option("mode", "changelog").load(table).count() == 800
    with compactlog.open(partition_dir(table, 0), read_only=True) as log:
        assert log.end_offset == 2 * len(per_log[0])
