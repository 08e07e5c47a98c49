"""One pass cleans the whole cleanable section, whatever the number of keys (issue 33).

When the range has more offsets than the offset map has room for keys, the keys go
through spill files by digest range (``compaction/latest.py``); the cleanable section is
then left with exactly one record per key (the latest below the new cleaner point), in one
pass, with bytes read and written bounded by a constant times the log's size.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import compactlog
from compactlog.compaction import latest as latest_module
from compactlog.storage import filenames
from compactlog.storage.segment import list_segments
from compactlog.storage.state_files import read_cleaner_state

from .compaction_helpers import Model, check_log
from .helpers import FakeClock


def _log_bytes(directory: str) -> int:
    return sum(
        os.path.getsize(os.path.join(directory, filenames.segment_name(base)))
        for base in list_segments(directory)
    )


def _spill_files(directory: str) -> list[str]:
    return [n for n in os.listdir(directory) if n.startswith(filenames.SPILL + ".")]


def _assert_cleanable_section_is_latest_per_key(log, model: Model) -> int:
    """Below the cleaner point: exactly the latest record of each key among the offsets
    written below it (tombstones included: none expired). Returns the cleaner point."""
    point = read_cleaner_state(log.directory).first_dirty_offset
    expected = {}
    for offset in sorted(model.written):
        if offset < point:
            expected[model.written[offset][0]] = offset
    below = [r for r in log.read() if r.offset < point]
    assert sorted(r.offset for r in below) == sorted(expected.values())
    return point


def _fill(log, model: Model, records: int, keys: int, seed: int) -> None:
    rng = random.Random(seed)
    for start in range(0, records, 500):
        pairs = []
        for i in range(start, min(start + 500, records)):
            k = rng.randrange(keys)
            key = b"key-%012d" % k + b"x" * (k % 9)  # 16 to 24 bytes
            pairs.append((key, None if rng.random() < 0.05 else b"v%d" % i))
        model.append_batch(log, pairs)
    log.flush()


def test_one_pass_leaves_one_record_per_key_with_io_bounded_by_the_log_size(tmp_path):
    """Issue 33's 240,000 records over 60,000 keys with a 256 KiB map (10,922 keys),
    scaled down by 10: 24,000 records over 6,000 keys, a 26 KiB map (1,109 keys). On the
    old cleaner one pass removed nothing; now it leaves the cleanable section clean,
    reading the log about twice, writing at most its size, spilling at most 24 bytes a record."""
    model = Model()
    with compactlog.open(
        tmp_path / "log", segment_bytes=64 << 10, cleaner_buffer_bytes=26 << 10
    ) as log:
        _fill(log, model, records=24_000, keys=6_000, seed=33)
        size = _log_bytes(log.directory)
        stats = log.compact(force=True)
        assert stats.cleaned and stats.partitions > 1
        assert stats.map_entries <= stats.map_capacity == (26 << 10) // 24
        point = _assert_cleanable_section_is_latest_per_key(log, model)
        assert point == stats.new_first_dirty_offset == list_segments(log.directory)[-1]
        assert stats.dirty_ratio == 1.0 and stats.dirty_ratio_after == 0.0
        read = stats.bytes_read + stats.map_bytes_read + stats.verify_bytes_read
        assert read <= 2 * size and stats.bytes_written <= size
        assert 0 < stats.spill_bytes_written <= 24 * stats.map_records  # no partition split
        assert stats.spill_bytes_read == stats.spill_bytes_written
        assert "the cleanable section is clean" in stats.summary()
        assert not _spill_files(log.directory)
        check_log(log, model)


def test_partitions_whose_keys_outgrow_the_map_are_split_and_still_one_pass(tmp_path):
    """More keys than the first split's 64 partitions of a 170-key map hold: partitions
    are split again; spill I/O stays a small multiple of 24 bytes a record."""
    model = Model()
    with compactlog.open(
        tmp_path / "log", segment_bytes=16 << 10, cleaner_buffer_bytes=4096
    ) as log:
        model.append_batch(log, [(b"k%06d" % i, b"v") for i in range(12_000)])
        model.append_batch(log, [(b"k%06d" % i, None) for i in range(0, 12_000, 7)])
        log.flush()
        stats = log.compact(force=True)
        assert stats.partitions > latest_module.MAX_PARTITIONS
        assert stats.keys == 12_000 and stats.map_entries <= 170
        assert stats.spill_bytes_written <= 3 * 24 * stats.map_records
        _assert_cleanable_section_is_latest_per_key(log, model)
        check_log(log, model)


def test_a_range_longer_than_the_map_in_bits_keeps_its_bitmap_in_a_spill_file(
    tmp_path, monkeypatch
):
    """Past ``cleaner_buffer_bytes * 8`` offsets the bitmap of latest offsets is a spill
    file, removed when the pass ends."""
    seen: list[str | None] = []
    close = latest_module.LatestOffsets.close

    def recording_close(self, fs):
        seen.append(self.path)
        close(self, fs)

    monkeypatch.setattr(latest_module.LatestOffsets, "close", recording_close)
    model = Model()
    with compactlog.open(
        tmp_path / "log", segment_bytes=64 << 10, cleaner_buffer_bytes=4096
    ) as log:
        for start in range(0, 40_000, 4000):
            model.append_batch(log, [(b"k%d" % (i % 900), b"") for i in range(start, start + 4000)])
        log.flush()
        stats = log.compact(force=True)
        assert stats.cleaned and seen and seen[0] is not None
        assert os.path.basename(seen[0]).startswith(filenames.SPILL_BITS + ".")
        assert not _spill_files(log.directory)
        _assert_cleanable_section_is_latest_per_key(log, model)


def test_an_aborted_pass_removes_its_spill_files_and_moves_nothing(tmp_path):
    model = Model()
    with compactlog.open(tmp_path / "log", segment_bytes=4096, cleaner_buffer_bytes=4096) as log:
        _fill(log, model, records=3000, keys=800, seed=1)
        before = read_cleaner_state(log.directory).first_dirty_offset
        calls = 0

        def abort_late() -> bool:
            nonlocal calls
            calls += 1
            return calls > 40  # after the spill files exist

        stats = compactlog.compaction.compact_log(log, force=True, should_abort=abort_late)
        assert stats.aborted and "the cleaner point did not move" in stats.skipped
        assert read_cleaner_state(log.directory).first_dirty_offset == before
        assert not _spill_files(log.directory)
        check_log(log, model)


def test_spill_files_a_crash_left_are_removed_on_open_and_by_the_next_pass(tmp_path):
    """A dead cleaner's spill files (its pid in the name) go at the next open; one whose
    pid looks alive goes at the next pass, which holds the cleaner lock."""
    path = tmp_path / "log"
    with compactlog.open(path, segment_bytes=1024) as log:
        for i in range(200):
            log.append(b"k%d" % (i % 10), b"v" * 20)
    dead = path / f"{filenames.SPILL}.999999999.0{filenames.TEMP_SUFFIX}"
    mine = path / filenames.temp_name(filenames.SPILL_BITS)
    dead.write_bytes(b"\1" * 48)
    mine.write_bytes(b"\xff" * 8)
    with compactlog.open(path) as log:
        assert not dead.exists() and mine.exists()
        stats = log.compact(force=True)
        assert stats.cleaned and not mine.exists()
        assert any("cleaner.spill.bits" in m for m in stats.extra["recovered"])


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    buffer_bytes=st.sampled_from([4096, 6000, 12_000]),
    segment_bytes=st.sampled_from([1024, 3000, 8192]),
    keys=st.integers(1, 700),
    rounds=st.lists(st.integers(1, 900), min_size=1, max_size=3),
    seed=st.integers(0, 2**16),
)
# the map filled at its last merge, after every window was put (a bug found by this test)
@example(buffer_bytes=6000, segment_bytes=1024, keys=262, rounds=[1, 702, 93], seed=1)
def test_every_pass_leaves_exactly_the_latest_record_per_key_below_the_cleaner_point(
    tmp_path_factory, buffer_bytes, segment_bytes, keys, rounds, seed
):
    """Property, against a latest-per-key model, at map sizes from 170 to 500 keys: after
    every forced pass the cleaner point is at the active segment and the section below it
    holds exactly each key's latest record written below it; reading the whole log keeps
    Kafka's guarantees."""
    rng = random.Random(seed)
    model = Model()
    clock = FakeClock(1_000_000)
    path = tmp_path_factory.mktemp("prop") / "log"
    with compactlog.open(
        path, clock=clock, segment_bytes=segment_bytes, cleaner_buffer_bytes=buffer_bytes
    ) as log:
        for count in rounds:
            pairs = [
                (
                    b"k%d" % rng.randrange(keys),
                    None if rng.random() < 0.1 else b"v" * rng.randrange(30),
                )
                for _ in range(count)
            ]
            model.append_batch(log, pairs)
            log.flush()
            stats = log.compact(force=True)
            clock.advance(1)
            if stats.cleaned:
                active = list_segments(log.directory)[-1]
                assert stats.new_first_dirty_offset == active
                assert not stats.map_full and stats.map_entries <= stats.map_capacity
            _assert_cleanable_section_is_latest_per_key(log, model)
            assert not _spill_files(log.directory)
        check_log(log, model)


@pytest.mark.parametrize("lag", [False, True])
def test_compact_command_prints_the_dirty_ratio_before_and_after(tmp_path, lag):
    """``compactlog compact`` (run as operators do) ends with the dirty ratio before and
    after, and names what min_compaction_lag_ms held back."""
    path = tmp_path / "log"
    clock = FakeClock(1_000_000)  # 1970: old records
    config = dict(segment_bytes=2048, cleaner_buffer_bytes=4096)
    if lag:
        config["min_compaction_lag_ms"] = 3_600_000
    with compactlog.open(path, clock=clock, **config) as log:
        for i in range(3000):
            log.append(b"key-%d" % (i % 700), b"v" * 10)
    if lag:
        with compactlog.open(path) as log:  # young records, on the real clock
            for i in range(300):
                log.append(b"key-%d" % i, b"w" * 40)
    done = subprocess.run(
        [
            str(Path(sys.executable).parent / "compactlog"),
            "compact",
            str(path),
            "--progress",
            "none",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    if lag:
        assert "held back by min_compaction_lag_ms" in done.stdout
    else:
        assert "Dirty ratio 1.000 before, 0.000 after: the cleanable section is clean" in (
            done.stdout
        )
