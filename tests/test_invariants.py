"""``compactlog.engine.invariants.check`` / ``Log.check()``: a clean log passes, and each invariant
violated on purpose is reported, naming its file and position."""

from __future__ import annotations

import os

import pytest

import compactlog
from compactlog.engine.invariants import check
from compactlog.errors import CorruptLogError, LogCheckError
from compactlog.storage import filenames
from compactlog.storage.fsio import DEFAULT_FS
from compactlog.storage.head import encode_head, read_log_head
from compactlog.storage.state_files import write_checkpoint

from .helpers import batch_positions, flip_bit, segment_files

pytestmark = pytest.mark.leaves_damage  # (each test damages its log: no teardown check)


def make_log(path, *, segments: int = 3, close: bool = True, **config):
    """A log of ``segments`` segments of several batches each, indexed every batch."""
    log = compactlog.open(path, segment_bytes=2048, index_interval_bytes=1, **config)
    n = 0
    while len(segment_files(path)) < segments:
        log.append_batch([(b"k%d" % (n + i), b"v" * 40) for i in range(5)])
        n += 5
    if close:
        log.close()
    return log


def problems(path, **options) -> list:
    with pytest.raises(LogCheckError) as raised:
        check(path, **options)
    return raised.value.problems


def test_a_clean_log_passes(log_dir):
    log = make_log(log_dir, close=False)
    log.check()
    log.check(deep=True)
    sub = log.subscribe("reader")
    sub.poll()
    sub.commit()
    sub.close()
    log.compact(force=True)
    log.check(deep=True)
    log.close()
    report = check(log_dir, deep=True)
    assert report.ok and report.segments == 3 and report.records == 65


def test_a_clean_exclusive_writers_log_passes_while_open(log_dir):
    with compactlog.open(log_dir, exclusive=True) as log:
        for i in range(50):
            log.append(b"k%d" % i, b"v")
        assert os.path.getsize(segment_files(log_dir)[-1]) > read_log_head(log_dir).active_size
        log.check(deep=True)  # (the reserved room past the head is not a torn tail)


def test_a_corrupted_byte_is_reported_with_file_and_position(log_dir):
    make_log(log_dir)
    first = segment_files(log_dir)[0]
    pos, length = batch_positions(first)[1]
    flip_bit(first, pos + length - 1)  # a body byte: only its CRC shows it
    check(log_dir)  # the cheap check reads headers only
    problem, *others = problems(log_dir, deep=True)
    assert (problem.kind, problem.file, problem.position) == ("corrupt_batch", first.name, pos)
    assert "CRC" in problem.message
    assert [p.kind for p in others] in ([], ["index"])  # (an entry may point at it)


def test_a_corrupted_header_is_reported_by_the_cheap_check(log_dir):
    make_log(log_dir)
    first = segment_files(log_dir)[0]
    pos, _length = batch_positions(first)[1]
    flip_bit(first, pos + 8, 3)  # the batch magic
    found = problems(log_dir)
    assert ("corrupt_batch", first.name, pos) in [(p.kind, p.file, p.position) for p in found]


def test_the_error_names_file_and_position_and_lists_every_problem(log_dir):
    make_log(log_dir)
    first = segment_files(log_dir)[0]
    pos, _length = batch_positions(first)[1]
    flip_bit(first, pos + 8, 3)
    write_checkpoint(DEFAULT_FS, str(log_dir), "late", 10**6)
    with pytest.raises(LogCheckError) as raised:
        check(log_dir)
    error = raised.value
    assert isinstance(error, CorruptLogError)
    assert error.path == str(first) and error.position == pos
    kinds = [p.kind for p in error.problems]
    assert kinds[0] == "corrupt_batch" and kinds[-1] == "checkpoint"
    assert f"{len(error.problems)} invariant(s) violated" in str(error)


def test_a_segment_removed_from_the_middle_is_reported(log_dir):
    make_log(log_dir)
    middle = segment_files(log_dir)[1]
    os.remove(middle)
    [problem] = problems(log_dir)
    assert problem.kind == "missing_segment"
    assert problem.file == filenames.index_name(int(middle.stem))


def test_overlapping_segments_are_reported(log_dir):
    make_log(log_dir)
    second = segment_files(log_dir)[1]
    os.rename(second, second.with_name(filenames.segment_name(int(second.stem) - 1)))
    kinds = {p.kind for p in problems(log_dir)}
    assert "offsets" in kinds


def test_an_index_entry_pointing_wrong_is_reported(log_dir):
    make_log(log_dir)
    first = segment_files(log_dir)[0]
    index = first.with_suffix(".idx")
    data = bytearray(index.read_bytes())
    assert len(data) >= 16 + 3 * 8
    # entry 1 keeps its offset but points at entry 2's batch
    data[16 + 8 + 4 : 16 + 8 + 8] = data[16 + 16 + 4 : 16 + 16 + 8]
    data[16 + 16 : 16 + 24] = data[16 + 24 : 16 + 32] if len(data) >= 16 + 32 else data[16:24]
    index.write_bytes(bytes(data[: 16 + 16]))  # entries 0 and 1 only: still increasing
    [problem] = problems(log_dir)
    assert (problem.kind, problem.file, problem.position) == ("index", index.name, 16 + 8)
    assert "the batch there starts at offset" in problem.message


def test_a_checkpoint_past_the_end_is_reported(log_dir):
    make_log(log_dir)
    end = read_log_head(log_dir).end_offset
    write_checkpoint(DEFAULT_FS, str(log_dir), "ahead", end + 1)
    [problem] = problems(log_dir)
    assert problem.kind == "checkpoint" and "beyond the log end" in problem.message


def test_a_head_outside_the_newest_segment_is_reported(log_dir):
    log = make_log(log_dir, close=False)
    head = read_log_head(log_dir)
    with log.writer.lock:
        fd = os.open(log_dir / filenames.WRITER_LOCK, os.O_WRONLY)
        try:
            os.pwrite(fd, encode_head(head._replace(end_offset=head.end_offset + 3)), 0)
            with pytest.raises(LogCheckError) as raised:
                check(log_dir, head_is_fact=True)
            os.pwrite(fd, encode_head(head._replace(active_base=0)), 0)
            with pytest.raises(LogCheckError) as named:
                check(log_dir, head_is_fact=True)
            os.pwrite(fd, encode_head(head), 0)
        finally:
            os.close(fd)
    [problem] = raised.value.problems
    assert problem.kind == "head" and f"end offset is {head.end_offset + 3}" in problem.message
    [problem] = named.value.problems
    assert problem.kind == "head" and "the newest segment is" in problem.message
    log.check()
    log.close()
