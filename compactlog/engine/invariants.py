"""The invariants of a log, checked in one place (sortedcontainers' ``_check``, LevelDB's
``VerifyChecksums``): :func:`verify_log` reports them (``compactlog verify``), :func:`check`
raises :class:`~compactlog.errors.LogCheckError` listing every one violated (``Log.check()``,
and the tests after every scenario).

What holds in a log:

1. Segments: each has the segment file header; bases ascend without overlap (a segment's
   base is at or after the previous one's next offset: compaction drops batches and
   recovery leaves lost offsets unused, so gaps are allowed, overlaps never); no index
   without its segment (a segment removed from the middle); each linked segment is
   followed by the segment it names, and the first is not past the log start offset
   (``storage/segment_chain.py``: none missing, none foreign).
2. Batches: whole and valid back to back from byte 16 (``deep``: CRC, decodable columns,
   record offsets in order), base offsets at or after the segment's base and strictly
   increasing. Only the newest segment may end in a torn tail (a write a crash cut), and
   past its sync point a power loss may leave anything (docs/format.md 10.1).
3. Index entries increase, stay inside the data and each points at a batch starting at
   its offset.
4. The head (``.lock``) lies within the newest segment, when it is a fact (the log was
   closed cleanly, or the caller is its writer): it names the newest segment, its size is
   within the file, and its end offset is the next offset after that segment's batches.
5. Subscriber checkpoints lie at most at the end, the cleaner point too. (A checkpoint below
   the log start is no violation: ``delete`` retention passes a subscriber by design, which
   resumes at the start and reports the skip; ``verify`` shows it, as repair moves it.)

The default (:func:`check`) reads batch headers only, which is cheap; ``deep=True`` (always
for ``verify``) also checks every CRC and decodes every batch.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field
from typing import Any

from ..encoding.batch_decode import decode_batch
from ..encoding.format import SEGMENT_MAGIC, check_file_header
from ..errors import CompactLogError, LogCheckError
from ..storage import filenames, segment_chain
from ..storage.durable import durable_size, missing_newest, unsynced_from
from ..storage.head import Head, closed_cleanly, read_log_head
from ..storage.segment import (
    HEADER_SIZE,
    Damage,
    first_wrong_entry,
    index_is_consistent,
    list_segments,
    read_index,
    segment_path,
    unsynced_header,
    walk,
)


class MappedFile:
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


def verify_log(
    directory: str,
    *,
    writers_active: bool = False,
    deep: bool = True,
    head_is_fact: bool = False,
    stuck_checkpoints: bool = True,
    replica: bool = False,
) -> VerifyReport:
    """Check every batch (CRC, layout, offset order), every index entry, the head, the state
    files: the invariants of the module docstring, each violation a :class:`Problem`.

    Safe beside live writers: with ``writers_active``, the newest segment is checked up to
    the size the writers' head vouches for, and bytes past it are a write in progress;
    without, they are a torn tail left by a writer that died mid-append. Without ``deep``,
    batch headers only (no CRC, no decoding). The head is checked when the log was closed
    cleanly or ``head_is_fact`` (the caller is the log's writer and holds its lock): else it
    is a hint that the next writer revalidates. ``stuck_checkpoints``: report checkpoints
    below the log start (``verify`` does, as repair moves them; they are no violation, as
    ``delete`` retention passes a subscriber by design, which then resumes at the start).
    ``replica``: the log is an archive replica (``archive follow``), which no writer opens,
    so nothing rebuilds its indexes: a missing index is no problem there (readers scan).
    """
    from ..storage.state_files import (
        list_checkpoints,
        read_cleaner_state,
        read_meta,
        readable_checkpoints,
    )

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
    orphans = {
        filenames.segment_name(k.base_offset or 0)
        for k in parsed.values()
        if k.kind is filenames.FileKind.INDEX and k.base_offset not in bases
    }
    for file, message in segment_chain.problems(directory, bases, meta.log_start_offset):
        if file not in orphans:  # (its orphan index said so already)
            report.problem("missing_segment", file, None, f"{message} (repair accepts the loss)")
    gone = missing_newest(directory, bases)
    if gone is not None:
        report.problem(
            "missing_segment",
            gone,
            None,
            "the newest segment is missing, and records in it had been made durable "
            "(synced or closed cleanly): those offsets are lost (repair accepts the loss)",
        )
    previous_next: int | None = None
    for i, base in enumerate(bases):
        last = i == len(bases) - 1
        limit = None
        if writers_active and last and head is not None and head.active_base == base:
            limit = head.active_size
        previous_next = _verify_segment(
            report,
            directory,
            base,
            last=last,
            limit=limit,
            previous_next=previous_next,
            deep=deep,
            index_optional=replica,
        )
    if head is not None and bases and (head_is_fact or closed_cleanly(directory, head)):
        _verify_head(report, directory, bases[-1], head, previous_next)
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
        checkpoints = readable_checkpoints(directory)
    for subscriber, offset in checkpoints.items():
        name = filenames.checkpoint_name(subscriber)
        if name not in parsed:
            report.problem(
                "checkpoint",
                name,
                None,
                f"subscriber {subscriber!r} is stored under another file name than its own",
            )
        if offset < start and stuck_checkpoints:
            report.problem(
                "checkpoint",
                name,
                None,
                f"subscriber {subscriber!r} is stuck at offset {offset}, below the log start "
                f"{start} (repair moves it to the log start)",
            )
        elif offset >= start and offset > end:
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


def _current_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except FileNotFoundError:
        return 0


def _verify_segment(
    report: VerifyReport,
    directory: str,
    base: int,
    *,
    last: bool,
    limit: int | None,
    previous_next: int | None,
    deep: bool = True,
    index_optional: bool = False,
) -> int | None:
    """One segment: file header, every batch, offset order, the index (when it has one, if
    ``index_optional``). Returns the offset after its last valid batch (or
    ``previous_next`` if it holds none)."""
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
        mapped = MappedFile(path)
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
        next_offset = previous_next
        walked = walk(data, HEADER_SIZE, end, tolerate_from=unsynced, crc=deep, newest=last)
        for pos, item in walked:
            if isinstance(item, Damage):
                if item.resume is None:
                    if item.torn_tail:
                        report.problem(
                            "torn_tail",
                            name,
                            pos,
                            f"torn tail of {end - pos} bytes ({item.reason}); the next writer "
                            "to open the log truncates it, repair quarantines it",
                        )
                    else:
                        where = (
                            "this segment, below its durable point,"
                            if last
                            else ("this closed segment")
                        )
                        report.problem(
                            "corrupt_batch",
                            name,
                            pos,
                            f"{item.reason}; the {end - pos} bytes to the end of {where} are "
                            "unreadable (damage, not a torn tail)",
                        )
                    report.unreadable_bytes += end - pos
                    break
                report.problem(
                    "corrupt_batch",
                    name,
                    pos,
                    f"{item.reason}; {item.resume - pos} unreadable bytes, valid data resumes "
                    f"at byte {item.resume}",
                )
                report.unreadable_bytes += item.resume - pos
                continue
            header = item
            if deep:
                layout = _layout_problem(data, pos, header, base, next_offset)
            else:
                layout = _offsets_problem(pos, header, base, next_offset)
            if layout is not None:
                report.problem(*layout)
                if layout[0] == "corrupt_batch":
                    continue
            report.batches += 1
            report.records += header.count
            positions[pos] = header.base_offset
            next_offset = header.next_offset
        durable = durable_size(directory, base) if last else 0
        # (the sync point is read after the mapping: a live writer may have appended and
        # synced in between, so the file as it is now, stat'ed after the sync point, decides)
        if size < durable and _current_size(path) < durable:
            report.problem(
                "missing_bytes",
                name,
                size,
                f"the segment ends at byte {size}, but {durable} bytes of it were made durable "
                "(synced or closed cleanly): bytes below the durable point are missing "
                "(damage, not a torn tail)",
            )
    _verify_index(report, directory, base, positions, end, growing=last, optional=index_optional)
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
    problem = _offsets_problem(pos, header, base, next_offset)
    if problem is not None:
        return problem
    if len(offsets) and (
        int(offsets[0]) < header.base_offset
        or int(offsets[-1]) > header.last_offset
        or (len(offsets) > 1 and not bool((offsets[1:] > offsets[:-1]).all()))
    ):
        return "offsets", name, pos, "record offsets inside the batch are out of order"
    return None


def _offsets_problem(
    pos: int, header: Any, base: int, next_offset: int | None
) -> tuple[str, str, int, str] | None:
    """A batch's base offset below its segment's base or not after the batch before it."""
    name = filenames.segment_name(base)
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
    return None


def _verify_head(
    report: VerifyReport, directory: str, newest: int, head: Head, data_next: int | None
) -> None:
    """Invariant 4: the head lies within the newest segment (``data_next``: the offset after
    its batches, ``None`` when the log holds none)."""
    name = filenames.WRITER_LOCK
    if head.active_base != newest:
        report.problem(
            "head",
            name,
            None,
            f"the head names segment {filenames.segment_name(head.active_base)}, but the "
            f"newest segment is {filenames.segment_name(newest)}",
        )
        return
    try:
        size = os.path.getsize(segment_path(directory, newest))
    except FileNotFoundError:
        return  # removed while verifying: reported with the segments
    if not HEADER_SIZE <= head.active_size <= size:
        report.problem(
            "head",
            name,
            None,
            f"the head says segment {filenames.segment_name(newest)} holds {head.active_size} "
            f"bytes, but its file has {size}",
        )
    expected = newest if data_next is None or data_next < newest else data_next
    if head.end_offset != expected and not (head.precommit_pending and head.end_offset > expected):
        report.problem(
            "head",
            name,
            None,
            f"the head's end offset is {head.end_offset}, but the data ends at offset {expected}",
        )


def _verify_index(
    report: VerifyReport,
    directory: str,
    base: int,
    positions: dict[int, int],
    end: int,
    *,
    growing: bool,
    optional: bool = False,
) -> None:
    """Check the index against the batch positions seen. The newest segment may have grown
    (and its index with it) since it was scanned: its entries past ``end`` are ignored.
    ``optional``: a missing index is no problem (a replica's)."""
    name = filenames.index_name(base)
    entries = read_index(directory, base)
    if entries is not None and growing:
        entries = entries[entries[:, 1] < end]
    if entries is None and optional and not os.path.exists(os.path.join(directory, name)):
        return
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
    wrong = first_wrong_entry(entries[entries[:, 1] < end], base, positions.get)
    if wrong is not None:
        number, found = wrong
        relative, position = entries[number].tolist()
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


def check(
    directory: str | os.PathLike[str],
    *,
    deep: bool = False,
    writers_active: bool = True,
    head_is_fact: bool = False,
) -> VerifyReport:
    """Assert the invariants of the log in ``directory`` (:func:`verify_log`): raises
    :class:`~compactlog.errors.LogCheckError` listing every violation, each naming its file
    and position; returns the report (counts, notes) when there is none. Cheap by default
    (batch headers only); ``deep=True`` checks every CRC and decodes every batch."""
    report = verify_log(
        os.path.abspath(os.fspath(directory)),
        writers_active=writers_active,
        deep=deep,
        head_is_fact=head_is_fact,
        stuck_checkpoints=False,
    )
    if report.problems:
        raise LogCheckError(report.path, [p.line() for p in report.problems], report.problems)
    return report
