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


def test_a_run_of_small_batches_cut_at_the_end_ends_there(tmp_path):
    """Single appends come back as one run; read up to an end inside the run, the batch
    handed out ends at that end, so that a reader resuming from it misses nothing."""
    with compactlog.open(tmp_path, segment_bytes=1 << 20) as log:
        for i in range(10):
            log.append(b"k%d" % i, b"v%d" % i)
    batches = list(reader_module.iter_batches(str(tmp_path), 2, 5))
    assert [int(o) for b in batches for o in b.offsets] == [2, 3, 4]
    assert batches[-1].next_offset == 5


def test_a_subscriber_without_a_head_resumes_at_the_end_it_read(tmp_path, monkeypatch):
    """A log no writer has a head in (a replica): a poll reads up to the end offset it
    computed; the log may have grown since (a run of small batches now crosses that end).
    The next poll starts at that end, not past the records it left out."""
    with compactlog.open(tmp_path) as log:
        for i in range(10):
            log.append(b"k%d" % i, b"v%d" % i)
    for name in (".lock", "clean_shutdown", ".writers.lock"):
        (tmp_path / name).unlink(missing_ok=True)
    with compactlog.open(tmp_path, read_only=True) as log:
        subscriber = log.subscribe("~replica", start=0)
        computed = type(log).end_offset
        monkeypatch.setattr(type(log), "end_offset", property(lambda self: 5))
        first = [r.offset for r in subscriber.poll(100)]
        monkeypatch.setattr(type(log), "end_offset", computed)
        assert first == [0, 1, 2, 3, 4]
        assert subscriber.position == 5
        assert [r.offset for r in subscriber.poll(100)] == [5, 6, 7, 8, 9]
