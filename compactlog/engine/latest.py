"""The latest state: the newest non-tombstone record of every key below an offset.

Correct whether or not the log was compacted, in two passes over the same open segment
files. Below the cleaner point ``p`` (the clean tail) a cleaning pass left every key at
most once; only the dirty section ``[p, end)`` may hold several versions of a key. Pass 1
reads the dirty section alone and maps each key digest to its latest offset there (24 bytes per
distinct key); pass 2 keeps each non-tombstone record that is its key's latest in the
dirty section, or lies in the tail with a key the dirty section does not hold
(:class:`~compactlog.engine.dirtyindex.DirtyIndex`, also the Spark source's rule; no key is hashed
in pass 2 when the dirty section is empty). Both passes are columnar
(:func:`latest_batches` yields filtered
:class:`~compactlog.encoding.batch_decode.RecordBatch` objects);
:func:`latest_records` turns them into :class:`~compactlog.encoding.batch_decode.Record` objects.

Consistency: every segment overlapping the range is opened before pass 1 and both passes
read those descriptors, so a cleaner swapping segments meanwhile (or retention removing
them) changes nothing the passes see: the old files stay readable through their open
descriptors. Output is in offset order.

Exactness (:func:`check_exact`, also the rule of Spark's ``asOfOffset``): ``as_of`` below
the cleaner point is refused with :class:`~compactlog.errors.InexactReadError` naming the
lowest exact offset. With ``allow_inexact=True`` it gives, as Kafka does, *at least* the
state as of ``as_of`` for keys not rewritten since: compaction keeps only the latest record
of a key, so a key whose record before ``as_of`` was superseded by one at or after
``as_of`` may be missing.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..encoding.batch_decode import Record, RecordBatch, filter_batch
from ..errors import InexactReadError, MissingSegmentError
from ..storage.segment import HEADER_SIZE, SegmentReader, list_segments
from ..storage.state_files import read_cleaner_state
from .dirtyindex import DirtyIndex, dirty_map_of

if TYPE_CHECKING:
    from .logview import LogView

OPEN_ATTEMPTS = 20
MASK_RECORDS = 1 << 16  # records of consecutive batches judged together (latest_batches)
REMEMBER_BYTES = 64 << 20  # a dirty section this small is read once, not once per pass


class _OpenSegments:
    """Every segment overlapping ``[start, end)``, opened at once (a file-level snapshot)."""

    def __init__(self, directory: str, start: int, end: int) -> None:
        self.start = start
        self.end = end
        self.readers: list[SegmentReader] = []
        for attempt in range(OPEN_ATTEMPTS):
            bases = list_segments(directory)
            first = max(bisect.bisect_right(bases, start) - 1, 0)
            try:
                for i in range(first, len(bases)):
                    if bases[i] >= end:
                        break
                    self.readers.append(
                        SegmentReader(directory, bases[i], last_segment=i == len(bases) - 1)
                    )
                return
            except MissingSegmentError:
                # a cleaner or retention removed a segment between listing and opening
                self.close()
                if attempt == OPEN_ATTEMPTS - 1:
                    raise

    def close(self) -> None:
        for reader in self.readers:
            reader.close()
        self.readers = []

    def __enter__(self) -> _OpenSegments:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def batches(self, start: int | None = None, stop: int | None = None) -> Iterator[RecordBatch]:
        """Batches holding offsets in ``[start, stop)`` (at most the opened range), each
        offset at most once; segments wholly below ``start`` are not read.

        Follows offsets: a listing taken in the middle of a segment swap may show a merged
        first segment next to the old segments it replaces; offsets already seen are skipped.
        """
        next_offset = self.start if start is None else max(start, self.start)
        end = self.end if stop is None else min(stop, self.end)
        readers = self.readers
        first = 0
        while first + 1 < len(readers) and readers[first + 1].base <= next_offset:
            first += 1
        for reader in readers[first:]:
            for batch in reader.runs(HEADER_SIZE):
                if batch.next_offset <= next_offset:
                    continue
                if batch.base_offset >= end:
                    return
                offsets = batch.offsets
                if len(offsets) and (offsets[0] < next_offset or offsets[-1] >= end):
                    batch = filter_batch(batch, (offsets >= next_offset) & (offsets < end))
                next_offset = batch.next_offset
                if len(batch):
                    yield batch


def check_exact(
    as_of: int,
    cleaner_point: int,
    end: int,
    *,
    allow_inexact: bool,
    names: tuple[str, str] = ("as_of", "allow_inexact=True"),
) -> None:
    """Refuse a state as of an offset below the cleaner point (``names``: how the caller
    spells the offset and the escape hatch): compaction may have removed records of it."""
    if as_of < min(cleaner_point, end) and not allow_inexact:
        offset_name, escape = names
        raise InexactReadError(
            f"{offset_name}={as_of} is below the cleaner point {cleaner_point}: "
            f"compaction may have removed records of that state. The lowest offset with an "
            f"exact state is {cleaner_point}; set {escape} to read anyway (Kafka's "
            "rule: every key at least its latest record not rewritten since)"
        )


def latest_batches(
    log: LogView, as_of: int | None = None, *, allow_inexact: bool = False
) -> Iterator[RecordBatch]:
    """Columnar :func:`latest_records`: batches holding only each key's latest record below
    ``as_of`` (default: the end offset at the call), tombstones and keyless records left out.
    ``as_of`` below the cleaner point raises :class:`InexactReadError` at the call unless
    ``allow_inexact`` (see :func:`check_exact`).
    """
    end = log.end_offset
    if as_of is not None:
        check_exact(
            as_of,
            read_cleaner_state(log.directory).first_dirty_offset,
            end,
            allow_inexact=allow_inexact,
        )
        # past the end it is the latest state: every structure sized by the range (the
        # dirty section's bitmap, ``DirtyIndex``) stays sized by the log, whatever ``as_of``
        end = min(end, as_of)
    return _latest_batches(log, end)


def _latest_batches(log: LogView, end: int) -> Iterator[RecordBatch]:
    start = log.start_offset
    if end <= start:
        return
    # read before the segments are opened: a pass finishing in between only removes more
    # records below the point read, so every key there still appears at most once
    point = max(min(read_cleaner_state(log.directory).first_dirty_offset, end), start)
    with _OpenSegments(log.directory, start, end) as segments:
        dirty_batches = _Remembered(REMEMBER_BYTES)  # pass 1's, if small: not read twice
        dirty_map = dirty_map_of(dirty_batches.through(segments.batches(point)))
        dirty = DirtyIndex(dirty_map, point, end) if len(dirty_map) else None
        batches = (
            itertools.chain(segments.batches(stop=point), dirty_batches.batches)
            if dirty_batches.complete
            else segments.batches()
        )
        for group in _groups(batches, MASK_RECORDS):
            sizes = [len(batch) for batch in group]
            keep = _latest_mask(group, dirty)
            starts = np.cumsum([0, *sizes[:-1]])  # (no batch is empty: batches() skips them)
            kept_counts = np.add.reduceat(keep, starts).tolist()
            for batch, first, size, kept in zip(
                group, starts.tolist(), sizes, kept_counts, strict=True
            ):
                if kept == size:
                    yield batch
                elif kept:
                    yield filter_batch(batch, keep[first : first + size])


class _Remembered:
    """The batches passed :meth:`through`, kept while their keys and values stay within
    ``budget`` bytes (``complete`` then), else dropped."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.batches: list[RecordBatch] = []
        self.complete = True

    def through(self, batches: Iterator[RecordBatch]) -> Iterator[RecordBatch]:
        for batch in batches:
            if self.complete:
                self.budget -= len(batch.keys_blob) + len(batch.values_blob)
                if self.budget >= 0:
                    self.batches.append(batch)
                else:
                    self.complete, self.batches = False, []
            yield batch


def _groups(batches: Iterator[RecordBatch], records: int) -> Iterator[list[RecordBatch]]:
    """Consecutive batches gathered until they hold at least ``records`` records."""
    group: list[RecordBatch] = []
    count = 0
    for batch in batches:
        group.append(batch)
        count += len(batch)
        if count >= records:
            yield group
            group, count = [], 0
    if group:
        yield group


def _latest_mask(group: list[RecordBatch], dirty: DirtyIndex | None) -> np.ndarray:
    """Which records of ``group`` (consecutive batches) the latest state keeps: keyed, not
    tombstones, and (with a dirty section) each key's latest. One mask for the whole group:
    the digests and lookups run once per group, not once per stored batch."""
    if len(group) == 1:
        columns: Any = group[0]
    else:
        # (the key columns only, as ``batch_decode.concat_columns`` joins them: the values
        # are not needed to judge a record, and copying them would cost more than the rest)
        columns = _Joined(
            np.concatenate([b.offsets for b in group]),
            np.concatenate([b.key_lengths for b in group]),
            np.concatenate([b.value_lengths for b in group]),
            b"".join([b.keys_blob for b in group]),
        )
    keep = (columns.key_lengths >= 0) & (columns.value_lengths >= 0)
    if dirty is not None:
        keep &= dirty.latest_mask(columns)
    return keep


class _Joined(NamedTuple):
    """The columns ``DirtyIndex.latest_mask`` reads, of several batches laid end to end."""

    offsets: np.ndarray
    key_lengths: np.ndarray
    value_lengths: np.ndarray
    keys_blob: bytes


def latest_records(
    log: LogView, as_of: int | None = None, *, allow_inexact: bool = False
) -> Iterator[Record]:
    """The latest non-tombstone record of every key among offsets below ``as_of``, in
    offset order."""
    batches = latest_batches(log, as_of, allow_inexact=allow_inexact)
    return itertools.chain.from_iterable(map(RecordBatch.records, batches))


def latest_dict(
    log: LogView, as_of: int | None = None, *, allow_inexact: bool = False
) -> dict[bytes, bytes]:
    """``{key: value}`` of the latest state (a convenience for small logs and tests)."""
    result: dict[bytes, bytes] = {}
    for record in latest_records(log, as_of, allow_inexact=allow_inexact):
        assert record.key is not None and record.value is not None
        result[record.key] = record.value
    return result


__all__ = ["check_exact", "latest_batches", "latest_dict", "latest_records"]
