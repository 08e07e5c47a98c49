"""Whole-log inspections built on the library's own scanning (never a second parser).

Batches are validated with ``compactlog.format.check_batch`` / ``decode_batch``, resynced
with ``find_next_valid_batch``, read with ``compactlog.segment.SegmentReader``; file names
are classified by ``compactlog.filenames.parse_filename``; state files are read through
``compactlog.state_files``. This module only walks and reports.
"""

from __future__ import annotations

import bisect
import mmap
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from compactlog import filenames
from compactlog.batch_decode import RecordBatch, decode_batch
from compactlog.errors import CompactLogError, CorruptLogError
from compactlog.format import SEGMENT_MAGIC, check_batch, check_file_header, find_next_valid_batch
from compactlog.head import read_log_head
from compactlog.reader import trim_batch
from compactlog.segment import (
    HEADER_SIZE,
    SegmentReader,
    bound_by_head,
    index_is_consistent,
    index_path,
    list_segments,
    lookup_position,
    read_index,
    segment_path,
    unsynced_from,
    unsynced_header,
)


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


class _Mapped:
    """A read-only mapping of a whole file (``b""`` when empty), closed on exit."""

    def __init__(self, path: str) -> None:
        self.handle = open(path, "rb")  # noqa: SIM115 - closed in __exit__
        size = os.fstat(self.handle.fileno()).st_size
        self.map: Any = mmap.mmap(self.handle.fileno(), 0, access=mmap.ACCESS_READ) if size else b""

    def __enter__(self) -> Any:
        return self.map

    def __exit__(self, *exc: object) -> None:
        if isinstance(self.map, mmap.mmap):
            self.map.close()
        self.handle.close()


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

    Like ``compactlog.reader.iter_batches`` but a corrupt batch is reported to
    ``on_problem`` and reading resumes at the next valid batch (found with the library's
    ``find_next_valid_batch``) instead of stopping. A torn tail of the newest segment is
    not a problem: it is a write in progress.
    """
    bases = list_segments(directory)
    first = max(bisect.bisect_right(bases, start) - 1, 0)
    next_offset = start
    for i in range(first, len(bases)):
        base = bases[i]
        if end is not None and base >= end:
            return
        last = i == len(bases) - 1
        path = segment_path(directory, base)
        entries = read_index(directory, base)
        position = HEADER_SIZE
        if index_is_consistent(entries, _file_size(path)):
            position = lookup_position(entries, base, next_offset)
        try:
            reader = SegmentReader(directory, base, last_segment=last)
        except CompactLogError as error:
            on_problem(error if isinstance(error, CorruptLogError) else _as_corrupt(error, path))
            continue
        with reader:
            while True:
                try:
                    for batch in reader.batches(position):
                        position = batch.position + batch.size_bytes
                        if batch.next_offset <= next_offset:
                            continue
                        if end is not None and batch.base_offset >= end:
                            return
                        trimmed = trim_batch(batch, next_offset, end)
                        next_offset = batch.next_offset
                        if len(trimmed):
                            yield trimmed
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
    with _Mapped(path) as data:
        if not data:
            return None
        return find_next_valid_batch(data, position, len(data))


def offset_for_timestamp(directory: str, start: int, timestamp_ms: int) -> int | None:
    """The first offset whose record timestamp is >= ``timestamp_ms`` (Kafka's
    offsetsForTimes); ``None`` when every record is older."""
    from compactlog.reader import iter_batches

    for batch in iter_batches(directory, start, None):
        if batch.header.max_ts < timestamp_ms:
            continue
        hits = (batch.timestamps >= timestamp_ms).nonzero()[0]
        if len(hits):
            return int(batch.offsets[int(hits[0])])
    return None


# -- verify --------------------------------------------------------------------------------


@dataclass
class Problem:
    kind: str  # corrupt_batch, torn_tail, bad_header, offsets, index, checkpoint, meta, ...
    file: str  # file name inside the log directory ("" for the log as a whole)
    position: int | None
    message: str

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "file": self.file,
            "position": self.position,
            "message": self.message,
        }

    def line(self) -> str:
        where = self.file or "log"
        if self.position is not None:
            where += f" at byte {self.position}"
        return f"{where}: {self.message}"


@dataclass
class VerifyReport:
    path: str
    segments: int = 0
    batches: int = 0
    records: int = 0
    bytes: int = 0
    unreadable_bytes: int = 0
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def problem(self, kind: str, file: str, position: int | None, message: str) -> None:
        self.problems.append(Problem(kind, file, position, message))

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "ok": self.ok,
            "segments": self.segments,
            "batches": self.batches,
            "records": self.records,
            "bytes": self.bytes,
            "unreadable_bytes": self.unreadable_bytes,
            "problems": [p.to_json() for p in self.problems],
            "notes": self.notes,
        }


def verify_log(directory: str, *, writers_active: bool = False) -> VerifyReport:
    """Check every batch (CRC, layout, offset order), every index entry, the state files.

    Safe beside live writers: with ``writers_active``, the newest segment is checked up to
    the size the writers' head vouches for, and bytes past it are a write in progress;
    without, they are a torn tail left by a writer that died mid-append.
    """
    from compactlog.state_files import list_checkpoints, read_cleaner_state, read_meta

    report = VerifyReport(directory)
    try:
        meta = read_meta(directory)
    except (CompactLogError, OSError) as error:
        report.problem("meta", filenames.META, None, str(error))
        return report
    head = read_log_head(directory)
    names = sorted(os.listdir(directory))
    parsed = {n: filenames.parse_filename(n) for n in names}
    bases = list_segments(directory)
    report.segments = len(bases)
    for name, kind in parsed.items():
        if kind.kind is filenames.FileKind.INDEX and kind.base_offset not in bases:
            report.problem(
                "missing_segment",
                name,
                None,
                f"index without its segment {filenames.segment_name(kind.base_offset or 0)}: "
                "those offsets are lost (repair removes the orphan index)",
            )
        elif kind.kind in (filenames.FileKind.REWRITE, filenames.FileKind.TEMP):
            report.notes.append(f"{name}: unfinished rewrite or temporary file (removed on open)")
        elif kind.kind is filenames.FileKind.QUARANTINE:
            report.notes.append(f"{name}: quarantined unreadable bytes from an earlier repair")
    if bases and meta.log_start_offset < bases[0] and bases[0] > 0:
        report.problem(
            "missing_segment",
            filenames.segment_name(bases[0]),
            None,
            f"the log starts at offset {meta.log_start_offset} but the first segment starts at "
            f"{bases[0]}: a segment is missing (repair accepts the loss)",
        )
    previous_next: int | None = None
    for i, base in enumerate(bases):
        last = i == len(bases) - 1
        limit = None
        if writers_active and last and head is not None and head.active_base == base:
            limit = head.active_size
        previous_next = _verify_segment(
            report, directory, base, last=last, limit=limit, previous_next=previous_next
        )
    if meta.uncleanable:
        report.problem(
            "uncleanable", filenames.META, None, f"marked uncleanable: {meta.uncleanable}"
        )
    start = max(meta.log_start_offset, bases[0]) if bases else meta.log_start_offset
    end = head.end_offset if head is not None else (previous_next or start)
    try:
        checkpoints = list_checkpoints(directory)
    except CompactLogError as error:
        report.problem(
            "checkpoint", os.path.basename(getattr(error, "path", "") or ""), 0, str(error)
        )
        checkpoints = _readable_checkpoints(directory, parsed)
    for subscriber, offset in checkpoints.items():
        name = filenames.checkpoint_name(subscriber)
        if name not in parsed:
            report.problem(
                "checkpoint",
                name,
                None,
                f"subscriber {subscriber!r} is stored under another file name than its own",
            )
        if offset < start:
            report.problem(
                "checkpoint",
                name,
                None,
                f"subscriber {subscriber!r} is stuck at offset {offset}, below the log start "
                f"{start} (repair moves it to the log start)",
            )
        elif offset > end:
            report.problem(
                "checkpoint",
                name,
                None,
                f"subscriber {subscriber!r} is at offset {offset}, beyond the log end {end}",
            )
    try:
        cleaner = read_cleaner_state(directory)
    except (CompactLogError, OSError, ValueError, TypeError) as error:
        report.problem("cleaner_checkpoint", filenames.CLEANER_CHECKPOINT, None, str(error))
    else:
        if cleaner.first_dirty_offset > end:
            report.problem(
                "cleaner_checkpoint",
                filenames.CLEANER_CHECKPOINT,
                None,
                f"cleaner point {cleaner.first_dirty_offset} is beyond the log end {end}",
            )
    return report


def _readable_checkpoints(directory: str, parsed: dict[str, Any]) -> dict[str, int]:
    from compactlog.state_files import read_checkpoint_file

    result = {}
    for name, kind in parsed.items():
        if kind.kind is filenames.FileKind.CHECKPOINT:
            try:
                subscriber, offset = read_checkpoint_file(directory, name)
            except CompactLogError:
                continue
            result[subscriber] = offset
    return result


def _verify_segment(
    report: VerifyReport,
    directory: str,
    base: int,
    *,
    last: bool,
    limit: int | None,
    previous_next: int | None,
) -> int | None:
    """One segment: file header, every batch, offset order, the index. Returns the offset
    after its last valid batch (or ``previous_next`` if it holds none)."""
    name = filenames.segment_name(base)
    path = segment_path(directory, base)
    if previous_next is not None and base < previous_next:
        report.problem(
            "offsets",
            name,
            None,
            f"segment base {base} overlaps the previous segment (which ends at offset "
            f"{previous_next - 1})",
        )
    try:
        mapped = _Mapped(path)
    except FileNotFoundError:
        report.notes.append(f"{name}: removed while verifying (retention or cleaning)")
        return previous_next
    positions: dict[int, int] = {}  # batch position -> base offset
    with mapped as data:
        size = len(data)
        end = size if limit is None else min(limit, size)
        report.bytes += size
        # past the sync point of the newest segment a power loss may leave anything: the
        # next writer cuts it (docs/format.md 10.1), so it is a torn tail, not corruption
        unsynced = unsynced_from(directory, base) if last else size + 1
        problem = check_file_header(bytes(data[:HEADER_SIZE]), SEGMENT_MAGIC)
        if problem and last and unsynced_header(bytes(data[:HEADER_SIZE]), unsynced):
            report.problem(
                "torn_tail",
                name,
                0,
                f"{problem}: a newest segment never synced; the next writer to open the log "
                "empties it",
            )
            return previous_next
        if problem:
            report.problem("bad_header", name, 0, problem)
            return previous_next
        pos = HEADER_SIZE
        next_offset = previous_next
        while pos < end:
            header, reason = check_batch(data, pos, end)
            if header is None:
                following = None if pos >= unsynced else find_next_valid_batch(data, pos, end)
                if following is None:
                    if last:
                        report.problem(
                            "torn_tail",
                            name,
                            pos,
                            f"torn tail of {end - pos} bytes ({reason}); the next writer to "
                            "open the log truncates it, repair quarantines it",
                        )
                    else:
                        report.problem(
                            "corrupt_batch",
                            name,
                            pos,
                            f"{reason}; the {end - pos} bytes to the end of this closed segment "
                            "are unreadable",
                        )
                    report.unreadable_bytes += end - pos
                    break
                report.problem(
                    "corrupt_batch",
                    name,
                    pos,
                    f"{reason}; {following - pos} unreadable bytes, valid data resumes at byte "
                    f"{following}",
                )
                report.unreadable_bytes += following - pos
                pos = following
                continue
            layout = _layout_problem(data, pos, header, base, next_offset)
            if layout is not None:
                report.problem(*layout)
                if layout[0] == "corrupt_batch":
                    pos += header.length
                    continue
            report.batches += 1
            report.records += header.count
            positions[pos] = header.base_offset
            next_offset = header.next_offset
            pos += header.length
    _verify_index(report, directory, base, positions, end, growing=last)
    return next_offset


def _layout_problem(
    data: Any, pos: int, header: Any, base: int, next_offset: int | None
) -> tuple[str, str, int, str] | None:
    """Decode one CRC-valid batch and check its offsets. (A function of its own so the
    decoded columns, views of the mapped file, are released before the file is unmapped.)"""
    name = filenames.segment_name(base)
    try:
        batch = decode_batch(data, pos, header)
    except Exception as error:  # a body that passed its CRC yet does not decode
        return "corrupt_batch", name, pos, f"undecodable batch: {error}"
    offsets = batch.offsets
    if header.base_offset < base:
        return (
            "offsets",
            name,
            pos,
            f"batch base offset {header.base_offset} is below the segment base {base}",
        )
    if next_offset is not None and header.base_offset < next_offset:
        return (
            "offsets",
            name,
            pos,
            f"batch base offset {header.base_offset} is not after offset {next_offset - 1}",
        )
    if len(offsets) and (
        int(offsets[0]) < header.base_offset
        or int(offsets[-1]) > header.last_offset
        or (len(offsets) > 1 and not bool((offsets[1:] > offsets[:-1]).all()))
    ):
        return "offsets", name, pos, "record offsets inside the batch are out of order"
    return None


def _verify_index(
    report: VerifyReport,
    directory: str,
    base: int,
    positions: dict[int, int],
    end: int,
    *,
    growing: bool,
) -> None:
    """Check the index against the batch positions seen. The newest segment may have grown
    (and its index with it) since it was scanned: its entries past ``end`` are ignored."""
    name = filenames.index_name(base)
    entries = read_index(directory, base)
    if entries is not None and growing:
        entries = entries[entries[:, 1] < end]
    if entries is None:
        report.problem(
            "index", name, None, "missing or not an index file (rebuilt on open and by repair)"
        )
        return
    if not len(entries):
        return
    if not index_is_consistent(entries, max(end, HEADER_SIZE + 1)):
        report.problem(
            "index",
            name,
            None,
            "entries do not increase or point past the data (rebuilt on open and by repair)",
        )
        return
    for number, (relative, position) in enumerate(entries.tolist()):
        if position >= end:
            continue  # an entry for a write in progress
        found = positions.get(position)
        if found != base + relative:
            what = (
                "no batch starts there"
                if found is None
                else f"the batch there starts at offset {found}"
            )
            report.problem(
                "index",
                name,
                16 + 8 * number,
                f"entry {number} maps offset {base + relative} to byte {position}, but {what} "
                "(repair rebuilds the index)",
            )
            return


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
