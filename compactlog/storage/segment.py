"""Segments and their sparse indexes: the ``.log``/``.idx`` layout and the helpers to use it.

A segment is ``<base>.log``: a 16-byte file header, then whole batches. Its ``<base>.idx``
maps some offsets (one every ``index_interval_bytes``) to byte positions so that a read from
offset *n* seeks instead of scanning. The index is a cache: it is checked cheaply when a
writer opens the segment and rebuilt from the segment whenever it disagrees.

Tail tolerance (LevelDB's reader, Kafka's ``LogSegment.recover``): an invalid batch with no
valid batch after it is a torn tail, truncated by writers (the bytes dropped are reported)
and treated as "not yet written" by readers. An invalid batch followed by valid data is
corruption: :class:`CorruptLogError` naming file and position, never a silent skip; except
in the newest segment past its sync point (``head.py``), where a power loss may have kept
later unsynced writes and lost earlier ones: there it ends the data like a torn tail
(``durable.py``). :func:`judge_damage` is that rule, and the only place it is
written: every reader, scan and check of segment bytes asks it.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..encoding.batch_decode import RecordBatch, concat_batches, decode_batch
from ..encoding.format import (
    FILE_HEADER,
    INDEX_ENTRY,
    INDEX_FILE_HEADER,
    INDEX_MAGIC,
    SEGMENT_FILE_HEADER,
    SEGMENT_MAGIC,
    BatchHeader,
    check_batch,
    check_file_header,
    find_next_valid_batch,
    read_batch_header,
)
from ..encoding.small_runs import SmallRun, decode_small_run, scan_small_run
from ..errors import CorruptLogError, MissingSegmentError, NotALogError
from . import filenames
from .durable import check_durable_length, durable_size, unsynced_from
from .fsio import FileSystem
from .head import Head, read_log_head

HEADER_SIZE = FILE_HEADER.size
READ_CHUNK = 4 << 20
RELEASE_BYTES = 8 << 20
RUN_BYTES = 1 << 20  # a run of small batches read as one RecordBatch spans at most this
RUN_RECORDS = 1 << 16  # ... and about this many records


def list_segments(directory: str) -> list[int]:
    """Base offsets of every segment in ``directory``, ascending."""
    bases = []
    for name in os.listdir(directory):
        parsed = filenames.parse_filename(name)
        if parsed.kind is filenames.FileKind.SEGMENT and parsed.base_offset is not None:
            bases.append(parsed.base_offset)
    bases.sort()
    return bases


def segment_path(directory: str, base: int) -> str:
    return os.path.join(directory, filenames.segment_name(base))


def index_path(directory: str, base: int) -> str:
    return os.path.join(directory, filenames.index_name(base))


def read_all(fd: int, start: int, length: int) -> bytes:
    """``pread`` exactly what is there between ``start`` and ``start + length``."""
    parts = []
    while length > 0:
        chunk = os.pread(fd, length, start)
        if not chunk:
            break
        parts.append(chunk)
        start += len(chunk)
        length -= len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def check_segment_header(path: str, data: bytes) -> None:
    problem = check_file_header(data, SEGMENT_MAGIC)
    if problem:
        raise NotALogError(problem, path=path)


# -- walking the batches -----------------------------------------------------------------


def walk_step(
    buf: Any, pos: int, end: int, runs: tuple[int, int] | None = None, *, crc: bool = True
) -> tuple[BatchHeader | SmallRun | None, str]:
    """What lies at ``pos``: with ``runs`` (record and byte limits), a run of small batches
    (``small_runs.scan_small_run``); else one batch (``check_batch``, or ``read_batch_header``
    alone without ``crc``); ``(None, reason)`` when no valid batch starts there."""
    if runs is not None:
        run = scan_small_run(buf, pos, end, *runs)
        if run is not None:
            return run, ""
    return check_batch(buf, pos, end) if crc else read_batch_header(buf, pos, end)


class BatchWalk:
    """Iterates ``(position, header)`` over the valid batches of ``buf[start:end]``, stopping
    at the first invalid one; then ``pos`` is where it stopped and ``reason`` why ("" when it
    reached ``end``). Every loop over a segment's batches is one of these (:func:`walk`,
    :func:`scan_segment`, :class:`SegmentReader` and through it the subscribers, repair,
    verify). With ``runs``, a run of small batches comes as one item whose header is the
    :class:`SmallRun`; without ``crc``, headers are checked but bodies are not."""

    __slots__ = ("buf", "crc", "end", "pos", "reason", "runs")

    def __init__(
        self,
        buf: Any,
        start: int,
        end: int,
        *,
        runs: tuple[int, int] | None = None,
        crc: bool = True,
    ) -> None:
        self.buf = buf
        self.pos = start
        self.end = end
        self.runs = runs
        self.crc = crc
        self.reason = ""

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        buf, pos, end, runs, crc = self.buf, self.pos, self.end, self.runs, self.crc
        if runs is not None:
            while pos < end:
                item, reason = walk_step(buf, pos, end, runs, crc=crc)
                if item is None:
                    self.pos, self.reason = pos, reason
                    return
                yield pos, item
                pos = item.end if isinstance(item, SmallRun) else pos + item.length
        else:  # batch by batch (walk_step without runs, its call saved: the hottest loop)
            check = check_batch if crc else read_batch_header
            while pos < end:
                header, reason = check(buf, pos, end)
                if header is None:
                    self.pos, self.reason = pos, reason
                    return
                yield pos, header
                pos += header.length
        self.pos = pos


@dataclass(frozen=True, slots=True)
class Damage:
    """Invalid bytes, as :func:`judge_damage` sees them: from ``position`` to ``resume``,
    the next valid batch, or to the end when ``resume`` is ``None``; ``torn_tail`` says
    whether they are the end of the data (else corruption)."""

    position: int
    resume: int | None
    reason: str
    torn_tail: bool


def judge_damage(
    buf: Any, pos: int, end: int, reason: str, *, newest: bool, unsynced: int | None
) -> Damage:
    """The one rule of tail tolerance (the module docstring), for invalid bytes at ``pos``
    of ``buf[:end]`` in a segment: they are a **torn tail** (the end of the data, no error)
    only in the ``newest`` segment, and there only at or past its durable point
    ``unsynced`` (``durable.unsynced_from``: a power loss may have kept later unsynced writes
    and lost earlier ones, so what follows counts for nothing), or, where no durable point
    can exist (``None``: no writer ever opened the directory), when no valid batch follows.
    Below the durable point they are damage, whatever follows. Anything else is corruption.
    Every reader of segment bytes asks here: the :class:`SegmentReader` (``read``,
    ``read_batches``, subscribers, tables), the validating scans (:func:`walk`,
    :func:`scan_segment`, hence the writers' tail recovery in ``tail.py``) and ``verify``
    (``invariants.py``)."""
    past_sync_point = unsynced is not None and pos >= unsynced
    resume = None if past_sync_point else find_next_valid_batch(buf, pos, end)
    torn = past_sync_point or (unsynced is None and resume is None)
    return Damage(pos, resume, reason, newest and torn)


def damage_detail(damage: Damage, *, newest: bool, origin: int = 0) -> str:
    """What follows a damaged region, for the message of its :class:`CorruptLogError`
    (``origin``: the file position of the buffer judged)."""
    if damage.resume is not None:
        return f"; valid data follows at byte {origin + damage.resume}"
    if newest:
        return " below the durable point (damage, not a torn tail)"
    return " in a closed segment"


def walk(
    buf: Any,
    start: int,
    end: int,
    *,
    tolerate_from: int | None = None,
    crc: bool = True,
    newest: bool = True,
) -> Iterator[tuple[int, BatchHeader | Damage]]:
    """Every batch of ``buf[start:end]`` and every damaged region between them, in order,
    each region judged by :func:`judge_damage` (``tolerate_from``: the sync point of the
    newest segment); after a :class:`Damage` the walk resumes at the next valid batch, if
    any."""
    pos = start
    while pos < end:
        batches = BatchWalk(buf, pos, end, crc=crc)
        yield from batches
        pos = batches.pos
        if pos >= end:
            return
        damage = judge_damage(buf, pos, end, batches.reason, newest=newest, unsynced=tolerate_from)
        yield pos, damage
        if damage.resume is None:
            return
        pos = damage.resume


# -- scanning ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScanResult:
    """What a validating scan of a segment region found."""

    valid_end: int  # byte position just after the last valid batch
    next_offset: int | None  # offset after the last valid batch (None: no batch seen)
    torn_bytes: int  # bytes after valid_end that form a torn tail
    first_timestamp: int | None  # max_ts of the first batch scanned (for segment_ms)
    index_entries: list[tuple[int, int]]  # (offset, position) every index_interval bytes


def scan_segment(
    path: str,
    data: bytes | memoryview,
    start: int,
    *,
    index_interval: int | None = None,
    last_indexed: int = -1,
    origin: int = 0,
    tolerate_from: int | None = None,
) -> ScanResult:
    """Validate every batch from ``start`` to the end of ``data``.

    ``data`` is the file's bytes from byte ``origin`` on (the whole file by default).
    Positions in the result are positions in ``data``; positions in errors are positions in
    the file. Raises :class:`CorruptLogError` when an invalid batch is followed by valid data,
    unless it lies at or past ``tolerate_from`` (a position in ``data``: past the sync point,
    where a power loss may have kept later writes and lost earlier ones), where it ends the
    valid data like a torn tail.
    """
    end = len(data)
    valid_end = start
    next_offset: int | None = None
    first_ts: int | None = None
    entries: list[tuple[int, int]] = []
    last_entry_pos = last_indexed
    tolerate = end + 1 if tolerate_from is None else tolerate_from
    for pos, header in walk(data, start, end, tolerate_from=tolerate_from):
        if isinstance(header, Damage):
            if not header.torn_tail:
                raise CorruptLogError(
                    header.reason + damage_detail(header, newest=True, origin=origin),
                    path=path,
                    position=origin + pos,
                )
            return ScanResult(pos, next_offset, end - pos, first_ts, entries)
        if next_offset is not None and header.base_offset < next_offset:
            if pos >= tolerate:
                return ScanResult(pos, next_offset, end - pos, first_ts, entries)
            raise CorruptLogError(
                f"batch offset {header.base_offset} is not after {next_offset - 1}",
                path=path,
                position=origin + pos,
            )
        if first_ts is None:
            first_ts = header.max_ts
        if index_interval is not None and (
            last_entry_pos < 0 or pos - last_entry_pos >= index_interval
        ):
            entries.append((header.base_offset, pos))
            last_entry_pos = pos
        next_offset = header.next_offset
        valid_end = pos + header.length
    return ScanResult(valid_end, next_offset, 0, first_ts, entries)


# -- the sparse index --------------------------------------------------------------------


def read_index(directory: str, base: int) -> np.ndarray | None:
    """The index entries as an (n, 2) uint32 array of (relative offset, position), or
    ``None`` if the file is missing or not an index. Torn trailing bytes are ignored."""
    path = index_path(directory, base)
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return None
    if check_file_header(data, INDEX_MAGIC):
        return None
    usable = (len(data) - HEADER_SIZE) // INDEX_ENTRY.size * INDEX_ENTRY.size
    entries = np.frombuffer(data, dtype=np.uint32, count=usable // 4, offset=HEADER_SIZE)
    return _increasing_prefix(entries.reshape(-1, 2))


def _increasing_prefix(entries: np.ndarray) -> np.ndarray:
    """The entries up to the first that does not move forward in offset and position (an
    index is never fsynced: after a power loss its tail may be zeros or older entries)."""
    if not len(entries) or int(entries[0, 1]) < HEADER_SIZE:
        return entries[:0]
    rel = entries[:, 0].astype(np.int64)
    pos = entries[:, 1].astype(np.int64)
    bad = np.flatnonzero((np.diff(rel) <= 0) | (np.diff(pos) <= 0))
    return entries if not len(bad) else entries[: int(bad[0]) + 1]


def lookup_position(entries: np.ndarray | None, base: int, offset: int) -> int:
    """Byte position of the last indexed batch starting at or before ``offset``."""
    if entries is None or len(entries) == 0 or offset <= base:
        return HEADER_SIZE
    relative = offset - base
    i = int(np.searchsorted(entries[:, 0], relative, side="right")) - 1
    return int(entries[i, 1]) if i >= 0 else HEADER_SIZE


def index_is_consistent(entries: np.ndarray | None, data_end: int) -> bool:
    """Cheap check: offsets and positions increase and stay inside the valid data."""
    if entries is None:
        return False
    if len(entries) == 0:
        return True
    rel = entries[:, 0].astype(np.int64)
    pos = entries[:, 1].astype(np.int64)
    return bool(
        (np.diff(rel) > 0).all()
        and (np.diff(pos) > 0).all()
        and pos[0] >= HEADER_SIZE
        and pos[-1] < data_end
    )


def first_wrong_entry(
    entries: np.ndarray, base: int, batch_at: Callable[[int], int | None]
) -> tuple[int, int | None] | None:
    """The first index entry that does not point at a batch starting at its offset, as
    ``(entry number, base offset of the batch there or None)``; ``None`` when all do.
    ``batch_at`` gives the base offset of the valid batch at a position (:func:`batch_base_at`,
    or the positions a walk saw)."""
    for number, (relative, position) in enumerate(entries.tolist()):
        found = batch_at(position)
        if found != base + relative:
            return number, found
    return None


def batch_base_at(data: Any) -> Callable[[int], int | None]:
    """:func:`first_wrong_entry`'s ``batch_at`` for a segment's bytes (CRC checked)."""

    def at(position: int) -> int | None:
        header = check_batch(data, position, len(data))[0]
        return None if header is None else header.base_offset

    return at


def write_index(
    fs: FileSystem, directory: str, base: int, entries: list[tuple[int, int]], *, temp: bool = False
) -> str:
    """Write a whole index (rebuild or rewrite); returns the path written."""
    path = index_path(directory, base)
    if temp:
        path = filenames.rewrite_name(path)
    body = b"".join(INDEX_ENTRY.pack(offset - base, position) for offset, position in entries)
    fd = fs.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        fs.write(fd, INDEX_FILE_HEADER + body)
    finally:
        fs.close(fd)
    return path


# -- reading batches ---------------------------------------------------------------------


def bound_by_head(size: int, base: int, head: Head | None) -> int:
    """Segment ``base``'s file ``size`` cut to where its data ends: the head's
    ``active_size`` when the writers' head names this segment and the file is longer. Past
    it lie the zeros an exclusive writer reserved (``tailmap.py``; docs/format.md 3.1) or a
    batch whose head is not yet published. Every size that stands for a segment's data
    (reads, byte counts of retention, the cleaner's and the CLI's figures) goes through it."""
    if head is not None and head.active_base == base and HEADER_SIZE <= head.active_size < size:
        return head.active_size
    return size


def segment_data_size(directory: str, base: int, head: Head | None) -> int:
    """The bytes of data in segment ``base`` (:func:`bound_by_head`; ``head`` as read once
    by the caller with ``head.read_log_head``)."""
    return bound_by_head(os.path.getsize(segment_path(directory, base)), base, head)


class SegmentReader:
    """Iterates the valid batches of one segment file from a byte position.

    Holds its own descriptor, so a segment replaced by the cleaner or removed by retention
    while it is being read is read to its end as it was (the old inode stays alive).
    """

    def __init__(
        self,
        directory: str,
        base: int,
        *,
        last_segment: bool,
        head: Callable[[], Head | None] | None = None,
        mapped: bool = True,
    ) -> None:
        self.path = segment_path(directory, base)
        self.directory = directory
        self.base = base
        self.last_segment = last_segment
        # how the writers' head is read (a subscriber passes the pread of the ``.lock`` it
        # keeps open); by default ``.lock`` is opened for each read
        self._read_head = head
        # a closed segment is mapped (no copy; for a scan that goes once through it); a
        # subscriber, which goes a poll at a time, reads it in chunks like the newest one
        self.mapped = mapped
        self._vouched = False  # the last head read was trusted (``head.read_published_head``)
        try:
            self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise MissingSegmentError("segment file vanished", path=self.path, position=0) from None
        # the newest segment may have no header yet: a roll between creating the file and
        # writing it, or a power loss that kept the file but not its never-synced bytes
        header = read_all(self.fd, 0, HEADER_SIZE)
        self.empty = (
            last_segment
            and header != SEGMENT_FILE_HEADER
            and unsynced_header(header, unsynced_from(directory, base))
        )
        if not self.empty:
            try:
                check_segment_header(self.path, header)
            except BaseException:
                self.close()
                raise

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> SegmentReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def batches(self, position: int, *, verify: bool = True) -> Iterator[RecordBatch]:
        """Every stored batch from ``position`` on, one :class:`RecordBatch` each."""
        for pos, header, buffer, offset_in_buffer in self._headers(position, verify=verify):
            assert isinstance(header, BatchHeader)
            yield self._decode(buffer, offset_in_buffer, header, pos)

    def runs(
        self, position: int, *, max_records: int = RUN_RECORDS, max_bytes: int = RUN_BYTES
    ) -> Iterator[RecordBatch]:
        """Like :meth:`batches`, but a run of consecutive small batches comes back as one
        :class:`RecordBatch` (``small_runs.decode_small_run``; ``stored_batches`` says how many
        it spans, at most ``max_bytes`` of them and about ``max_records`` records). For
        callers that work on offsets and columns, not on stored batch boundaries."""
        limits = (max_records, max_bytes)
        for pos, header, buffer, offset_in_buffer in self._headers(position, runs=limits):
            if isinstance(header, SmallRun):
                try:
                    batch = decode_small_run(buffer, header)
                except Exception:  # a body that passed its CRC yet does not decode
                    batch = self._one_by_one(buffer, header, pos - offset_in_buffer)
                batch.position = pos
                yield batch
            else:
                yield self._decode(buffer, offset_in_buffer, header, pos)

    def _decode(self, buffer: Any, offset: int, header: BatchHeader, pos: int) -> RecordBatch:
        try:
            batch = decode_batch(buffer, offset, header)
        except Exception as error:  # a body that passed its CRC yet does not decode
            raise CorruptLogError(
                f"undecodable batch: {error}", path=self.path, position=pos
            ) from None
        batch.position = pos
        return batch

    def _one_by_one(self, buffer: Any, run: SmallRun, origin: int) -> RecordBatch:
        """A run that did not decode at once: batch by batch, so that an undecodable one
        is reported at its own position."""
        pieces = []
        for at, fields in zip(run.positions.tolist(), run.headers.tolist(), strict=True):
            pieces.append(self._decode(buffer, at, BatchHeader._make(fields), origin + at))
        return concat_batches(pieces)

    def headers(self, position: int) -> Iterator[tuple[int, BatchHeader]]:
        for pos, header, _buffer, _offset in self._headers(position, verify=True):
            assert isinstance(header, BatchHeader)
            yield pos, header

    def _headers(
        self, position: int, *, verify: bool = True, runs: tuple[int, int] | None = None
    ) -> Iterator[tuple[int, BatchHeader | SmallRun, Any, int]]:
        """``(file position, header, buffer, position in buffer)`` of each valid batch;
        with ``runs`` (record and byte limits), a run of small batches found at a
        position comes as one item whose header is the :class:`SmallRun`."""
        pos = max(position, HEADER_SIZE)
        size = self.readable_size()
        if self.mapped and not self.last_segment and size > pos:
            yield from self._mapped_headers(pos, size, runs)
            return
        while pos < size:
            buffer = read_all(self.fd, pos, min(READ_CHUNK, size - pos))
            batches = BatchWalk(buffer, 0, len(buffer), runs=runs)
            for at, item in batches:
                yield pos + at, item, buffer, at
            cursor = batches.pos
            reason = batches.reason
            # an incomplete batch that straddles the chunk: read on from its start
            if reason and not (reason.startswith("incomplete") and pos + len(buffer) < size):
                self._bad_batch(pos + cursor, reason, size)
                return
            if cursor == 0:
                # one batch larger than a chunk: fetch it whole (its header says how long
                # it is, which check_batch then verifies with the rest)
                header, reason = read_batch_header(buffer, 0, 1 << 62)
                want = size - pos if header is None else min(header.length, size - pos)
                buffer = read_all(self.fd, pos, want)
                header, reason = check_batch(buffer, 0, len(buffer))
                if header is None:
                    self._bad_batch(pos, reason, size)
                    return
                yield pos, header, buffer, 0
                cursor = header.length
            pos += cursor
            if pos >= size:
                size = self.readable_size()
        if self.last_segment and not self.empty and not self._vouched:
            # the data ended with no invalid batch, and no trusted head says where: were
            # bytes made durable past it (missing bytes are damage, durable.py)?
            durable = durable_size(self.directory, self.base)
            check_durable_length(self.path, os.fstat(self.fd).st_size, durable)

    def readable_size(self) -> int:
        """Where the data ends: the file's size, for the newest segment bounded by the
        writers' head (:func:`bound_by_head`)."""
        if self.empty:
            return HEADER_SIZE
        size = os.fstat(self.fd).st_size
        if self.last_segment:
            head = read_log_head(self.directory) if self._read_head is None else self._read_head()
            self._vouched = head is not None  # (a live writer's head, or a clean close's)
            return bound_by_head(size, self.base, head)
        return size

    def _mapped_headers(
        self, pos: int, size: int, runs: tuple[int, int] | None
    ) -> Iterator[tuple[int, BatchHeader | SmallRun, Any, int]]:
        """A closed segment is read through ``mmap``: no copy, no fresh buffers.

        Closed segments are never truncated in place (the cleaner and repair replace them by
        rename, retention unlinks them), so the mapping cannot fault. Batches yielded keep
        views of the mapping; it is released when the last of them goes.
        """
        mapped = mmap.mmap(self.fd, size, prot=mmap.PROT_READ)
        released = 0  # pages below this were handed back (see below)
        batches = BatchWalk(mapped, pos, size, runs=runs)
        for at, item in batches:
            if at - released >= RELEASE_BYTES:
                # drop what was read from this process's resident set: the pages stay in the
                # page cache, and a batch still holding a view of them faults them back in
                # from the unchanged file, so a long scan does not grow the RSS by the file
                done = at // mmap.PAGESIZE * mmap.PAGESIZE
                mapped.madvise(mmap.MADV_DONTNEED, released, done - released)
                released = done
            yield at, item, mapped, at
        if batches.reason:
            self._bad_batch(batches.pos, batches.reason, size)

    def _bad_batch(self, pos: int, reason: str, size: int) -> None:
        """An invalid batch at ``pos``: the end of the data when :func:`judge_damage` calls
        it a torn tail of the newest segment, else :class:`CorruptLogError`."""
        unsynced = unsynced_from(self.directory, self.base) if self.last_segment else None
        data = read_all(self.fd, 0, size)
        damage = judge_damage(
            data, pos, len(data), reason, newest=self.last_segment, unsynced=unsynced
        )
        if damage.torn_tail:
            return
        detail = damage_detail(damage, newest=self.last_segment)
        raise CorruptLogError(reason + detail, path=self.path, position=pos)


def unsynced_header(header: bytes, unsynced_from: int | None) -> bool:
    """Whether a newest segment's first bytes are a file header not written yet: missing or
    cut short (a roll between creating the file and writing its header) unless its durable
    point lies past it (``unsynced_from`` above 0, see ``durable.unsynced_from``: the header
    was synced, so a short one is damage), or, when nothing of the file is known to be on
    disk (``unsynced_from`` 0), anything without the segment magic (a power loss kept the
    file but not its header)."""
    if len(header) < HEADER_SIZE and header == SEGMENT_FILE_HEADER[: len(header)]:
        return not unsynced_from
    return unsynced_from == 0 and header[: len(SEGMENT_MAGIC)] != SEGMENT_MAGIC


def new_segment_bytes() -> bytes:
    return SEGMENT_FILE_HEADER


# a closed segment's largest timestamp by (base, inode, size): kept per log (Log, the
# cleaner service), read by retention and the dirty measure
TimestampCache = dict[tuple[int, int, int], "int | None"]


def max_timestamp(directory: str, base: int, cache: TimestampCache | None = None) -> int | None:
    """The largest record timestamp in a closed segment (``None`` if it holds no batch).

    Reads every batch header, so callers pass a ``cache``: entries are keyed by the file's
    base, inode and size, which change whenever the segment is rewritten."""
    stat = os.stat(segment_path(directory, base))
    key = (base, stat.st_ino, stat.st_size)
    if cache is not None and key in cache:
        return cache[key]
    largest = None
    with SegmentReader(directory, base, last_segment=False) as reader:
        for _pos, header in reader.headers(HEADER_SIZE):
            if largest is None or header.max_ts > largest:
                largest = header.max_ts
    if cache is not None:
        cache[key] = largest
    return largest
