"""The invariants of a log, checked in one place: ``compactlog verify`` and ``Log.check()``.

Every batch (CRC, layout, offset order), every index entry, the state files.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field
from typing import Any

from . import filenames
from .errors import CompactLogError
from .format import (
    SEGMENT_MAGIC,
    check_batch,
    check_file_header,
    decode_batch,
    find_next_valid_batch,
)
from .head import read_log_head
from .segment import (
    HEADER_SIZE,
    index_is_consistent,
    list_segments,
    read_index,
    segment_path,
    unsynced_from,
    unsynced_header,
)


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
    from .state_files import list_checkpoints, read_cleaner_state, read_meta

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
    from .state_files import read_checkpoint_file

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
