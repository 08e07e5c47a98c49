"""Offset ranges over a log's segments: how a read is cut into Spark partitions.

Kept apart from :mod:`compactlog.restore.plan` so that a stream's planner, which only bounds
micro-batches (:func:`records_end`) and cuts them (:func:`split_range`), does not import the
batch read's machinery (the offset map and the compaction package behind it, snapshots): the
Python processes Spark starts for each streaming query import this module, and every import
is paid per query.
"""

from __future__ import annotations

import bisect
import itertools
import math
import os
from dataclasses import dataclass

from ..errors import MissingSegmentError
from ..storage.head import read_log_head
from ..storage.segment import SegmentReader, list_segments, segment_data_size
from ..storage.state_files import read_cleaner_state
from ..storage.tail import scan_start

PARTITION_BYTES = 128 << 20


@dataclass(frozen=True, slots=True)
class Partition:
    """One task's share: offsets ``[start, end)`` of the snapshot."""

    index: int
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class _Piece:
    """One segment's share ``[start, end)`` of a range, and its estimated bytes."""

    start: int
    end: int
    size: float


def _pieces(directory: str, start: int, end: int) -> list[_Piece]:
    """The segments holding ``[start, end)``, each cut to the range, with its file size
    scaled by the share of its offsets inside the range (records per offset are taken as
    even within a segment; the last segment is taken to end at ``end``). A segment that
    vanished since the listing (the cleaner swapped it on a live log) counts 0 bytes: the
    sizes only balance partitions, the reader follows offsets whatever the files."""
    bases = list_segments(directory)
    first = max(bisect.bisect_right(bases, start) - 1, 0)
    head = read_log_head(directory)  # (sizes of data: no room an exclusive writer reserved)
    pieces = []
    for i in range(first, len(bases)):
        base = bases[i]
        if base >= end:
            break
        upper = bases[i + 1] if i + 1 < len(bases) else end
        lo, hi = max(base, start), min(upper, end)
        if hi <= lo:
            continue
        try:
            size = segment_data_size(directory, base, head)
        except FileNotFoundError:
            size = 0
        pieces.append(_Piece(lo, hi, size * (hi - lo) / max(upper - base, 1)))
    return pieces


def plan_partitions(
    directory: str, start: int, end: int, wanted: int | None = None
) -> list[Partition]:
    """Offset ranges over groups of whole segments, of about equal bytes (a batch read has
    many partitions, and whole segments keep each task's reads sequential)."""
    if end <= start:
        return [Partition(0, start, start)]
    pieces = _pieces(directory, start, end)
    total = sum(p.size for p in pieces)
    if wanted is None:
        wanted = max(os.cpu_count() or 2, math.ceil(total / PARTITION_BYTES))
    count = max(1, min(wanted, len(pieces)))
    target = total / count
    bounds = [start]
    acc = 0.0
    for piece, following in itertools.pairwise(pieces):
        acc += piece.size
        if acc >= target * len(bounds) and len(bounds) < count:
            bounds.append(following.start)
    bounds.append(end)
    return _partitions(bounds)


def split_range(directory: str, start: int, end: int, count: int) -> list[Partition]:
    """``count`` offset ranges of about equal bytes, cut inside segments where the byte
    share falls. A stream's micro-batch runs as one wave of ``count`` tasks (one per core)
    and ends with its slowest task, so equal shares matter more than whole segments: a
    micro-batch of 1M records spans a handful of segments, and cutting only between them
    left one task 30% more records than the other."""
    if end <= start:
        return []
    pieces = _pieces(directory, start, end)
    total = sum(p.size for p in pieces)
    if total <= 0:  # sizes unknown (files vanished): even offsets
        pieces, total = [_Piece(start, end, float(end - start))], float(end - start)
    bounds = [start]
    acc = 0.0
    for piece in pieces:
        while len(bounds) < count and acc + piece.size >= total * len(bounds) / count:
            share = (total * len(bounds) / count - acc) / piece.size if piece.size else 0.0
            bounds.append(piece.start + round(share * (piece.end - piece.start)))
        acc += piece.size
    bounds.append(end)
    return _partitions(bounds)


def records_end(directory: str, start: int, end: int, records: int) -> int:
    """The end of the range from ``start`` that holds at most ``records`` records, as far
    towards ``end`` as that allows: a stream's ``maxRecordsPerTrigger``.

    ``records`` offsets never hold more than ``records`` records, but below the cleaner
    point (``first_dirty_offset``) compaction leaves holes, and a range of offsets there
    may hold none at all. A stream that cut its micro-batches by offsets alone spent its
    triggers on emptied ranges: behind a log appended faster than it read, it never caught
    up, and every batch came out empty. So below the cleaner point the records are counted
    from the batch headers, and the batch that straddles ``start`` or holds the cut is
    decoded for its offsets (a compacted batch keeps its base offset, so its first record
    may come later); past the cleaner point offsets are dense and taken as records. A swap
    or a removal met on the way stops the count there, so the result holds at most
    ``records`` records whatever the cleaner does meanwhile (a range of offsets only ever
    loses records)."""
    if end - start <= records:
        return end
    counted, at = 0, start  # ``counted`` records hold the offsets in [start, at)
    dense_from = read_cleaner_state(directory).first_dirty_offset
    bases = list_segments(directory)
    first = max(bisect.bisect_right(bases, start) - 1, 0)
    for i in range(first, len(bases)):
        if at >= dense_from or at >= end:
            break
        try:
            with SegmentReader(directory, bases[i], last_segment=i == len(bases) - 1) as reader:
                for position, header in reader.headers(
                    scan_start(reader.fd, directory, bases[i], at)
                ):
                    if header.next_offset <= at:
                        continue
                    if header.base_offset >= dense_from:
                        at = max(at, header.base_offset)  # (nothing between: walked)
                        break
                    if header.base_offset < at or counted + header.count > records:
                        batch = next(reader.batches(position))
                        offsets = batch.offsets[batch.offsets >= at]
                        if counted + len(offsets) > records:
                            return min(end, int(offsets[records - counted]))
                        counted += len(offsets)
                    else:
                        counted += header.count
                    at = header.next_offset
                else:  # the segment read to its end: the next one holds what follows
                    if i + 1 < len(bases):
                        at = max(at, bases[i + 1])
                    continue
                break
        except MissingSegmentError:
            break  # swapped or removed since the listing: count no further
    return min(end, at + records - counted)


def _partitions(bounds: list[int]) -> list[Partition]:
    pairs = [(lo, hi) for lo, hi in itertools.pairwise(bounds) if hi > lo]
    return [Partition(i, lo, hi) for i, (lo, hi) in enumerate(pairs)]


__all__ = ["PARTITION_BYTES", "Partition", "plan_partitions", "records_end", "split_range"]
