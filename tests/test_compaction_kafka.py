"""Behaviours of Kafka's ``LogCleanerTest``/``LogCleanerManagerTest``, in our own words.

Each test names the Kafka behaviour it ports. Logs use tiny segments (1-4 KiB) so that a
few hundred records make dozens of segments; time comes from an injected clock.
"""

from __future__ import annotations

import os
import threading

import pytest

import compactlog
from compactlog.errors import CompactLogError, LogLockedError
from compactlog.storage import swap
from compactlog.storage.fsio import FileSystem
from compactlog.storage.segment import list_segments
from compactlog.storage.state_files import read_cleaner_state

from .compaction_helpers import Model, check_log, rewrite_files
from .helpers import FakeClock

T0 = 1_700_000_000_000


@pytest.fixture
def clock():
    return FakeClock(T0)


def make(path, clock, **config):
    defaults = dict(segment_bytes=1024, sync="os", segment_ms=None, retention_ms=None)
    defaults.update(config)
    return compactlog.open(path, clock=clock, **defaults)


def fill(log, model, keys=20, rounds=10, size=20, tombstone_every=0):
    n = 0
    for r in range(rounds):
        for k in range(keys):
            key = b"key%03d" % k
            n += 1
            value = None if tombstone_every and n % tombstone_every == 0 else b"%d-%d" % (r, k)
            if value is not None:
                value = value.ljust(size, b".")
            model.append(log, key, value)
    log.flush()


def test_clean_keeps_only_the_latest_record_of_each_key(tmp_path, clock):
    """Kafka testCleanSegments: after a clean only the last value of each key remains
    in the cleaned part."""
    model = Model()
    with make(tmp_path / "log", clock) as log:
        fill(log, model)
        stats = log.compact(force=True)
        assert stats.cleaned and stats.records_removed > 0
        records = check_log(log, model)
        active = list_segments(log.directory)[-1]
        cleaned = [r.key for r in records if r.offset < active]
        assert len(cleaned) == len(set(cleaned))


def test_offsets_never_change_and_order_is_kept(tmp_path, clock):
    """Kafka testCleaningWithDeletes/offset preservation: kept records keep their offsets."""
    model = Model()
    with make(tmp_path / "log", clock) as log:
        fill(log, model, tombstone_every=7)
        before = {r.offset: (r.key, r.value, r.timestamp) for r in log.read()}
        log.compact(force=True)
        after = list(log.read())
        assert [r.offset for r in after] == sorted(r.offset for r in after)
        for r in after:
            assert before[r.offset] == (r.key, r.value, r.timestamp)
        assert log.end_offset == max(before) + 1


def test_active_segment_is_never_cleaned(tmp_path, clock):
    """Kafka: the active segment is never part of the cleanable range."""
    model = Model()
    with make(tmp_path / "log", clock, segment_bytes=64 * 1024) as log:
        fill(log, model, rounds=5)
        assert len(list_segments(log.directory)) == 1
        stats = log.compact(force=True)
        assert not stats.cleaned
        assert len(list(log.read())) == 100


def test_segments_are_grouped_up_to_segment_bytes(tmp_path, clock):
    """Kafka testSegmentGrouping: small cleaned segments are merged, each group's output
    within segment_bytes."""
    model = Model()
    with make(tmp_path / "log", clock) as log:
        fill(log, model, keys=10, rounds=30)
        before = len(list_segments(log.directory))
        stats = log.compact(force=True)
        after = list_segments(log.directory)
        assert stats.segments_after < stats.segments_before
        assert len(after) < before
        for base in after[:-1]:
            assert os.path.getsize(os.path.join(log.directory, f"{base:020d}.log")) <= 1024
        check_log(log, model)


def test_groups_never_exceed_segment_bytes_even_when_nothing_is_removed(tmp_path, clock):
    """Kafka testSegmentGroupingWithSparseOffsets: distinct keys, nothing removed, groups
    still respect the size bound."""
    model = Model()
    with make(tmp_path / "log", clock) as log:
        for i in range(300):
            model.append(log, b"unique%05d" % i, b"v" * 30)
        log.flush()
        log.compact(force=True)
        for base in list_segments(log.directory)[:-1]:
            assert os.path.getsize(os.path.join(log.directory, f"{base:020d}.log")) <= 1024
        check_log(log, model)


def test_one_pass_cleans_everything_cleanable_when_the_keys_outgrow_the_map(tmp_path, clock):
    """Unlike Kafka (a full map moves the cleaner point only as far as it covered): one
    pass leaves the cleanable section with one record per key, whatever the map's size; the
    keys are spread over spill files whose maps each fit (compaction/latest.py)."""
    model = Model()
    with make(tmp_path / "log", clock, cleaner_buffer_bytes=4096) as log:  # 170 keys
        for r in range(3):
            for k in range(400):
                model.append(log, b"k%04d" % k, b"r%d" % r)
        log.flush()
        stats = log.compact(force=True)
        assert stats.cleaned and not stats.map_full and stats.partitions > 1
        assert stats.keys == 400 and stats.map_entries <= stats.map_capacity == 170
        active = list_segments(log.directory)[-1]
        point = read_cleaner_state(log.directory).first_dirty_offset
        assert point == stats.new_first_dirty_offset == active
        assert stats.dirty_ratio_after == 0.0
        records = check_log(log, model)
        closed = [r.key for r in records if r.offset < active]
        assert len(closed) == len(set(closed))
        assert not [n for n in os.listdir(log.directory) if n.endswith(".tmp")]


def test_min_compaction_lag_protects_recent_segments(tmp_path, clock):
    """Kafka testMinCompactionLag: segments with records younger than the lag stay dirty."""
    model = Model()
    with make(tmp_path / "log", clock, min_compaction_lag_ms=60_000) as log:
        fill(log, model, rounds=5)
        clock.advance(120_000)
        old_end = log.end_offset
        fill(log, model, rounds=5)
        stats = log.compact(force=True)
        assert stats.first_uncleanable_offset <= old_end + 30
        for record in log.read(start=stats.first_uncleanable_offset):
            assert record.timestamp > clock() - 60_000 or record.offset >= old_end - 30
        # every young record is still there
        young = [o for o in model.written if o >= stats.first_uncleanable_offset]
        assert {r.offset for r in log.read(start=stats.first_uncleanable_offset)} == set(young)
        check_log(log, model)


def test_max_compaction_lag_cleans_below_the_dirty_ratio(tmp_path, clock):
    """Kafka testMaxCompactionLag: an old enough dirty head is cleaned whatever its ratio."""
    model = Model()
    with make(
        tmp_path / "log", clock, min_cleanable_dirty_ratio=1.0, max_compaction_lag_ms=10_000
    ) as log:
        fill(log, model)
        log.compact(force=True)  # everything clean
        fill(log, model, rounds=1)
        assert not log.compact().cleaned  # ratio < 1 and the head is young
        clock.advance(20_000)
        fill(log, model, rounds=1)
        stats = log.compact()
        assert stats.cleaned and "max_compaction_lag_ms" in stats.extra["reason"]
        check_log(log, model)


def test_dirty_ratio_below_the_minimum_skips_the_pass(tmp_path, clock):
    """Kafka LogCleanerManager: logs below min.cleanable.dirty.ratio are not selected."""
    model = Model()
    with make(tmp_path / "log", clock, min_cleanable_dirty_ratio=0.9) as log:
        fill(log, model)
        log.compact(force=True)
        fill(log, model, rounds=1)
        stats = log.compact()
        assert not stats.cleaned and "dirty ratio" in stats.skipped
        assert 0 < stats.dirty_ratio < 0.9


def test_tombstones_stay_for_delete_retention_then_go(tmp_path, clock):
    """Kafka testDeleteRetention: a tombstone survives delete.retention.ms after the
    cleaner first passed it; a later pass (even with no new data) removes it."""
    model = Model()
    with make(tmp_path / "log", clock, delete_retention_ms=5_000) as log:
        fill(log, model, keys=5, rounds=4)
        model.append(log, b"key001", None)
        fill(log, model, keys=5, rounds=4)  # pushes the tombstone out of the active segment
        model.append(log, b"gone", b"x")
        model.append(log, b"gone", None)
        fill(log, model, keys=30, rounds=2)
        tomb = model.last[b"gone"]
        log.compact(force=True)
        assert any(r.offset == tomb for r in log.read())
        clock.advance(4_000)
        log.compact(force=True)
        assert any(r.offset == tomb for r in log.read())
        clock.advance(1_000)
        stats = log.compact(force=True)
        assert stats.tombstones_removed >= 1
        assert all(r.key != b"gone" for r in log.read())
        check_log(log, model)


def test_a_tombstone_in_the_head_is_kept_on_its_first_pass_even_with_zero_retention(
    tmp_path, clock
):
    """Kafka (KIP-534): the first pass only marks a tombstone; removal needs a later pass."""
    model = Model()
    with make(tmp_path / "log", clock, delete_retention_ms=0) as log:
        model.append(log, b"a", b"1")
        model.append(log, b"a", None)
        fill(log, model, keys=30, rounds=2)
        log.compact(force=True)
        assert [r.value for r in log.read() if r.key == b"a"] == [None]
        log.compact(force=True)
        assert [r.value for r in log.read() if r.key == b"a"] == []
        check_log(log, model)


def test_a_value_after_a_tombstone_wins(tmp_path, clock):
    """Kafka testCleaningWithDeletes: a tombstone followed by a new value leaves the value."""
    model = Model()
    with make(tmp_path / "log", clock) as log:
        model.append(log, b"k", b"1")
        model.append(log, b"k", None)
        model.append(log, b"k", b"2")
        fill(log, model, keys=30, rounds=2)
        log.compact(force=True)
        assert [r.value for r in log.read() if r.key == b"k"] == [b"2"]
        check_log(log, model)


def test_cleaner_point_survives_reopen(tmp_path, clock):
    """Kafka testCheckpoint: the first dirty offset is persisted in cleaner.checkpoint."""
    model = Model()
    path = tmp_path / "log"
    with make(path, clock) as log:
        fill(log, model)
        stats = log.compact(force=True)
    with make(path, clock) as log:
        assert read_cleaner_state(log.directory).first_dirty_offset == (
            stats.new_first_dirty_offset
        )
        assert log.compact().dirty_bytes == 0
        check_log(log, model)


class CrashAt(FileSystem):
    """Raises in the middle of the swap protocol: after ``after`` renames, or on the
    intent write."""

    class Crash(Exception):
        pass

    def __init__(self, *, renames: int | None = None, on_intent: bool = False) -> None:
        self.renames = renames
        self.on_intent = on_intent
        self.armed = False

    def rename(self, source: str, target: str) -> None:
        if self.armed and self.on_intent and target.endswith(swap.SWAP_INTENT):
            raise self.Crash
        if self.armed and source.endswith(".rw") and self.renames is not None:
            if self.renames == 0:
                raise self.Crash
            self.renames -= 1
        super().rename(source, target)

    def remove(self, path: str) -> None:
        if self.armed and self.renames is not None and self.renames < 0:
            raise self.Crash
        super().remove(path)


@pytest.mark.parametrize(
    ("crash", "expect"),
    [
        (dict(on_intent=True), "none"),
        (dict(renames=0), "none"),
        (dict(renames=1), "rolled back"),
    ],
)
def test_recovery_of_an_interrupted_swap(tmp_path, clock, crash, expect):
    """Kafka testRecoveryAfterCrash: whatever swap step the cleaner died at, reopening
    gives the old or the new state and never loses or duplicates a record."""
    model = Model()
    path = tmp_path / "log"
    fs = CrashAt(**crash)
    log = make(path, clock, _fs=fs)
    fill(log, model)
    fs.armed = True
    with pytest.raises(CrashAt.Crash):
        log.compact(force=True)
    fs.armed = False
    log.close()
    with make(path, clock) as log:
        if expect != "none":
            assert any(expect in line for line in log.recovery_report), log.recovery_report
        assert rewrite_files(path) == []
        assert not os.path.exists(os.path.join(path, swap.SWAP_INTENT))
        check_log(log, model)
        log.compact(force=True)
        check_log(log, model)


def test_recovery_completes_a_swap_that_died_after_the_renames(tmp_path, clock):
    """Kafka: a swap past its renames is completed (the replaced segments removed)."""
    model = Model()
    path = tmp_path / "log"
    with make(path, clock) as log:
        fill(log, model, keys=10, rounds=30)
        original = list_segments(log.directory)

    class StopBeforeRemovals(FileSystem):
        def remove(self, p):
            if p.endswith(".log") and not p.endswith(".rw"):
                raise CrashAt.Crash
            super().remove(p)

    log = compactlog.open(path, clock=clock, _fs=StopBeforeRemovals())
    with pytest.raises(CrashAt.Crash):
        log.compact(force=True)
    log.close()
    with make(path, clock) as log:
        assert any("completed" in line for line in log.recovery_report)
        assert len(list_segments(log.directory)) < len(original)
        check_log(log, model)


def test_stray_rewrite_files_are_removed_on_open(tmp_path, clock):
    """Kafka: .cleaned/.swap leftovers without an intent are deleted at load."""
    model = Model()
    path = tmp_path / "log"
    with make(path, clock) as log:
        fill(log, model)
        first = list_segments(log.directory)[0]
    (path / f"{first:020d}.log.rw").write_bytes(b"partial garbage")
    with make(path, clock) as log:
        assert rewrite_files(path) == []
        check_log(log, model)


def test_cleaning_while_appends_go_on(tmp_path, clock):
    """Kafka testCleaningWithConcurrentAppends (LogCleanerIntegrationTest): appends keep
    landing during passes and nothing appended is lost."""
    model = Model()
    lock = threading.Lock()
    with make(tmp_path / "log", clock) as log:
        fill(log, model)
        stop = threading.Event()

        def appender():
            i = 0
            while not stop.is_set() and i < 600:
                with lock:
                    model.append(log, b"key%03d" % (i % 25), b"w%d" % i)
                i += 1

        thread = threading.Thread(target=appender)
        thread.start()
        try:
            for _ in range(8):
                log.compact(force=True)
        finally:
            stop.set()
            thread.join()
        log.flush()
        check_log(log, model)
        log.compact(force=True)
        check_log(log, model)


def test_duplicate_keys_within_one_batch(tmp_path, clock):
    """Kafka testDuplicateCheckAfterCleaning: repeated keys inside one batch keep the last."""
    model = Model()
    with make(tmp_path / "log", clock) as log:
        for r in range(20):
            model.append_batch(log, [(b"a", b"%d" % r), (b"b", b"x"), (b"a", b"y%d" % r)])
        fill(log, model, keys=30, rounds=2)
        log.compact(force=True)
        assert [r.value for r in log.read() if r.key == b"a"] == [b"y19"]
        check_log(log, model)


def test_records_larger_than_a_segment(tmp_path, clock):
    """Kafka testLargeMessage: a record larger than segment_bytes is cleaned whole."""
    model = Model()
    with make(tmp_path / "log", clock) as log:
        model.append(log, b"big", b"B" * 5000)
        model.append(log, b"big", b"C" * 5000)
        model.append(log, b"small", b"s")
        fill(log, model, keys=30, rounds=2)
        log.compact(force=True)
        assert [len(r.value) for r in log.read() if r.key == b"big"] == [5000]
        check_log(log, model)


def test_segments_that_become_empty(tmp_path, clock):
    """Kafka testCleanEmptySegments / batches emptied by cleaning are dropped."""
    model = Model()
    with make(tmp_path / "log", clock) as log:
        for r in range(5):
            for k in range(40):
                model.append(log, b"k%02d" % k, b"r%d" % r)
        log.flush()
        stats = log.compact(force=True)
        assert stats.batches_dropped > 0
        check_log(log, model)
        assert log.compact(force=True).cleaned
        check_log(log, model)


def test_compressed_batches_are_cleaned(tmp_path, clock):
    """Kafka testCleanCompressed...: zstd batches lose records and stay readable."""
    model = Model()
    with make(tmp_path / "log", clock, compression="zstd") as log:
        for r in range(5):
            model.append_batch(log, [(b"k%02d" % k, b"%d" % r * 20) for k in range(30)])
        fill(log, model, keys=30, rounds=3)
        stats = log.compact(force=True)
        assert stats.batches_rewritten + stats.batches_dropped > 0
        check_log(log, model)


def test_headers_and_timestamps_survive_rewriting(tmp_path, clock):
    """Kafka: record headers and timestamps are preserved when a batch is re-encoded."""
    with make(tmp_path / "log", clock) as log:
        offs = log.append_batch(
            [(b"a", b"1"), (b"b", b"2"), (b"a", b"3")],
            timestamps_ms=[T0 + 1, T0 + 2, T0 + 3],
            headers=[{"h": b"1"}, {"h": b"2", "x": b""}, None],
        )
        for i in range(80):
            log.append(b"f%02d" % (i % 40), b"z" * 20)
        log.flush()
        log.compact(force=True)
        kept = {r.offset: r for r in log.read(end=offs.stop)}
        assert list(kept) == [offs[1], offs[2]]
        assert kept[offs[1]].headers == {"h": b"2", "x": b""}
        assert kept[offs[1]].timestamp == T0 + 2
        assert kept[offs[2]].timestamp == T0 + 3 and not kept[offs[2]].headers


def test_a_corrupt_batch_marks_the_log_uncleanable_and_changes_nothing(tmp_path, clock):
    """Kafka: a cleaner error marks the partition uncleanable; other logs go on."""
    from .helpers import batch_positions, flip_bit

    model = Model()
    path = tmp_path / "log"
    with make(path, clock) as log:
        fill(log, model)
    segment = sorted(path.glob("*.log"))[2]
    pos, _length = batch_positions(segment)[0]
    flip_bit(segment, pos + 60)
    before = {p.name: p.read_bytes() for p in path.iterdir() if p.suffix in (".log", ".idx")}
    with make(path, clock) as log:
        stats = log.compact(force=True)
        assert not stats.cleaned and "CRC" in stats.uncleanable
        assert log.reload_meta().uncleanable == stats.uncleanable
        after = {p.name: p.read_bytes() for p in path.iterdir() if p.suffix in (".log", ".idx")}
        assert after == before
        assert "uncleanable" in log.compact(force=True).skipped


def test_a_second_cleaner_gets_a_clear_error(tmp_path, clock):
    """Kafka LogCleanerManager: a log being cleaned is not handed to another cleaner."""
    with make(tmp_path / "log", clock) as log:
        fill(log, Model())
        with log.cleaner_lock(), pytest.raises(LogLockedError, match="another cleaner"):
            log.compact(force=True)
        assert isinstance(LogLockedError("x"), CompactLogError)
        assert log.compact(force=True).cleaned  # released: usable again


def test_abort_keeps_the_cleaner_point(tmp_path, clock):
    """Kafka abortCleaning: an aborted pass leaves the checkpoint untouched."""
    from compactlog.compaction import compact_log

    model = Model()
    with make(tmp_path / "log", clock) as log:
        fill(log, model)
        calls = iter(range(10_000))
        stats = compact_log(log, force=True, should_abort=lambda: next(calls) > 3)
        assert stats.aborted and not stats.cleaned
        assert read_cleaner_state(log.directory).first_dirty_offset == 0
        assert rewrite_files(log.directory) == []
        check_log(log, model)


def test_compact_delete_applies_retention_too(tmp_path, clock):
    """Kafka cleanup.policy=compact,delete: old segments are deleted as well as cleaned."""
    model = Model()
    with make(tmp_path / "log", clock, cleanup_policy="compact,delete", retention_ms=10_000) as log:
        for i in range(200):
            log.append(b"old%03d" % i, b"o" * 30)
        clock.advance(60_000)
        fill(log, model, rounds=4)
        stats = log.compact(force=True)
        assert stats.retention is not None and stats.retention.segments_deleted
        assert log.start_offset > 0


def test_throttle_caps_bytes_per_second(tmp_path, clock):
    """Kafka's cleaner throttler: read + write bytes per second stay under the cap."""
    from compactlog.compaction import compact_log
    from compactlog.compaction.cleaner import Throttler

    slept = []
    fake = [0.0]

    def sleep(seconds):
        slept.append(seconds)
        fake[0] += seconds

    throttler = Throttler(10_000, clock=lambda: fake[0], sleep=sleep)
    with make(tmp_path / "log", clock) as log:
        fill(log, Model())
        stats = compact_log(log, force=True, throttler=throttler)
    moved = stats.bytes_read + stats.bytes_written + stats.map_bytes_read + stats.verify_bytes_read
    assert throttler.bytes == moved
    assert sum(slept) == pytest.approx(moved / 10_000, rel=0.05)
