"""Open-time recovery and ``compactlog.repair``: what each fixes, and that neither deletes a
valid batch."""

from __future__ import annotations

import json
import os

import pytest

import compactlog
from compactlog.storage import filenames, swap
from compactlog.storage.fsio import DEFAULT_FS
from compactlog.storage.segment import list_segments, read_index
from compactlog.storage.state_files import list_checkpoints, read_meta, write_checkpoint, write_meta

from .helpers import batch_positions, body_position, flip_bit, segment_files


def build(log_dir, n=60, **config):
    config.setdefault("segment_bytes", 1024)
    with compactlog.open(log_dir, **config) as log:
        for i in range(n):
            log.append(b"k%03d" % i, b"v%03d" % i + b"." * 40)
    return list_segments(str(log_dir))


def offsets(log_dir):
    with compactlog.open(log_dir, read_only=True) as log:
        return [r.offset for r in log.read()]


def test_clean_reopen_reports_nothing(log_dir):
    build(log_dir)
    assert (log_dir / "clean_shutdown").exists()
    with compactlog.open(log_dir) as log:
        assert log.recovery_report == []
        assert not (log_dir / "clean_shutdown").exists()  # only between close and open


def test_stray_temporary_and_rewrite_files_are_removed_on_open(log_dir):
    bases = build(log_dir)
    (log_dir / "meta.tmp").write_bytes(b"half a meta")
    (log_dir / (filenames.segment_name(bases[0]) + ".rw")).write_bytes(b"half a rewrite")
    with compactlog.open(log_dir) as log:
        assert any("meta.tmp" in line for line in log.recovery_report)
        assert any(".rw" in line for line in log.recovery_report)
    assert not list(log_dir.glob("*.tmp")) and not list(log_dir.glob("*.rw"))
    assert offsets(log_dir) == list(range(60))


@pytest.mark.parametrize("damage", ["missing", "garbage"])
def test_damaged_indexes_are_rebuilt_on_open(log_dir, damage):
    bases = build(log_dir, index_interval_bytes=128)
    expected = {base: read_index(str(log_dir), base).tolist() for base in bases}
    for base in bases:
        path = log_dir / filenames.index_name(base)
        if damage == "missing":
            path.unlink()
        else:
            path.write_bytes(b"\xff" * 40)
    os.remove(log_dir / "clean_shutdown")
    with compactlog.open(log_dir) as log:
        assert sum("rebuilt index" in line for line in log.recovery_report) == len(bases)
    for base in bases:
        rebuilt = read_index(str(log_dir), base).tolist()
        assert rebuilt[-len(expected[base]) :] == expected[base] or not expected[base]
    assert offsets(log_dir) == list(range(60))


def test_segments_below_the_log_start_are_removed_on_open(log_dir):
    """Retention died after writing meta (step 1) and before removing the segments."""
    bases = build(log_dir)
    meta = read_meta(str(log_dir))
    meta.log_start_offset = bases[2]
    write_meta(DEFAULT_FS, str(log_dir), meta)
    with compactlog.open(log_dir) as log:
        assert log.start_offset == bases[2]
        assert sum("below the log start" in line for line in log.recovery_report) == 2
        assert [r.offset for r in log.read()] == list(range(bases[2], 60))
    assert list_segments(str(log_dir)) == bases[2:]


def test_a_deleted_segment_file_is_a_missing_segment_error(log_dir):
    bases = build(log_dir)
    os.remove(log_dir / filenames.segment_name(bases[1]))
    with pytest.raises(compactlog.MissingSegmentError, match="run repair") as error:
        compactlog.open(log_dir)
    assert isinstance(error.value, compactlog.CorruptLogError)
    report = compactlog.repair(log_dir)
    assert any("is missing" in fix for fix in report.fixes)
    with compactlog.open(log_dir) as log:
        assert [r.offset for r in log.read()] == [
            o for o in range(60) if not bases[1] <= o < bases[2]
        ]
        assert log.append(b"k", b"v") == 60


def test_a_deleted_first_segment_is_accepted_by_repair_with_a_new_log_start(log_dir):
    bases = build(log_dir)
    os.remove(log_dir / filenames.segment_name(bases[0]))
    os.remove(log_dir / filenames.index_name(bases[0]))
    with pytest.raises(compactlog.MissingSegmentError):
        compactlog.open(log_dir)
    report = compactlog.repair(log_dir)
    assert any("log start offset" in fix for fix in report.fixes)
    assert read_meta(str(log_dir)).log_start_offset == bases[1]
    with compactlog.open(log_dir) as log:
        assert log.start_offset == bases[1]
        assert [r.offset for r in log.read()] == list(range(bases[1], 60))


def test_a_deleted_active_segment_never_lets_offsets_be_reused(log_dir):
    bases = build(log_dir)
    os.remove(log_dir / filenames.segment_name(bases[-1]))
    with pytest.raises(compactlog.MissingSegmentError):
        compactlog.open(log_dir)
    compactlog.repair(log_dir)
    with compactlog.open(log_dir) as log:
        assert log.append(b"k", b"v") >= 60
        assert [r.offset for r in log.read()] == [*list(range(bases[-1])), log.end_offset - 1]


def test_repair_moves_checkpoints_below_the_log_start_up(log_dir):
    bases = build(log_dir)
    meta = read_meta(str(log_dir))
    meta.log_start_offset = bases[1]
    write_meta(DEFAULT_FS, str(log_dir), meta)
    with compactlog.open(log_dir):
        pass
    write_checkpoint(DEFAULT_FS, str(log_dir), "slow", 3)
    write_checkpoint(DEFAULT_FS, str(log_dir), "fine", 50)
    dry = compactlog.repair(log_dir, dry_run=True)
    assert any("'slow'" in fix for fix in dry.fixes)
    assert list_checkpoints(str(log_dir))["slow"] == 3  # a dry run changes nothing
    report = compactlog.repair(log_dir)
    assert any("'slow'" in fix for fix in report.fixes)
    assert not any("'fine'" in fix for fix in report.fixes)
    assert list_checkpoints(str(log_dir)) == {"slow": bases[1], "fine": 50}
    assert compactlog.repair(log_dir).clean


def test_repair_fixes_a_stale_log_start_offset(log_dir):
    bases = build(log_dir)
    for base in bases[:2]:
        os.remove(log_dir / filenames.segment_name(base))
        os.remove(log_dir / filenames.index_name(base))
    assert read_meta(str(log_dir)).log_start_offset == 0
    report = compactlog.repair(log_dir)
    assert any(f"0 -> {bases[2]}" in fix for fix in report.fixes)
    assert read_meta(str(log_dir)).log_start_offset == bases[2]
    assert offsets(log_dir) == list(range(bases[2], 60))


def test_repair_rebuilds_missing_indexes(log_dir):
    bases = build(log_dir, index_interval_bytes=100)
    before = {b: read_index(str(log_dir), b).tolist() for b in bases}
    for base in bases:
        os.remove(log_dir / filenames.index_name(base))
    report = compactlog.repair(log_dir)
    assert sum("rebuilt index" in fix for fix in report.fixes) == len(bases)
    for base in bases:
        assert read_index(str(log_dir), base) is not None
        assert set(map(tuple, before[base])) <= set(map(tuple, read_index(str(log_dir), base)))
    assert compactlog.repair(log_dir).clean


def test_repair_quarantines_a_corrupt_region_and_keeps_every_valid_batch(log_dir):
    with compactlog.open(log_dir) as log:
        for i in range(6):
            log.append_batch([(b"k%d-%d" % (i, j), b"v%d" % j) for j in range(10)])
    [segment] = segment_files(log_dir)
    positions = batch_positions(segment)
    bad_position, bad_length = positions[2]
    flip_bit(segment, body_position(bad_position))
    with pytest.raises(compactlog.CorruptLogError):
        list(compactlog.open(log_dir, read_only=True).read())
    report = compactlog.repair(log_dir)
    [quarantine] = list(log_dir.glob("*.quarantine"))
    assert quarantine.stat().st_size == bad_length
    assert any(str(bad_position) in fix and quarantine.name in fix for fix in report.fixes)
    expected = [o for o in range(60) if not 20 <= o < 30]
    with compactlog.open(log_dir) as log:
        assert [r.offset for r in log.read()] == expected
        assert log.append(b"k", b"v") == 60  # offsets are never reused
    assert compactlog.repair(log_dir).clean


def test_interrupted_swap_before_the_renames_is_rolled_back(log_dir):
    bases = build(log_dir)
    first = bases[0]
    log_rw = log_dir / (filenames.segment_name(first) + ".rw")
    log_rw.write_bytes((log_dir / filenames.segment_name(first)).read_bytes()[:16])
    (log_dir / (filenames.index_name(first) + ".rw")).write_bytes(b"")
    (log_dir / swap.SWAP_INTENT).write_text(json.dumps({"first": first, "others": bases[1:3]}))
    with compactlog.open(log_dir) as log:
        assert any("rolled back" in line for line in log.recovery_report)
        assert [r.offset for r in log.read()] == list(range(60))
    assert not (log_dir / swap.SWAP_INTENT).exists() and not log_rw.exists()


def test_interrupted_swap_after_the_renames_is_completed(log_dir):
    bases = build(log_dir)
    first, others = bases[0], bases[1:3]
    # the renamed rewrite holds the group's records (here: the same bytes concatenated)
    merged = (log_dir / filenames.segment_name(first)).read_bytes()
    for base in others:
        merged += (log_dir / filenames.segment_name(base)).read_bytes()[16:]
    (log_dir / filenames.segment_name(first)).write_bytes(merged)
    (log_dir / swap.SWAP_INTENT).write_text(json.dumps({"first": first, "others": others}))
    os.remove(log_dir / filenames.index_name(first))
    with compactlog.open(log_dir) as log:
        assert any("completed" in line for line in log.recovery_report)
        assert [r.offset for r in log.read()] == list(range(60))
    assert list_segments(str(log_dir)) == [first, *bases[3:]]


def test_a_new_logs_first_open_reports_nothing(tmp_path):
    with compactlog.open(tmp_path / "new") as log:
        assert log.recovery_report == []
    empty = tmp_path / "empty"
    empty.mkdir()
    with compactlog.open(empty) as log:
        assert log.recovery_report == []
