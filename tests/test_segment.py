"""Segments, file names and the sparse index, below the public API."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from compactlog.encoding.batch_encode import encode_batch
from compactlog.encoding.format import SEGMENT_FILE_HEADER
from compactlog.errors import CorruptLogError, MissingSegmentError, NotALogError
from compactlog.storage import filenames
from compactlog.storage.filenames import FileKind, parse_filename
from compactlog.storage.fsio import DEFAULT_FS
from compactlog.storage.segment import (
    HEADER_SIZE,
    SegmentReader,
    index_is_consistent,
    list_segments,
    lookup_position,
    read_index,
    scan_segment,
    write_index,
)


def write_segment(directory, base, batches):
    """A segment of single-record batches; returns (path, positions)."""
    data = bytearray(SEGMENT_FILE_HEADER)
    positions = []
    for i, value in enumerate(batches):
        positions.append(len(data))
        data += encode_batch([b"k%d" % i], [value], 1).to_bytes(base + i)
    path = os.path.join(directory, filenames.segment_name(base))
    with open(path, "wb") as handle:
        handle.write(data)
    return path, positions


def test_file_names_round_trip_through_the_one_parser():
    assert filenames.segment_name(42) == "00000000000000000042.log"
    assert parse_filename("00000000000000000042.log") == filenames.ParsedName(FileKind.SEGMENT, 42)
    assert parse_filename("00000000000000000042.idx").kind is FileKind.INDEX
    assert parse_filename("00000000000000000042.log.rw").base_offset == 42
    assert parse_filename("meta").kind is FileKind.META
    assert parse_filename("meta.123.0.tmp").kind is FileKind.TEMP
    assert parse_filename(filenames.checkpoint_name("reader")).kind is FileKind.CHECKPOINT
    assert parse_filename("42.log").kind is FileKind.UNKNOWN
    assert parse_filename("notes.txt").kind is FileKind.UNKNOWN


def test_temporary_names_are_unique_and_short_enough():
    long_name = filenames.checkpoint_name("x" * 126)
    assert len(long_name) <= 255
    names = {filenames.temp_name(long_name) for _ in range(3)}
    assert len(names) == 3
    assert all(len(n) <= 255 and parse_filename(n).kind is FileKind.TEMP for n in names)


def test_write_atomic_replaces_a_file_and_leaves_no_temporary(tmp_path):
    DEFAULT_FS.write_atomic(str(tmp_path), "state", b"one")
    DEFAULT_FS.write_atomic(str(tmp_path), "state", b"two")
    assert os.listdir(tmp_path) == ["state"]
    assert (tmp_path / "state").read_bytes() == b"two"


def test_segments_are_listed_in_offset_order(tmp_path):
    for base in (300, 0, 20):
        write_segment(str(tmp_path), base, [b"v"])
    (tmp_path / "00000000000000000005.idx").write_bytes(b"")
    assert list_segments(str(tmp_path)) == [0, 20, 300]


def test_scan_reports_the_valid_end_and_next_offset(tmp_path):
    path, positions = write_segment(str(tmp_path), 10, [b"a", b"bb", b"ccc"])
    data = Path(path).read_bytes()
    result = scan_segment(path, data, HEADER_SIZE, index_interval=1)
    assert result.valid_end == len(data)
    assert result.next_offset == 13
    assert result.torn_bytes == 0
    assert result.index_entries == [(10, positions[0]), (11, positions[1]), (12, positions[2])]


def test_truncated_trailing_batch_is_a_torn_tail(tmp_path):
    path, positions = write_segment(str(tmp_path), 0, [b"a", b"bb", b"ccc"])
    data = Path(path).read_bytes()[:-5]
    result = scan_segment(path, data, HEADER_SIZE)
    assert result.valid_end == positions[2]
    assert result.torn_bytes == len(data) - positions[2]
    assert result.next_offset == 2


def test_invalid_batch_followed_by_valid_data_is_corruption(tmp_path):
    path, positions = write_segment(str(tmp_path), 0, [b"a", b"bb", b"ccc"])
    data = bytearray(Path(path).read_bytes())
    data[positions[1] + 50] ^= 1
    with pytest.raises(CorruptLogError) as error:
        scan_segment(path, bytes(data), HEADER_SIZE)
    assert error.value.position == positions[1]
    assert error.value.path == path
    # a scan of a file's tail reports positions in the file, not in the bytes it was given
    with pytest.raises(CorruptLogError) as error:
        scan_segment(path, bytes(data[positions[0] :]), 0, origin=positions[0])
    assert error.value.position == positions[1]


def test_segment_reader_reads_from_a_position_and_stops_at_a_torn_tail(tmp_path):
    path, positions = write_segment(str(tmp_path), 0, [b"a", b"bb", b"ccc"])
    with open(path, "ab") as handle:
        handle.write(b"\x00" * 30)
    with SegmentReader(str(tmp_path), 0, last_segment=True) as reader:
        assert [b.base_offset for b in reader.batches(HEADER_SIZE)] == [0, 1, 2]
        assert [b.base_offset for b in reader.batches(positions[1])] == [1, 2]
    with (
        SegmentReader(str(tmp_path), 0, last_segment=False) as reader,
        pytest.raises(CorruptLogError, match="closed segment"),
    ):
        list(reader.batches(HEADER_SIZE))


def test_segment_reader_refuses_missing_and_foreign_files(tmp_path):
    with pytest.raises(MissingSegmentError):
        SegmentReader(str(tmp_path), 0, last_segment=True)
    (tmp_path / filenames.segment_name(0)).write_bytes(b"PK\x03\x04" + b"\0" * 40)
    with pytest.raises(NotALogError):
        SegmentReader(str(tmp_path), 0, last_segment=True)


def test_the_index_round_trips_and_finds_the_batch_at_or_before_an_offset(tmp_path):
    entries = [(100, 16), (110, 500), (130, 1200)]
    write_index(DEFAULT_FS, str(tmp_path), 100, entries)
    index = read_index(str(tmp_path), 100)
    assert index.tolist() == [[0, 16], [10, 500], [30, 1200]]
    assert lookup_position(index, 100, 100) == HEADER_SIZE
    assert lookup_position(index, 100, 109) == 16
    assert lookup_position(index, 100, 110) == 500
    assert lookup_position(index, 100, 129) == 500
    assert lookup_position(index, 100, 10_000) == 1200
    assert lookup_position(None, 100, 150) == HEADER_SIZE
    assert index_is_consistent(index, 2000)
    assert not index_is_consistent(index, 1200)  # points past the valid data
    assert not index_is_consistent(np.array([[5, 100], [3, 200]], dtype=np.uint32), 1000)
    assert not index_is_consistent(None, 1000)


def test_a_torn_index_entry_is_ignored(tmp_path):
    write_index(DEFAULT_FS, str(tmp_path), 0, [(0, 16), (5, 300)])
    path = tmp_path / filenames.index_name(0)
    with open(path, "ab") as handle:
        handle.write(b"\x01\x02\x03")
    assert read_index(str(tmp_path), 0).tolist() == [[0, 16], [5, 300]]
    path.write_bytes(b"garbage")
    assert read_index(str(tmp_path), 0) is None
