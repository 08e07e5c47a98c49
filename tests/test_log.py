"""The public contract of one log: open, append, read, offsets, config, rolling, the index."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import compactlog
from compactlog.encoding.batch_decode import RecordBatch
from compactlog.log import SettingIgnoredWarning
from compactlog.storage.segment import list_segments, lookup_position, read_index

from .helpers import batch_positions, flip_bit, segment_files


def keyed(n, start=0, size=20):
    return [(b"k%06d" % i, b"v%06d" % i + b"." * (size - 7)) for i in range(start, start + n)]


def test_append_returns_consecutive_offsets_and_read_returns_records(log_dir, clock):
    with compactlog.open(log_dir, clock=clock) as log:
        assert (log.start_offset, log.end_offset) == (0, 0)
        assert log.append(b"a", b"1") == 0
        assert log.append(b"b", None) == 1
        assert log.append(b"c", b"3", timestamp_ms=5, headers={"h": b"x"}) == 2
        assert log.end_offset == 3
        records = list(log.read())
    assert [(r.offset, r.key, r.value) for r in records] == [
        (0, b"a", b"1"),
        (1, b"b", None),
        (2, b"c", b"3"),
    ]
    assert records[0].timestamp == clock.now
    assert records[2].timestamp == 5
    assert records[2].headers == {"h": b"x"}
    assert records[0].headers is None
    assert isinstance(records[0], compactlog.Record)


def test_append_batch_returns_the_range_of_offsets(log_dir):
    with compactlog.open(log_dir) as log:
        log.append(b"x", b"y")
        offsets = log.append_batch(keyed(10))
        assert offsets == range(1, 11)
        assert log.append_batch([]) == range(11, 11)
        assert [r.key for r in log.read(start=1)] == [k for k, _ in keyed(10)]


def test_append_batch_takes_per_record_timestamps_and_headers(log_dir):
    with compactlog.open(log_dir) as log:
        log.append_batch(
            [(b"a", b"1"), (b"b", b"2")], timestamps_ms=[10, 20], headers=[None, {"n": b"v"}]
        )
        records = list(log.read())
    assert [r.timestamp for r in records] == [10, 20]
    assert [r.headers for r in records] == [None, {"n": b"v"}]


def test_none_keys_are_allowed_on_a_non_compacted_log(log_dir):
    with compactlog.open(log_dir, cleanup_policy="delete") as log:
        log.append(None, b"v")
        log.append_batch([(None, b"w"), (b"k", None)])
        assert [(r.key, r.value) for r in log.read()] == [(None, b"v"), (None, b"w"), (b"k", None)]


def test_zstd_log_round_trips(log_dir):
    with compactlog.open(log_dir, compression="zstd") as log:
        log.append_batch(keyed(200, size=500))
        log.append(b"one", b"x" * 300)
        values = [r.value for r in log.read()]
    assert values == [v for _, v in keyed(200, size=500)] + [b"x" * 300]
    assert sum(p.stat().st_size for p in segment_files(log_dir)) < 200 * 500 // 4


def test_read_start_and_end_bound_the_offsets(log_dir):
    with compactlog.open(log_dir, segment_bytes=1024) as log:
        for chunk in range(10):
            log.append_batch(keyed(10, start=chunk * 10))
        assert len(list_segments(str(log_dir))) > 2
        assert [r.offset for r in log.read(start=37, end=52)] == list(range(37, 52))
        assert [r.offset for r in log.read(start=95)] == list(range(95, 100))
        assert [r.offset for r in log.read(end=3)] == [0, 1, 2]
        assert list(log.read(start=100)) == []
        assert list(log.read(start=50, end=50)) == []


def test_read_batches_yields_columnar_batches(log_dir):
    with compactlog.open(log_dir) as log:
        log.append_batch(keyed(15))
        log.append_batch(keyed(10, start=15))
        batches = list(log.read_batches())
        assert all(isinstance(b, RecordBatch) for b in batches)
        assert [len(b) for b in batches] == [15, 10]
        assert isinstance(batches[0].offsets, np.ndarray)
        assert batches[1].offsets.tolist() == list(range(15, 25))
        assert batches[0].key_lengths.tolist() == [7] * 15
        assert bytes(batches[0].keys_blob) == b"".join(k for k, _ in keyed(15))
        trimmed = list(log.read_batches(start=12, end=17))
        assert [b.offsets.tolist() for b in trimmed] == [[12, 13, 14], [15, 16]]


def test_read_batches_hands_runs_of_small_batches_back_as_one(log_dir):
    with compactlog.open(log_dir) as log:
        log.append_batch(keyed(5))
        log.append_batch(keyed(3, start=5))
        for key, value in keyed(4, start=8):
            log.append(key, value)
        log.append_batch(keyed(20, start=12))
        batches = list(log.read_batches())
        # a run starts at a small batch and goes on through the large one after it
        assert [len(b) for b in batches] == [32]
        assert [b.stored_batches for b in batches] == [7]
        assert batches[0].offsets.tolist() == list(range(32))
        assert bytes(batches[0].keys_blob) == b"".join(k for k, _ in keyed(32))
        assert batches[0].next_offset == 32
        trimmed = list(log.read_batches(start=2, end=14))
        assert [b.offsets.tolist() for b in trimmed] == [list(range(2, 14))]


def test_context_manager_closes_the_log(log_dir):
    with compactlog.open(log_dir) as log:
        log.append(b"k", b"v")
    assert log.closed
    with pytest.raises(compactlog.LogClosedError):
        log.append(b"k", b"v")
    with pytest.raises(compactlog.LogClosedError):
        list(log.read())
    log.close()  # closing twice is harmless


def test_records_survive_a_reopen(log_dir):
    with compactlog.open(log_dir, segment_bytes=1024) as log:
        for i in range(50):
            log.append(b"k%d" % i, b"v%d" % i)
    with compactlog.open(log_dir) as log:
        assert log.end_offset == 50
        assert log.append(b"again", b"x") == 50
        assert [r.value for r in log.read(end=50)] == [b"v%d" % i for i in range(50)]
    with compactlog.open(log_dir, read_only=True) as log:
        assert log.end_offset == 51
        with pytest.raises(compactlog.ReadOnlyLogError):
            log.append(b"k", b"v")


def test_config_is_stored_at_creation_and_kept_on_reopen(log_dir):
    with compactlog.open(log_dir, segment_bytes=4096, retention_ms=1000) as log:
        assert log.config.segment_bytes == 4096
    meta = json.loads((log_dir / "meta").read_bytes())
    assert meta["config"]["segment_bytes"] == 4096
    with compactlog.open(log_dir) as log:
        assert log.config.segment_bytes == 4096
        assert log.config.retention_ms == 1000
    ignored = pytest.warns(SettingIgnoredWarning, match=r"retention_ms=2000 ignored.*1000")
    with ignored as seen, compactlog.open(log_dir, retention_ms=2000, segment_bytes=4096) as log:
        assert log.config.retention_ms == 1000  # the stored value stays
    assert len(seen) == 1  # segment_bytes was passed with its stored value: no warning
    assert seen[0].filename == __file__  # pointed at the caller's line
    with compactlog.open(log_dir) as log:
        assert log.config.retention_ms == 1000


def test_segments_roll_at_segment_bytes(log_dir):
    with compactlog.open(log_dir, segment_bytes=1024) as log:
        for i in range(100):
            log.append(b"key%03d" % i, b"v" * 50)
        bases = list_segments(str(log_dir))
        assert len(bases) > 5
        assert bases[0] == 0
        sizes = [os.path.getsize(p) for p in segment_files(log_dir)]
        assert all(size <= 1024 for size in sizes)
        assert [r.offset for r in log.read()] == list(range(100))
        # every segment is named by the offset of its first record
        for base in bases:
            assert next(iter(log.read(start=base))).offset == base


def test_large_append_batch_is_split_so_segments_roll_near_segment_bytes(log_dir):
    with compactlog.open(log_dir, segment_bytes=2048) as log:
        offsets = log.append_batch(keyed(300, size=30))
        assert offsets == range(0, 300)
        sizes = [os.path.getsize(p) for p in segment_files(log_dir)]
        assert len(sizes) > 3
        assert max(sizes) <= 2048
        assert [r.offset for r in log.read()] == list(range(300))


def test_segments_roll_at_segment_ms(log_dir, clock):
    with compactlog.open(log_dir, segment_ms=1000, clock=clock) as log:
        log.append(b"a", b"1")
        clock.advance(999)
        log.append(b"b", b"2")
        assert list_segments(str(log_dir)) == [0]
        clock.advance(1)
        log.append(b"c", b"3")
        assert list_segments(str(log_dir)) == [0, 2]


def test_segment_ms_counts_from_the_first_record_across_a_reopen(log_dir, clock):
    with compactlog.open(log_dir, segment_ms=1000, clock=clock) as log:
        log.append(b"a", b"1")
    clock.advance(5000)
    with compactlog.open(log_dir, clock=clock) as log:
        log.append(b"b", b"2")
        assert list_segments(str(log_dir)) == [0, 1]


def test_the_index_lets_read_seek_past_earlier_batches(log_dir):
    with compactlog.open(log_dir, index_interval_bytes=256, segment_bytes=1 << 20) as log:
        for i in range(200):
            log.append(b"k%04d" % i, b"v" * 40)
        entries = read_index(str(log_dir), 0)
        assert entries is not None and len(entries) > 10
        assert lookup_position(entries, 0, 150) > 1000
    # damage the first batch: a read from an indexed offset never touches it
    first_position = batch_positions(segment_files(log_dir)[0])[0][0]
    flip_bit(segment_files(log_dir)[0], first_position + 60)
    with compactlog.open(log_dir, read_only=True) as log:
        assert [r.offset for r in log.read(start=150)] == list(range(150, 200))
        with pytest.raises(compactlog.CorruptLogError):
            list(log.read())


def test_a_record_larger_than_segment_bytes_gets_a_segment_of_its_own(log_dir):
    with compactlog.open(log_dir, segment_bytes=1024, max_record_bytes=10_000) as log:
        log.append(b"small", b"s")
        log.append(b"big", b"B" * 5000)
        log.append(b"after", b"a")
        assert list_segments(str(log_dir)) == [0, 1, 2]
        assert [r.value for r in log.read()] == [b"s", b"B" * 5000, b"a"]


def test_records_larger_than_the_read_chunk_are_readable(log_dir):
    value = os.urandom(5 << 20)
    with compactlog.open(log_dir, segment_bytes=1 << 20) as log:
        log.append(b"a", b"1")
        log.append(b"huge", value)
        log.append(b"b", b"2")
    with compactlog.open(log_dir) as log:
        records = list(log.read())
    assert [r.key for r in records] == [b"a", b"huge", b"b"]
    assert records[1].value == value


def test_start_and_end_offsets_follow_appends_in_another_handle(log_dir):
    with compactlog.open(log_dir) as writer:
        reader = compactlog.open(log_dir, read_only=True)
        assert reader.end_offset == 0
        writer.append_batch(keyed(7))
        writer.flush()
        assert reader.end_offset == 7
        assert [r.offset for r in reader.read()] == list(range(7))
        reader.close()


def test_flush_makes_precommit_appends_visible(log_dir):
    with compactlog.open(log_dir, precommit_bytes=1 << 16, sync="os") as log:
        log.append(b"a", b"1")
        log.append(b"b", b"2")
        log.flush()
        assert [r.key for r in log.read()] == [b"a", b"b"]


def test_latest_batches_gives_the_latest_live_value_of_each_key_in_columns(tmp_path):
    with compactlog.open(tmp_path / "log") as log:
        log.append_batch([(b"a", b"1"), (b"b", b"2"), (b"a", b"3"), (b"c", b"4"), (b"b", None)])
        batches = list(log.latest_batches())
        pairs = {
            k: v for batch in batches for k, v in zip(batch.keys(), batch.values(), strict=True)
        }
        assert pairs == {b"a": b"3", b"c": b"4"}
        assert pairs == {r.key: r.value for r in log.latest()}
        assert [r.key for r in log.latest(as_of=2)] == [b"a", b"b"]


@pytest.mark.parametrize(
    "setting", [{"segmnt_bytes": 4096}, {"segment_bytes": 5}, {"cleanup_policy": "compacted"}]
)
@pytest.mark.parametrize("where", ["missing", "empty"])
def test_an_open_refused_by_a_config_error_creates_nothing(tmp_path, setting, where):
    path = tmp_path / "log"
    if where == "empty":
        path.mkdir()
    with pytest.raises(compactlog.ConfigError) as found:
        compactlog.open(path, **setting)
    assert str(found.value).startswith(f"{path}: "), found.value
    assert os.listdir(path) == [] if where == "empty" else not os.path.lexists(path)
