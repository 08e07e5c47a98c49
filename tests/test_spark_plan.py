"""The Spark data source's planning and Arrow conversion, without starting Spark.

What every Spark read returns is decided here: the snapshot read, the offset range, the
partitions and, per partition, the records kept. These tests run the same functions the
Spark tasks run (``plan_read``, ``read_partition``, ``to_arrow``) against a dict model,
so latest-per-key across partitions is checked on many logs quickly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import compactlog
from compactlog.arrow.convert import Layout, ValueDecodeError, to_arrow
from compactlog.errors import ConfigError
from compactlog.restore.options import parse_options
from compactlog.restore.plan import (
    IMPLICIT_SNAPSHOTS,
    InexactReadError,
    plan_read,
    read_partition,
    resolve_snapshot,
)
from compactlog.restore.ranges import records_end

BINARY_LAYOUT = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
        ("headers", pa.map_(pa.string(), pa.binary())),
        ("deleted", pa.bool_()),
    ]
)


def read_all(path, **options):
    """Every row all partitions of a plan return, as Python dicts, plus the plan."""
    raw = {"path": str(path), **{k: str(v) for k, v in options.items()}}
    plan = plan_read(parse_options(raw))
    layout = Layout(BINARY_LAYOUT, "binary")
    rows = []
    for partition in plan.partitions:
        for columns, keep in read_partition(plan, partition):
            rows.extend(to_arrow(columns, keep, layout).to_pylist())
    return rows, plan


def latest_of(rows):
    state = {}
    for row in rows:
        assert row["key"] not in state, "a key returned twice"
        state[row["key"]] = row["value"]
    return state


def model_latest(ops, end=None):
    state = {}
    for offset, (key, value) in enumerate(ops):
        if end is not None and offset >= end:
            break
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    return state


def write(path, ops, compact_at=(), **config):
    config = {"segment_bytes": 1024, "min_compaction_lag_ms": 0, **config}
    with compactlog.open(path, **config) as log:
        for i, (key, value) in enumerate(ops):
            log.append(key, value)
            if i in compact_at:
                log.flush()
                log.compact(force=True)
        log.flush()


ops_strategy = st.lists(
    st.tuples(
        st.sampled_from([b"a", b"bb", b"key-3", b"k" * 20, b"", b"z"]),
        st.one_of(st.none(), st.binary(min_size=0, max_size=60)),
    ),
    min_size=1,
    max_size=120,
)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    ops=ops_strategy,
    compact_at=st.sets(st.integers(0, 119), max_size=3),
    partitions=st.integers(1, 6),
    compression=st.sampled_from(["none", "zstd"]),
)
def test_latest_over_all_partitions_equals_the_model(
    tmp_path_factory, ops, compact_at, partitions, compression
):
    path = tmp_path_factory.mktemp("log") / "log"
    write(path, ops, compact_at, compression=compression)
    rows, _plan = read_all(path, numPartitions=partitions)
    assert latest_of(rows) == model_latest(ops)
    assert all(row["deleted"] is False for row in rows)
    with compactlog.open(path, read_only=True) as log:
        expected = [(r.offset, r.key, r.value) for r in log.latest()]
    assert sorted((r["offset"], r["key"], r["value"]) for r in rows) == expected


def test_a_key_with_versions_in_every_partition_of_the_dirty_section(tmp_path):
    ops = [(b"hot", b"v%d" % i) if i % 3 else (b"k%d" % i, b"x") for i in range(400)]
    ops.append((b"hot", None))
    ops.append((b"hot", b"final"))
    write(tmp_path / "log", ops, compact_at={150})
    rows, plan = read_all(tmp_path / "log", numPartitions=5)
    assert len(plan.partitions) == 5
    assert plan.dirty_keys > 0 and plan.cleaner_point > 0
    state = latest_of(rows)
    assert state[b"hot"] == b"final"
    assert state == model_latest(ops)
    # and the hot key really had versions in several partitions
    hot_parts = {
        p.index
        for p in plan.partitions
        for i, (k, _v) in enumerate(ops)
        if k == b"hot" and p.start <= i < p.end
    }
    assert len(hot_parts) >= 3


def test_changelog_returns_every_record_with_deleted_flags(tmp_path):
    ops = [(b"k%d" % (i % 7), None if i % 4 == 0 else b"v%d" % i) for i in range(200)]
    write(tmp_path / "log", ops)
    rows, _plan = read_all(tmp_path / "log", mode="changelog", numPartitions=3)
    assert [(r["offset"], r["key"], r["value"], r["deleted"]) for r in rows] == [
        (i, k, v, v is None) for i, (k, v) in enumerate(ops)
    ]


def test_as_of_is_exact_at_or_above_the_cleaner_point_and_refused_below(tmp_path):
    ops = [(b"k%d" % (i % 10), b"v%d" % i) for i in range(300)]
    write(tmp_path / "log", ops, compact_at={199})
    with compactlog.open(tmp_path / "log", read_only=True) as log:
        point = json.loads((tmp_path / "log" / "cleaner.checkpoint").read_bytes())
        cleaner_point = point["first_dirty_offset"]
        assert 0 < cleaner_point <= 200
        del log
    for as_of in (cleaner_point, cleaner_point + 37, 300, 10_000):
        rows, _ = read_all(tmp_path / "log", asOfOffset=as_of, numPartitions=3)
        assert latest_of(rows) == model_latest(ops, as_of)
    with pytest.raises(InexactReadError) as refused:
        read_all(tmp_path / "log", asOfOffset=cleaner_point - 1)
    assert f"lowest offset with an exact state is {cleaner_point}" in str(refused.value)
    assert "allowInexact" in str(refused.value)
    rows, _ = read_all(tmp_path / "log", asOfOffset=50, allowInexact="true")
    # Kafka's rule: what is there is right, some keys may be missing
    expected = model_latest(ops, 50)
    assert all(expected[r["key"]] == r["value"] for r in rows)


def test_offset_ranges_and_key_lists(tmp_path):
    ops = [(b"k%d" % (i % 10), b"v%d" % i) for i in range(300)]
    write(tmp_path / "log", ops)
    rows, _ = read_all(tmp_path / "log", mode="changelog", startOffset=100, endOffset=150)
    assert [r["offset"] for r in rows] == list(range(100, 150))
    rows, _ = read_all(tmp_path / "log", keys="k1,k7", numPartitions=4)
    assert latest_of(rows) == {b"k1": b"v291", b"k7": b"v297"}
    rows, _ = read_all(tmp_path / "log", keysHex=b"k3".hex(), mode="changelog")
    assert {r["key"] for r in rows} == {b"k3"} and len(rows) == 30
    rows, _ = read_all(tmp_path / "log", keys='["nope"]')
    assert rows == []


def test_a_live_log_is_read_through_an_implicit_snapshot_reused_while_unchanged(tmp_path):
    path = tmp_path / "log"
    write(path, [(b"a", b"1")])
    options = parse_options({"path": str(path)})
    first = resolve_snapshot(options)
    assert first[0].startswith(str(path / IMPLICIT_SNAPSHOTS)) and first[1] == 1
    assert resolve_snapshot(options) == first
    with compactlog.open(path) as log:
        log.append(b"b", b"2")
    second = resolve_snapshot(options)
    assert second[0] != first[0] and second[1] == 2
    # a cleaning pass keeps the end offset but moves the cleaner point: a new snapshot
    # (the old one holds every superseded record, and its segments on disk)
    with compactlog.open(path, min_compaction_lag_ms=0, segment_bytes=1024) as log:
        for i in range(60):
            log.append(b"k%d" % (i % 3), b"v" * 40)
        log.flush()
    before_pass = resolve_snapshot(options)
    assert resolve_snapshot(options) == before_pass
    with compactlog.open(path) as log:
        assert log.compact(force=True).records_removed > 0  # the pass must happen
    after_pass = resolve_snapshot(options)
    assert after_pass[1] == before_pass[1] and after_pass[2] > before_pass[2]
    assert after_pass[0] != before_pass[0]
    assert resolve_snapshot(options) == after_pass
    # snapshots past their retention are removed at the next planning
    far_future = (1 << 62) - 1
    resolve_snapshot(options, now_ns=far_future)
    assert not os.path.exists(first[0])
    # a snapshot path is read as it is
    with compactlog.open(path, read_only=True) as log:
        log.snapshot(tmp_path / "snap")
    assert resolve_snapshot(parse_options({"path": str(tmp_path / "snap")}))[0] == str(
        tmp_path / "snap"
    )


def test_options_are_checked_with_errors_naming_the_option():
    with pytest.raises(ConfigError, match="mode"):
        parse_options({"path": "x", "mode": "everything"})
    with pytest.raises(ConfigError, match="asOfOffset"):
        parse_options({"path": "x", "asofoffset": "ten"})
    with pytest.raises(ConfigError, match="unknown compactlog option"):
        parse_options({"path": "x", "asof": "10"})
    with pytest.raises(ConfigError, match="valueSchema needs valueFormat=json"):
        parse_options({"path": "x", "valueschema": "a INT"})
    with pytest.raises(ConfigError, match="no log path"):
        parse_options({})
    parsed = parse_options({"PATH": "x", "AsOfOffset": "10", "allowinexact": "TRUE"})
    assert parsed.as_of == 10 and parsed.allow_inexact


def _columns_of(values):
    from compactlog.encoding.batch_decode import decode_batch
    from compactlog.encoding.batch_encode import encode_batch
    from compactlog.encoding.format import read_batch_header

    encoded = encode_batch([b"k%d" % i for i in range(len(values))], values, 1_000)
    data = encoded.to_bytes(0)
    header, _ = read_batch_header(data, 0, len(data))
    from compactlog.encoding.batch_decode import concat_columns

    return concat_columns([decode_batch(data, 0, header)])


def test_json_values_become_columns_and_tombstones_null_fields():
    schema = pa.schema(
        [("key", pa.binary()), ("n", pa.int64()), ("name", pa.string()), ("deleted", pa.bool_())]
    )
    values = [b'{"n": 1, "name": "a"}', None, b'{\n "n": 3}', b'{"name": "d", "extra": 1}']
    batch = to_arrow(_columns_of(values), None, Layout(schema, "json"))
    assert batch.to_pylist() == [
        {"key": b"k0", "n": 1, "name": "a", "deleted": False},
        {"key": b"k1", "n": None, "name": None, "deleted": True},
        {"key": b"k2", "n": 3, "name": None, "deleted": False},
        {"key": b"k3", "n": None, "name": "d", "deleted": False},
    ]
    keep = np.array([False, False, True, True])
    assert to_arrow(_columns_of(values), keep, Layout(schema, "json")).num_rows == 2


def test_undecodable_values_fail_with_the_offsets_named():
    schema = pa.schema([("key", pa.binary()), ("n", pa.int64())])
    with pytest.raises(ValueDecodeError, match=r"offsets 0\.\.1"):
        to_arrow(_columns_of([b'{"n": 1}', b"not json"]), None, Layout(schema, "json"))
    with pytest.raises(ValueDecodeError, match="UTF-8"):
        to_arrow(
            _columns_of([b"ok", b"\xff\xfe"]),
            None,
            Layout(pa.schema([("value", pa.string())]), "string"),
        )
    with pytest.raises(ValueDecodeError, match="valueFormat=json"):
        Layout(pa.schema([("name", pa.string())]), "binary").check()


def test_the_core_library_and_the_planner_import_without_pyspark():
    code = (
        "import sys; sys.modules['pyspark'] = None\n"
        "import compactlog, compactlog.spark, compactlog.restore.plan, compactlog.spark.restore\n"
        "assert callable(compactlog.spark.register)\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr


def test_an_empty_log_and_an_empty_range_read_nothing(tmp_path):
    with compactlog.open(tmp_path / "log"):
        pass
    assert read_all(tmp_path / "log")[0] == []
    write(tmp_path / "full", [(b"a", b"1"), (b"b", b"2")])
    assert read_all(tmp_path / "full", startOffset=5)[0] == []
    assert read_all(tmp_path / "full", mode="changelog", endOffset=0)[0] == []


def test_keyless_records_of_a_delete_policy_log(tmp_path):
    with compactlog.open(tmp_path / "log", cleanup_policy="delete") as log:
        log.append_batch([(None, b"x"), (b"k", b"1"), (None, None), (b"k", b"2")])
    rows, _ = read_all(tmp_path / "log", mode="changelog")
    assert [(r["key"], r["value"], r["deleted"]) for r in rows] == [
        (None, b"x", False),
        (b"k", b"1", False),
        (None, None, True),
        (b"k", b"2", False),
    ]
    latest, _ = read_all(tmp_path / "log")
    assert latest_of(latest) == {b"k": b"2"}


def test_tail_keys_that_only_collide_in_the_dirty_filter_are_kept(tmp_path, monkeypatch):
    """The dirty section's bit filter may say "maybe" for a tail key that is not there; the
    exact lookup behind it decides. A filter of 8 bits makes nearly every key collide."""
    from compactlog.restore.plan import DirtyIndex

    monkeypatch.setattr(DirtyIndex, "MIN_FILTER_BITS", 8)
    monkeypatch.setattr(DirtyIndex, "FILTER_BITS_PER_KEY", 0)
    ops = [(b"k%03d" % (i % 150), b"v%d" % i) for i in range(600)]
    ops += [(b"k%03d" % i, None if i % 2 else b"new") for i in range(0, 30)]
    write(tmp_path / "log", ops, compact_at={599})
    rows, plan = read_all(tmp_path / "log", numPartitions=3)
    assert plan.dirty is not None and 0 < plan.dirty_keys < 150
    assert plan.dirty.maybe_present(np.arange(1000, dtype=np.uint64) << np.uint64(56)).all()
    assert latest_of(rows) == model_latest(ops)


def test_the_dirty_index_pickles_without_its_caches(tmp_path):
    import pickle

    ops = [(b"k%d" % (i % 20), b"v%d" % i) for i in range(300)]
    write(tmp_path / "log", ops, compact_at={200})
    _rows, plan = read_all(tmp_path / "log")
    assert plan.dirty is not None and plan.dirty._filter is not None  # used by the read
    copy = pickle.loads(pickle.dumps(plan))
    assert copy.dirty._filter is None and copy.dirty._bits is None
    assert (copy.dirty.map.hi == plan.dirty.map.hi).all()
    layout = Layout(BINARY_LAYOUT, "binary")
    again = [
        row
        for partition in copy.partitions
        for columns, keep in read_partition(copy, partition)
        for row in to_arrow(columns, keep, layout).to_pylist()
    ]
    assert latest_of(again) == model_latest(ops)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    count=st.integers(1, 1500),
    keys=st.integers(1, 40),
    chunk=st.integers(1, 60),
    compactions=st.integers(0, 2),
    tail=st.integers(0, 100),
    start=st.integers(0, 1700),
    limit=st.integers(1, 300),
)
def test_records_end_holds_the_limit_exactly_unless_it_reaches_the_end(
    tmp_path_factory, count, keys, chunk, compactions, tail, start, limit
):
    """A stream's ``maxRecordsPerTrigger`` (``records_end``) over a log compacted now and
    then while appended: the range reaches at least ``start + limit`` (the cut by offsets),
    and holds exactly ``limit`` records unless it reaches the end, so a range compaction
    emptied costs no micro-batch of its own."""
    ops = [(b"k%d" % (i % keys), None if i % 11 == 0 else b"v%d" % i) for i in range(count)]
    path = tmp_path_factory.mktemp("log") / "log"
    with compactlog.open(path, segment_bytes=1024, min_compaction_lag_ms=0) as log:
        for at in range(0, count, chunk):
            log.append_batch(ops[at : at + chunk])
            if compactions and at // chunk % (1 + count // chunk // compactions) == 0:
                log.flush()
                log.compact(force=True)
        log.flush()
        log.compact(force=True)
        log.append_batch(ops[:tail])  # past the cleaner point: dense again
        log.flush()
        end = log.end_offset
        offsets = [r.offset for r in log.read()]
    start = min(start, end)
    cut = records_end(str(path), start, end, limit)
    held = [o for o in offsets if start <= o < cut]
    assert min(end, start + limit) <= cut <= end
    assert len(held) == limit if cut < end else len(held) <= limit
