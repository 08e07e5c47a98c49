"""Retention for ``cleanup_policy="delete"``: whole closed segments go, the log start moves."""

from __future__ import annotations

import os

import compactlog
from compactlog.storage.segment import list_segments
from compactlog.storage.state_files import read_meta

from .helpers import segment_files

HOUR = 3_600_000


def fill(log, clock, segments, step_ms=0):
    """Append until the log has ``segments`` segments, moving the clock ``step_ms`` per
    record. Returns the records' offsets."""
    offsets = []
    while len(list_segments(log.directory)) < segments:
        offsets.append(log.append(b"k%d" % len(offsets), b"v" * 100))
        clock.advance(step_ms)
    return offsets


def test_retention_ms_removes_closed_segments_older_than_the_limit(log_dir, clock):
    config = dict(cleanup_policy="delete", retention_ms=HOUR, segment_bytes=1024, segment_ms=None)
    with compactlog.open(log_dir, clock=clock, **config) as log:
        fill(log, clock, 3)
        old = list_segments(str(log_dir))
        clock.advance(HOUR // 2)
        fill(log, clock, 5)
        assert log.enforce_retention().segments_deleted == []  # nothing is old enough yet
        clock.advance(HOUR // 2 + 1)
        result = log.enforce_retention()
        # the first two segments' newest records are now older than an hour; the third
        # (closed when the clock moved) holds records exactly one hour old
        assert result.segments_deleted == old[:2]
        assert result.bytes_deleted > 0
        assert log.start_offset == old[2] == result.log_start_offset
        assert read_meta(str(log_dir)).log_start_offset == old[2]
        assert next(iter(log.read())).offset == old[2]
        clock.advance(10 * HOUR)
        result = log.enforce_retention()
        bases = list_segments(str(log_dir))
        assert len(bases) == 1  # the active segment is never removed
        assert log.start_offset == bases[0]
        end = log.end_offset
        assert log.append(b"new", b"x") == end
    with compactlog.open(log_dir) as log:
        assert log.start_offset == bases[0]
        assert [r.offset for r in log.read()][-1] == end


def test_retention_bytes_keeps_the_newest_segments_within_the_limit(log_dir, clock):
    config = dict(cleanup_policy="delete", retention_bytes=3000, segment_bytes=1024)
    with compactlog.open(log_dir, clock=clock, **config) as log:
        fill(log, clock, 8)
        before = sum(p.stat().st_size for p in segment_files(log_dir))
        result = log.enforce_retention()
        after = sum(p.stat().st_size for p in segment_files(log_dir))
        assert result.segments_deleted
        assert after == before - result.bytes_deleted
        assert after <= 3000 + 1024  # within the limit, give or take the oldest kept segment
        first_kept = list_segments(str(log_dir))[0]
        # removing one more segment would have brought the log under the limit
        assert after - os.path.getsize(segment_files(log_dir)[0]) < 3000
        assert log.start_offset == first_kept
        assert [r.offset for r in log.read()] == list(range(first_kept, log.end_offset))


def test_retention_deletes_nothing_on_a_compacted_log(log_dir, clock):
    with compactlog.open(log_dir, clock=clock, segment_bytes=1024, retention_ms=1) as log:
        fill(log, clock, 4)
        clock.advance(HOUR)
        result = log.enforce_retention()
        assert result.segments_deleted == []
        assert log.start_offset == 0


def test_retention_with_no_limits_deletes_nothing(log_dir, clock):
    config = dict(cleanup_policy="delete", retention_ms=None, retention_bytes=None)
    with compactlog.open(log_dir, clock=clock, segment_bytes=1024, **config) as log:
        fill(log, clock, 4)
        clock.advance(1000 * HOUR)
        assert log.enforce_retention().segments_deleted == []


def test_a_reader_inside_a_removed_segment_reads_on(log_dir, clock):
    config = dict(cleanup_policy="delete", retention_ms=HOUR, segment_bytes=1024)
    with compactlog.open(log_dir, clock=clock, **config) as log:
        offsets = fill(log, clock, 4)
        bases = list_segments(str(log_dir))
        reader = log.read()
        first = next(reader)
        clock.advance(2 * HOUR)
        log.enforce_retention()
        assert log.start_offset == bases[-1]
        rest = [r.offset for r in reader]
        # the open segment is read to its end as it was; the removed ones are gone
        expected = list(range(bases[1])) + list(range(bases[-1], len(offsets)))
        assert [first.offset, *rest] == expected
