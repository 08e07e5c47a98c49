"""``reader.iter_batches``: a read lists the log's directory once, not once per segment.

A log of many segments used to be listed again after every segment (quadratic in the
number of segments). The reader keeps its listing and lists again only when a segment it
names is gone (the cleaner merged it, retention removed it) or when it has read the last
segment it knows of (the writer may have rolled since). It still follows offsets across
those changes: no record twice, none that exists missed.
"""

from __future__ import annotations

import pytest

import compactlog
from compactlog.engine import reader as reader_module
from compactlog.errors import MissingSegmentError
from compactlog.storage.segment import list_segments


@pytest.fixture
def listings(monkeypatch):
    """How many times the reader listed the directory."""
    calls = []

    def counting(directory: str) -> list[int]:
        calls.append(directory)
        return list_segments(directory)

    monkeypatch.setattr(reader_module, "list_segments", counting)
    return calls


def many_segments(path: str, records: int = 600) -> list[tuple[bytes, bytes]]:
    written = [(b"key-%05d" % i, b"value-%05d" % i) for i in range(records)]
    with compactlog.open(path, segment_bytes=1024) as log:
        for key, value in written:
            log.append(key, value)
    return written


def test_a_read_of_many_segments_lists_the_directory_at_most_twice(tmp_path, listings):
    path = str(tmp_path / "log")
    written = many_segments(path)
    with compactlog.open(path, read_only=True) as log:
        assert len(log.get_segments()) > 40
        listings.clear()
        got = [(r.key, r.value) for r in log.read()]
    assert got == written
    # once to start, once after the last segment to see whether the writer rolled
    assert len(listings) <= 2


def test_a_read_from_an_offset_in_the_middle_lists_the_directory_at_most_twice(tmp_path, listings):
    path = str(tmp_path / "log")
    written = many_segments(path)
    with compactlog.open(path, read_only=True) as log:
        listings.clear()
        got = [r.offset for r in log.read(start=300, end=500)]
    assert got == list(range(300, 500))
    assert len(listings) <= 2
    assert len(written) == 600


def test_segments_merged_by_the_cleaner_during_a_read_are_followed_by_offset(tmp_path, listings):
    path = str(tmp_path / "log")
    written = many_segments(path)
    # every key written twice: compaction drops the first copies and merges segments
    with compactlog.open(path, segment_bytes=1024) as log:
        for key, value in written:
            log.append(key, value + b"-2")
    with compactlog.open(path, segment_bytes=1024) as log:
        before = log.get_segments()
        records = log.read()
        head = [next(records) for _ in range(5)]
        listings.clear()
        log.compact(force=True)
        after = log.get_segments()
        assert set(before) - set(after), "the pass merged no segment away"
        rest = list(records)
    offsets = [r.offset for r in head + rest]
    assert offsets == sorted(set(offsets)), "a record was seen twice or out of order"
    # the first segment was open: read to its end as it was; every later offset is read
    # from what the cleaner left, exactly
    with compactlog.open(path, read_only=True) as log:
        surviving = [r.offset for r in log.read()]
    boundary = before[1]
    assert [o for o in offsets if o >= boundary] == [o for o in surviving if o >= boundary]
    assert len(listings) <= 10


def test_a_segment_that_stays_missing_is_reported(tmp_path, monkeypatch):
    path = str(tmp_path / "log")
    many_segments(path, 100)
    bases = list_segments(path)
    # a listing that always names a segment whose file does not exist
    monkeypatch.setattr(reader_module, "list_segments", lambda directory: [*bases, 10**6])
    with pytest.raises(MissingSegmentError):
        list(reader_module.iter_batches(path, 0, None))
