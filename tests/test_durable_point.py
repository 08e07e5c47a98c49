"""Damage is damage, a crash is a crash: below the durable point of the newest segment (the
sync point in ``.lock``, durable at ``flush()`` and covering the whole file after a clean
``close()``), bytes that fail their CRC or are missing are corruption for every reader,
read-only and writable alike, for ``verify`` and for ``repair``; only past it is a torn
tail that recovery may cut (``storage/durable.py``; docs/format.md, sections 7 and 10).

The log of each case: 400 records in batches of 10, flushed and closed cleanly, in one
segment (the active one).
"""

from __future__ import annotations

import os

import pytest

import compactlog
from compactlog.storage import filenames
from compactlog.storage.segment import list_segments

from .helpers import batch_positions
from .test_cli import run_json

RECORDS = 400
PER_BATCH = 10


@pytest.fixture
def closed_log(log_dir):
    with compactlog.open(log_dir, segment_bytes=1 << 20) as log:
        for start in range(0, RECORDS, PER_BATCH):
            log.append_batch([(b"k%03d" % i, b"v" * 40) for i in range(start, start + PER_BATCH)])
        log.flush()
    [base] = list_segments(str(log_dir))
    return log_dir, log_dir / filenames.segment_name(base)


def overwrite(path, position: int, data: bytes) -> None:
    with open(path, "r+b") as handle:
        handle.seek(position)
        handle.write(data)


def read_only(log_dir) -> list[int]:
    with compactlog.open(log_dir, read_only=True, create=False) as log:
        return [r.offset for r in log.read()]


def writable(log_dir) -> list[int]:
    with compactlog.open(log_dir, create=False) as log:
        return [r.offset for r in log.read()]


def subscriber(log_dir) -> list[int]:
    with compactlog.open(log_dir, read_only=True, create=False) as log:
        return [r.offset for r in log.subscribe("~s", start=0).poll(max_records=10_000)]


def latest(log_dir) -> list[int]:
    with compactlog.open(log_dir, read_only=True, create=False) as log:
        return [r.offset for r in log.latest()]


def assert_every_reader_raises(log_dir, error, match):
    for read in (read_only, subscriber, latest, writable):
        with pytest.raises(error, match=match):
            read(log_dir)


def test_16_bytes_overwritten_in_the_last_batch_are_damage_not_a_torn_tail(closed_log):
    log_dir, segment = closed_log
    last = batch_positions(segment)[-1][0]
    overwrite(segment, last + 60, b"\xff" * 16)
    match = f"at byte {last}: batch CRC mismatch below the durable point"
    assert_every_reader_raises(log_dir, compactlog.CorruptLogError, match)
    problems = run_json("verify", log_dir, check=1)["problems"]
    [problem] = [p for p in problems if p["kind"] == "corrupt_batch"]
    assert problem["position"] == last and "damage, not a torn tail" in problem["message"]
    assert not any("unsynced" in p["message"] for p in problems), problems
    fixes = run_json("repair", log_dir)["fixes"]
    assert not any("unsynced" in fix for fix in fixes), fixes
    assert any("lost to that damage" in fix for fix in fixes), fixes
    assert read_only(log_dir) == list(range(RECORDS - PER_BATCH))
    with compactlog.open(log_dir) as log:  # the damaged offsets are never handed out again
        assert log.append(b"new", b"record") == RECORDS


def test_the_active_segment_cut_in_half_is_missing_data_not_a_torn_tail(closed_log):
    log_dir, segment = closed_log
    size = os.path.getsize(segment)
    cut = max(p for p, _length in batch_positions(segment) if p < size // 2)
    os.truncate(segment, size // 2)  # (the batch at ``cut`` loses its end)
    match = f"at byte {cut}: incomplete batch .* below the durable point"
    assert_every_reader_raises(log_dir, compactlog.CorruptLogError, match)
    report = run_json("verify", log_dir, check=1)
    assert "missing_bytes" in {p["kind"] for p in report["problems"]}
    fixes = run_json("repair", log_dir)["fixes"]
    assert any("below its durable point" in fix for fix in fixes), fixes
    kept = read_only(log_dir)
    assert kept == list(range(len(kept))) and 0 < len(kept) < RECORDS
    run_json("verify", log_dir)  # (exit 0)
    with compactlog.open(log_dir) as log:
        assert log.append(b"new", b"record") == RECORDS


@pytest.mark.leaves_damage
def test_the_active_segment_cut_at_a_batch_boundary_is_missing_data(closed_log):
    log_dir, segment = closed_log
    os.truncate(segment, batch_positions(segment)[30][0])  # nothing invalid left to see
    assert_every_reader_raises(log_dir, compactlog.CorruptLogError, "made durable")


@pytest.mark.leaves_damage
def test_the_deleted_active_segment_is_named_by_every_reader(closed_log):
    log_dir, segment = closed_log
    os.remove(segment)
    with pytest.raises(compactlog.MissingSegmentError, match=segment.name):
        read_only(log_dir)
    with (
        compactlog.open(log_dir, read_only=True, create=False) as log,
        pytest.raises(compactlog.MissingSegmentError),
    ):
        log.end_offset  # noqa: B018
    with pytest.raises(compactlog.MissingSegmentError):
        writable(log_dir)
    report = run_json("verify", log_dir, check=1)
    assert "missing_segment" in {p["kind"] for p in report["problems"]}


def test_a_zeroed_file_header_below_the_durable_point_is_damage_not_an_unfinished_roll(
    closed_log,
):
    log_dir, segment = closed_log
    overwrite(segment, 0, bytes(16))
    match = f"{segment.name}: not a compactlog file"  # (the readers' error, a writable open's too)
    assert_every_reader_raises(log_dir, compactlog.NotALogError, match)
    assert os.path.getsize(segment) > 16  # (the writable open emptied nothing)
    fixes = run_json("repair", log_dir)["fixes"]
    assert any("rebuilt a damaged file header" in fix for fix in fixes), fixes
    assert read_only(log_dir) == list(range(RECORDS))
    with compactlog.open(log_dir) as log:
        assert log.append(b"new", b"record") == RECORDS


@pytest.mark.parametrize("with_index", [True, False], ids=["index kept", "index deleted"])
def test_repair_of_a_log_whose_only_segment_was_deleted_leaves_a_log_every_open_accepts(
    closed_log, with_index
):
    log_dir, segment = closed_log
    os.remove(segment)
    if not with_index:
        os.remove(segment.with_suffix(".idx"))
    fixes = run_json("repair", log_dir)["fixes"]
    assert f"fixed the log start offset in meta: 0 -> {RECORDS}" in fixes, fixes
    run_json("verify", log_dir)  # (exit 0)
    assert read_only(log_dir) == [] == subscriber(log_dir) == latest(log_dir)
    with compactlog.open(log_dir) as log:
        assert (log.start_offset, log.append(b"new", b"record")) == (RECORDS, RECORDS)
    assert read_only(log_dir) == [RECORDS]


def test_a_file_header_cut_short_below_the_durable_point_is_damage_not_an_unfinished_roll(
    closed_log,
):
    log_dir, segment = closed_log
    os.truncate(segment, 8)
    match = f"{segment.name}: file header is 8 bytes, expected 16"
    assert_every_reader_raises(log_dir, compactlog.NotALogError, match)
    assert os.path.getsize(segment) == 8  # (the writable open rewrote nothing)
    assert "bad_header" in {p["kind"] for p in run_json("verify", log_dir, check=1)["problems"]}
    fixes = run_json("repair", log_dir)["fixes"]
    assert any(f"offsets 0 to {RECORDS - 1} were lost" in fix for fix in fixes), fixes
    with compactlog.open(log_dir) as log:
        assert log.append(b"new", b"record") == RECORDS
