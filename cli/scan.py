"""Whole-log inspections built on the library's own scanning (never a second parser).

Batches are read with ``compactlog.storage.segment.SegmentReader`` (offset ranges trimmed by
``compactlog.engine.reader.Wanted``), resynced with ``find_next_valid_batch``; file names are
classified by ``compactlog.storage.filenames.parse_filename``; state files are read through
``compactlog.storage.state_files``. ``verify`` is
``compactlog.engine.invariants.verify_log``, the checks of ``Log.check()``. This module
only walks and reports.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from compactlog.encoding.batch_decode import RecordBatch
from compactlog.encoding.format import find_next_valid_batch
from compactlog.engine.invariants import MappedFile, Problem, VerifyReport, verify_log
from compactlog.engine.reader import Wanted
from compactlog.errors import CompactLogError, CorruptLogError
from compactlog.storage import filenames
from compactlog.storage.head import read_log_head
from compactlog.storage.segment import (
    HEADER_SIZE,
    SegmentReader,
    bound_by_head,
    index_is_consistent,
    index_path,
    list_segments,
    lookup_position,
    read_index,
    segment_path,
)


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


# -- per-segment summaries -----------------------------------------------------------------


@dataclass
class SegmentSummary:
    base: int
    size: int
    index_size: int
    batches: int = 0
    records: int = 0
    next_offset: int | None = None  # offset after the last batch (None: empty)
    min_timestamp: int | None = None
    max_timestamp: int | None = None
    active: bool = False
    error: str | None = None

    @property
    def name(self) -> str:
        return filenames.segment_name(self.base)


def summarize_segments(directory: str) -> list[SegmentSummary]:
    """Batch headers of every segment (CRC-checked, bodies not decoded): counts, offsets,
    time range. A corrupt segment gets ``error`` and the counts read before the damage."""
    bases = list_segments(directory)
    head = read_log_head(directory)
    out = []
    for i, base in enumerate(bases):
        last = i == len(bases) - 1
        summary = SegmentSummary(
            base,
            bound_by_head(_file_size(segment_path(directory, base)), base, head),
            _file_size(index_path(directory, base)),
            active=last,
        )
        try:
            with SegmentReader(directory, base, last_segment=last) as reader:
                for _pos, header in reader.headers(HEADER_SIZE):
                    summary.batches += 1
                    summary.records += header.count
                    summary.next_offset = header.next_offset
                    if header.count:
                        first = header.first_ts
                        if summary.min_timestamp is None or first < summary.min_timestamp:
                            summary.min_timestamp = first
                        if summary.max_timestamp is None or header.max_ts > summary.max_timestamp:
                            summary.max_timestamp = header.max_ts
        except CompactLogError as error:
            summary.error = str(error)
        out.append(summary)
    return out


def byte_position(directory: str, base: int, offset: int) -> int:
    """Byte position in segment ``base`` of the first batch holding an offset >= ``offset``
    (the file size when there is none)."""
    path = segment_path(directory, base)
    entries = read_index(directory, base)
    size = _file_size(path)
    hint = lookup_position(entries, base, offset) if index_is_consistent(entries, size) else 0
    with SegmentReader(directory, base, last_segment=True) as reader:
        for pos, header in reader.headers(max(hint, HEADER_SIZE)):
            if header.next_offset > offset:
                return pos
        return reader.readable_size()  # (the data's end: no reserved room)


def bytes_from(directory: str, summaries: list[SegmentSummary], offset: int) -> int:
    """Bytes of batch data at or after ``offset`` (file headers not counted)."""
    total = 0
    for summary in summaries:
        if summary.next_offset is None or summary.next_offset <= offset:
            continue
        if summary.base >= offset:
            total += max(summary.size - HEADER_SIZE, 0)
        else:
            total += summary.size - byte_position(directory, summary.base, offset)
    return total


def data_bytes(summaries: list[SegmentSummary]) -> int:
    return sum(max(s.size - HEADER_SIZE, 0) for s in summaries)


def records_from(summaries: list[SegmentSummary], offset: int, directory: str) -> int:
    """Records at or after ``offset``: whole segments from their headers, the segment
    holding ``offset`` batch by batch (a batch cut by ``offset`` counts its offsets)."""
    total = 0
    for summary in summaries:
        if summary.next_offset is None or summary.next_offset <= offset:
            continue
        if summary.base >= offset:
            total += summary.records
            continue
        with SegmentReader(directory, summary.base, last_segment=True) as reader:
            for _pos, header in reader.headers(HEADER_SIZE):
                if header.base_offset >= offset:
                    total += header.count
                elif header.next_offset > offset:
                    total += min(header.count, header.next_offset - offset)
    return total


# -- reading what is readable --------------------------------------------------------------


def salvage_batches(
    directory: str,
    start: int,
    end: int | None,
    on_problem: Callable[[CorruptLogError], None],
) -> Iterator[RecordBatch]:
    """Batches holding offsets in ``[start, end)``, skipping damaged regions.

    Like ``compactlog.engine.reader.iter_batches`` but a corrupt batch is reported to
    ``on_problem`` and reading resumes at the next valid batch (found with the library's
    ``find_next_valid_batch``) instead of stopping. A torn tail of the newest segment is
    not a problem: it is a write in progress.
    """
    bases = list_segments(directory)
    first = max(bisect.bisect_right(bases, start) - 1, 0)
    wanted = Wanted(start, end)
    for i in range(first, len(bases)):
        base = bases[i]
        if end is not None and base >= end:
            return
        last = i == len(bases) - 1
        path = segment_path(directory, base)
        entries = read_index(directory, base)
        position = HEADER_SIZE
        if index_is_consistent(entries, _file_size(path)):
            position = lookup_position(entries, base, wanted.next_offset)
        try:
            reader = SegmentReader(directory, base, last_segment=last)
        except CompactLogError as error:
            on_problem(error if isinstance(error, CorruptLogError) else _as_corrupt(error, path))
            continue
        with reader:
            while True:
                try:
                    yield from wanted.take(reader.batches(position))
                    if wanted.done:
                        return
                    break
                except CorruptLogError as error:
                    on_problem(error)
                    resume = _next_valid(path, error.position)
                    if resume is None:
                        break
                    position = resume  # always past the error: the loop makes progress


def _as_corrupt(error: CompactLogError, path: str) -> CorruptLogError:
    return CorruptLogError(str(error), path=path, position=0)


def _next_valid(path: str, position: int) -> int | None:
    with MappedFile(path) as data:
        if not data:
            return None
        return find_next_valid_batch(data, position, len(data))


def offset_for_timestamp(directory: str, start: int, timestamp_ms: int) -> int | None:
    """The first offset whose record timestamp is >= ``timestamp_ms`` (Kafka's
    offsetsForTimes); ``None`` when every record is older."""
    from compactlog.engine.reader import iter_batches

    for batch in iter_batches(directory, start, None):
        if batch.header.max_ts < timestamp_ms:
            continue
        hits = (batch.timestamps >= timestamp_ms).nonzero()[0]
        if len(hits):
            return int(batch.offsets[int(hits[0])])
    return None


__all__ = [
    "Problem",
    "SegmentSummary",
    "VerifyReport",
    "byte_position",
    "bytes_from",
    "data_bytes",
    "offset_for_timestamp",
    "records_from",
    "salvage_batches",
    "summarize_segments",
    "verify_log",
]


def batch_bytes(directory: str) -> int:
    """Bytes of batches in every segment: file headers and an exclusive writer's reserved
    room aside (``meta``'s ``size_bytes``)."""
    head = read_log_head(directory)
    return sum(
        max(bound_by_head(_file_size(segment_path(directory, base)), base, head) - HEADER_SIZE, 0)
        for base in list_segments(directory)
    )


def dirty_figures(directory: str, config: Any, log_start: int) -> dict[str, Any]:
    """The dirty ratio and its parts as ``meta`` and ``stats`` show them: the one
    definition (``compactlog.compaction.dirty``), measured now."""
    import time

    from compactlog.compaction.dirty import measure_log

    share = measure_log(
        directory,
        min_compaction_lag_ms=config.min_compaction_lag_ms,
        log_start=log_start,
        now=time.time_ns() // 1_000_000,
    )
    return {
        "clean_bytes": share.clean_bytes,
        "dirty_bytes": share.dirty_bytes,
        "dirty_ratio": round(share.ratio, 4),
        "lagging_bytes": share.lagging_bytes,
        "active_segment_bytes": share.active_bytes,
    }


def dirty_text(figures: dict[str, Any]) -> str:
    """``0.560 (1.2 MiB dirty of 2.1 MiB cleanable; active segment 64 KiB, not counted)``."""
    from .output import human_bytes

    cleanable = figures["clean_bytes"] + figures["dirty_bytes"]
    text = (
        f"{figures['dirty_ratio']:.3f} ({human_bytes(figures['dirty_bytes'])} dirty of "
        f"{human_bytes(cleanable)} cleanable"
    )
    if figures["lagging_bytes"]:
        text += f"; {human_bytes(figures['lagging_bytes'])} younger than min_compaction_lag_ms"
    return text + f"; active segment {human_bytes(figures['active_segment_bytes'])}, not counted)"
