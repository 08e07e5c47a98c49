"""The newest segment's tail: where its valid data ends, and its index, opened or rebuilt.

A writer asks this module once per catch-up (another process wrote, or died) and once at
open-time recovery (``recovery.py`` pass 5): :func:`open_newest_tail` re-reads the
directory, opens the newest segment, validates the bytes past what the head vouches for,
cuts a torn or unsynced tail off and opens (rebuilding if needed) the segment's index. It
answers with a :class:`Tail`; the writer installs it as its active segment. Nothing here
touches the writer.

The index is a cache (docs/format.md): :func:`rebuild_index` is the one place that writes
an index from a segment's batches (the newest segment's here, closed segments' in
recovery's pass 4 and ``repair``, a rolled-back clean's in ``swap.py``), and
:func:`batch_at` the one check of an index hint (a whole batch starts at the byte the entry
names), used here and, through :func:`scan_start`, by readers and subscribers.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, NamedTuple

from ..encoding.format import (
    BATCH_HEADER,
    INDEX_ENTRY,
    SEGMENT_FILE_HEADER,
    BatchHeader,
    check_batch,
    read_batch_header,
)
from ..errors import MissingSegmentError
from . import filenames
from .durable import check_durable_length, unsynced_from
from .fsio import FileSystem
from .head import Head
from .segment import (
    HEADER_SIZE,
    check_segment_header,
    first_wrong_entry,
    index_is_consistent,
    index_path,
    list_segments,
    lookup_position,
    read_all,
    read_index,
    scan_segment,
    segment_path,
    unsynced_header,
    write_index,
)
from .tailmap import only_zeros

logger = logging.getLogger("compactlog.tail")  # (its name before storage/)


class Tail(NamedTuple):
    """The newest segment as found: open descriptors of it and its index, and what was cut."""

    base: int
    fd: int
    size: int  # where its valid data ends (the file was truncated there)
    next_offset: int
    index_fd: int
    index_size: int
    first_ts: int | None  # the first batch's max timestamp (segment_ms counts from it)
    last_index_pos: int  # the position the last index entry names (HEADER_SIZE: none)
    cuts: list[tuple[str, int, int]]  # (file, byte, bytes) cut off, each logged
    rebuilt_index: bool  # an existing index disagreed with the segment (a new one is made)


def open_newest_tail(
    directory: str,
    fs: FileSystem,
    head: Head | None,
    *,
    log_start: int,
    index_interval: int,
    sync_new_file: Callable[[int], None],
    trust_head: bool = True,
    cut_from: int | None = None,
    empty_base: int = 0,
) -> Tail:
    """Re-read the directory, open the newest segment, validate its tail.

    Truncates a torn tail (each cut is logged and returned in :attr:`Tail.cuts`) and
    rebuilds the index when it disagrees with the segment. A segment created here (a log's
    first, or one a roll died before creating) is synced with ``sync_new_file`` (the
    writer's: a failure stops it) and its directory entry.

    ``head`` is what the head in ``.lock`` says (``None``: not readable); with
    ``trust_head`` validation starts past the bytes it vouches for. ``cut_from`` is for
    recovery after a crash that may have been a power loss: from that byte of the newest
    segment on, nothing is known to be on disk (the sync point, head.py), so the first
    invalid batch there ends the data even when valid bytes follow (unsynced writes reach
    the disk in any order), and a newest segment whose file header is missing or all zeros
    (0: its creation was never synced) is empty. ``empty_base`` is the first segment's base
    if there is none (and no head), at least ``log_start``.
    """
    cuts: list[tuple[str, int, int]] = []
    bases = list_segments(directory)
    if head is not None and head.active_base not in bases:
        if head.active_size > HEADER_SIZE:
            raise MissingSegmentError(
                f"the active segment {filenames.segment_name(head.active_base)} is missing "
                f"(it held offsets up to {head.end_offset - 1}); run repair",
                path=directory,
                position=0,
            )
        if not bases or head.active_base > bases[-1]:
            bases.append(head.active_base)  # a roll died before creating the file
    created = not bases
    if not bases:
        bases = [max(log_start, head.end_offset if head else empty_base)]
    base = bases[-1]
    path = segment_path(directory, base)
    created = created or not os.path.exists(path)
    fd = fs.open(path, os.O_RDWR | os.O_CREAT)
    try:
        unsynced = unsynced_from(directory, base) if cut_from is None else cut_from
        size = _check_newest_header(fs, fd, path, unsynced, cuts)
        if created:  # a log's first segment, or one a roll died before creating
            sync_new_file(fd)
            fs.fsync_dir(directory)
    except BaseException:
        os.close(fd)
        raise
    entries = read_index(directory, base)
    # where can validation start? after what the head vouches for, or the last index
    # entry if the batch there is whole and holds the offset the entry names (an index
    # is never fsynced: after a power loss it may be older or newer than the segment)
    start, next_offset = HEADER_SIZE, None
    if (
        trust_head
        and head is not None
        and head.active_base == base
        and HEADER_SIZE <= head.active_size <= size
    ):
        start, next_offset = head.active_size, head.end_offset
    elif entries is not None and len(entries) and index_is_consistent(entries, size):
        start = _checked_index_start(fd, base, entries)
    if cut_from is not None:
        start = min(start, max(cut_from, HEADER_SIZE))
        next_offset = None
    data = read_all(fd, start, size - start)
    tolerate = None if cut_from is None else max(cut_from - start, 0)
    result = scan_segment(path, data, 0, origin=start, tolerate_from=tolerate)
    if next_offset is None and result.next_offset is None and start > HEADER_SIZE:
        # the index pointed at nothing valid: validate the whole segment instead
        start = HEADER_SIZE
        data = read_all(fd, start, size - start)
        tolerate = None if cut_from is None else max(cut_from - start, 0)
        result = scan_segment(path, data, 0, origin=start, tolerate_from=tolerate)
    if cut_from is not None:  # (recovery: bytes below the durable point are never cut)
        check_durable_length(path, size, cut_from)
    valid_end = start + result.valid_end
    if result.torn_bytes:
        fs.truncate(fd, valid_end)
        if not only_zeros(data[result.valid_end :]):  # (zeros: room an exclusive
            _report_cut(cuts, path, valid_end, result.torn_bytes)  # writer reserved)
    if result.next_offset is not None:
        next_offset = result.next_offset
    if next_offset is None:
        next_offset = base if start == HEADER_SIZE else _next_offset_from_scan(fd, path, base)
    rebuilt = (
        entries is None
        or not index_is_consistent(entries, valid_end)
        # after a crash the index may be older or newer than the segment (it is never
        # fsynced): an entry can name a batch that a power loss took back and a later
        # writer replaced, so each entry is checked against the batch it points at
        or (cut_from is not None and _has_wrong_entry(fd, base, entries, valid_end))
    )
    if rebuilt:
        rebuild_index(fs, directory, base, index_interval, valid_end)
    index_fd, index_size = _open_index(fs, directory, base)
    first_ts = None
    if valid_end > HEADER_SIZE:
        # the segment's age (segment_ms) counts from its first batch, already validated;
        # only its header is read, so the bound passed is the valid end, not 48 bytes
        first = read_all(fd, HEADER_SIZE, BATCH_HEADER.size)
        header, _ = read_batch_header(first, 0, valid_end - HEADER_SIZE)
        first_ts = header.max_ts if header is not None else None
    last_index_pos = HEADER_SIZE
    last = read_index(directory, base)
    if last is not None and len(last):
        last_index_pos = int(last[-1, 1])
    return Tail(
        base,
        fd,
        valid_end,
        max(next_offset, base),
        index_fd,
        index_size,
        first_ts,
        last_index_pos,
        cuts,
        rebuilt and not created,  # (a new segment's index is made, not rebuilt)
    )


def _check_newest_header(
    fs: FileSystem, fd: int, path: str, unsynced: int | None, cuts: list[tuple[str, int, int]]
) -> int:
    """The newest segment's size once its file header is whole: a header cut short by a
    death during its creation (or, with ``unsynced`` 0, anything but a whole header: nothing
    of the file is known to be on disk, a roll that a power loss cut short) is written anew,
    and the file is then empty. Any other damage is refused with the readers' error: below
    the durable point (``unsynced`` past the header: the sync point, or a clean close) a
    header that is not a segment's is damage, never an unfinished roll."""
    size = os.fstat(fd).st_size
    header = read_all(fd, 0, min(size, HEADER_SIZE))
    if header == SEGMENT_FILE_HEADER or not unsynced_header(header, unsynced):
        check_segment_header(path, header)
        return size
    if size > HEADER_SIZE and not only_zeros(read_all(fd, HEADER_SIZE, size - HEADER_SIZE)):
        _report_cut(cuts, path, 0, size)
    fs.pwrite(fd, SEGMENT_FILE_HEADER, 0)
    fs.truncate(fd, HEADER_SIZE)
    return HEADER_SIZE


def batch_at(fd: int, position: int) -> BatchHeader | None:
    """The header of the whole, valid batch starting at byte ``position`` of ``fd``, or
    ``None``: how an index hint is checked before a scan starts there (an index is a cache,
    and may belong to an older or newer version of the file)."""
    first = read_all(fd, position, BATCH_HEADER.size)
    if len(first) < BATCH_HEADER.size:
        return None
    header, _ = read_batch_header(first, 0, 1 << 62)  # (the length: checked with the CRC)
    if header is not None:
        data = read_all(fd, position, header.length)
        header, _ = check_batch(data, 0, len(data))
    return header


def scan_start(fd: int, directory: str, base: int, offset: int) -> int:
    """Where a scan of segment ``base`` (open as ``fd``) for ``offset`` starts: its index
    entry at or before ``offset`` if a whole, valid batch starting at or before ``offset`` is
    there, else the segment's start. An index is a cache that may belong to an older or
    newer version of the file (a cleaner swap, a power loss), and offsets only grow along a
    file, so such a batch is a safe place to start (readers, subscribers)."""
    hint = lookup_position(read_index(directory, base), base, offset)
    if hint == HEADER_SIZE:
        return hint
    header = batch_at(fd, hint)
    if header is None or header.base_offset > offset:
        return HEADER_SIZE
    return hint


def _has_wrong_entry(fd: int, base: int, entries: Any, valid_end: int) -> bool:
    """Whether an index entry does not point at a batch header holding its offset within
    the valid data. Headers only (one 48-byte read per entry): the data was validated by the
    scan, or lies before the sync point; a reader checks the CRC of what it reads anyway."""

    def base_at(position: int) -> int | None:
        first = read_all(fd, position, BATCH_HEADER.size)
        if len(first) < BATCH_HEADER.size:
            return None
        header, _ = read_batch_header(first, 0, valid_end - position)  # (48 bytes unpacked)
        return None if header is None else header.base_offset

    return first_wrong_entry(entries, base, base_at) is not None


def _checked_index_start(fd: int, base: int, entries: Any) -> int:
    """The last index entry's position if a whole batch holding the entry's offset
    starts there, else the segment's start."""
    relative, position = int(entries[-1, 0]), int(entries[-1, 1])
    header = batch_at(fd, position)
    if header is None or header.base_offset != base + relative:
        return HEADER_SIZE
    return position


def _report_cut(cuts: list[tuple[str, int, int]], path: str, position: int, length: int) -> None:
    """Log and remember a tail cut off the newest segment (see ``recovery``)."""
    cuts.append((path, position, length))
    logger.warning(
        "%s: cut %d bytes at byte %d (a torn or unsynced tail left by a crash)",
        path,
        length,
        position,
    )


def _next_offset_from_scan(fd: int, path: str, base: int) -> int:
    size = os.fstat(fd).st_size
    result = scan_segment(
        path, read_all(fd, HEADER_SIZE, size - HEADER_SIZE), 0, origin=HEADER_SIZE
    )
    return base if result.next_offset is None else result.next_offset


def _open_index(fs: FileSystem, directory: str, base: int) -> tuple[int, int]:
    """Open the newest segment's index, cutting a torn last entry off."""
    index_fd = fs.open(index_path(directory, base), os.O_RDWR | os.O_CREAT)
    size = os.fstat(index_fd).st_size
    usable = HEADER_SIZE + (size - HEADER_SIZE) // INDEX_ENTRY.size * INDEX_ENTRY.size
    if usable != size:
        fs.truncate(index_fd, usable)
    return index_fd, usable


def rebuild_index(
    fs: FileSystem, directory: str, base: int, interval: int, valid_end: int | None = None
) -> None:
    """Write segment ``base``'s index anew from its batches (up to byte ``valid_end``, or
    all of them): an entry every ``interval`` bytes of batches."""
    path = segment_path(directory, base)
    with open(path, "rb") as handle:
        data = handle.read() if valid_end is None else handle.read(valid_end)
    result = scan_segment(path, data, HEADER_SIZE, index_interval=interval)
    write_index(fs, directory, base, result.index_entries)
