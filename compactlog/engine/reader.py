"""Reading a range of offsets across segments, without the writers' lock.

The reader follows *offsets*, not files: after each segment it finds the segment holding the
next offset it wants. The directory is listed once per read, and again only when that
listing is no longer enough: a segment it names is gone (the cleaner merged it into the
segment before it, or retention removed it) or its last segment was read to the end (the
writer may have rolled to new ones). A segment replaced by the cleaner or removed by
retention while being read is read to its end as it was (its descriptor keeps the old file
alive); the next lookup lands in whatever holds the following offsets now, so no record is
seen twice and none that still exists is missed.

Why a listing is kept: a cleaner never creates a segment name except at the end of the log
(a roll) or as the first base of a group it merges (a name that already existed), so a
listing stays a correct map from offsets to files until one of its names is missing.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator

from ..encoding.batch_decode import RecordBatch
from ..errors import MissingSegmentError
from ..storage.durable import check_newest_present
from ..storage.segment import SegmentReader, list_segments
from ..storage.tail import scan_start

OPEN_ATTEMPTS = 20  # fresh listings in a row whose segment vanished before it was opened


def iter_batches(directory: str, start: int, end: int | None) -> Iterator[RecordBatch]:
    """Batches holding the offsets in ``[start, end)``, trimmed to that range. A run of
    consecutive small stored batches (single appends) comes back as one batch
    (:meth:`SegmentReader.runs`): callers work on offsets and columns, never on where
    stored batches begin."""
    wanted = Wanted(start, end)
    bases: list[int] | None = None  # the directory listing in use (None: list again)
    missing = 0  # segments found missing since a segment was last opened
    while end is None or wanted.next_offset < end:
        fresh = bases is None
        if bases is None:
            bases = list_segments(directory)
            check_newest_present(directory, bases)
        if not bases:
            return
        i = bisect.bisect_right(bases, wanted.next_offset) - 1
        if i < 0:
            i = 0
            wanted.next_offset = bases[0]
        base = bases[i]
        last = i == len(bases) - 1
        try:
            reader = SegmentReader(directory, base, last_segment=last)
        except MissingSegmentError:
            # merged away or removed since the listing was made: list again
            missing += fresh
            if missing >= OPEN_ATTEMPTS:
                raise
            bases = None
            continue
        missing = 0
        with reader:
            position = scan_start(reader.fd, directory, base, wanted.next_offset)
            yield from wanted.take(reader.runs(position))
        if wanted.done:
            return
        if last:
            bases = list_segments(directory)
            if not bases or bases[-1] <= base:
                return
        else:
            wanted.next_offset = max(wanted.next_offset, bases[i + 1])


class Wanted:
    """The offsets of ``[start, end)`` not read yet: :meth:`take` trims the batches read to
    them, in offset order (every reader of an offset range: :func:`iter_batches`, the CLI's
    salvaging reader)."""

    __slots__ = ("done", "end", "next_offset")

    def __init__(self, start: int, end: int | None) -> None:
        self.next_offset = start  # the first offset still wanted
        self.end = end
        self.done = False  # a batch at or past ``end`` was met: nothing more is wanted

    def take(self, batches: Iterable[RecordBatch]) -> Iterator[RecordBatch]:
        """``batches`` (in offset order) trimmed to the offsets wanted; batches wholly
        before them are skipped, and the first at or past ``end`` ends it."""
        end = self.end
        for batch in batches:
            if batch.next_offset <= self.next_offset:
                continue
            if end is not None and batch.base_offset >= end:
                self.done = True
                return
            trimmed = trim_batch(batch, self.next_offset, end)
            self.next_offset = trimmed.next_offset
            if len(trimmed):
                yield trimmed
            if end is not None and self.next_offset >= end:
                self.done = True
                return


def trim_batch(batch: RecordBatch, start: int, end: int | None) -> RecordBatch:
    """The records of ``batch`` with offsets in ``[start, end)`` (the batch itself when all
    of them are). A batch cut at ``end`` ends there: its ``next_offset`` is ``end``, not
    the stored batch's, so that a reader resuming from it (a subscriber's position) does
    not skip the offsets past ``end`` that it left out (a run of small batches read past
    the end offset a reader without a head computed a moment before, as on a replica)."""
    offsets = batch.offsets
    cut_at_end = end is not None and batch.next_offset > end
    if not cut_at_end and (not len(offsets) or offsets[0] >= start):
        return batch
    mask = offsets >= start
    if end is not None:
        mask &= offsets < end
    trimmed = batch.select(mask)
    if cut_at_end:
        assert end is not None
        trimmed.header = trimmed.header._replace(last_delta=end - 1 - trimmed.base_offset)
    return trimmed
