"""The archive's one door into the library: what a log directory holds that is durable now,
and the check of the bytes it ships.

Every import of a library internal by ``compactlog.archive`` is in this module (the files
layer: ``segment``, ``head``, ``filenames``, ``durable``), so that moving those modules
changes one file.
The archive never parses the segment format itself: bytes it uploads are checked batch by
batch by ``segment.scan_segment`` (the library's batch walker: header checks and CRC-32C),
and restored logs are opened by ``compactlog.open``, whose recovery checks them again.

What is durable (docs/format.md sections 3 and 10): every closed segment whole (a roll
fdatasyncs the segment it leaves before the next one exists), and the newest segment up to
the **sync point** stored in ``.lock`` when it names that segment. Data past the sync point
may still be lost by a power loss, so it waits for the next round. A newest segment that
ends before its sync point has lost bytes a writer made durable: that is damage, and the
round refuses it (:class:`~compactlog.errors.CorruptLogError` naming file and byte) rather
than ship a shortened segment.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

from ..errors import ArchiveError
from ..storage import filenames
from ..storage.durable import check_durable_length
from ..storage.head import LOCK_FILE_SIZE, Head, encode_head, read_log_head, read_sync_point
from ..storage.segment import (
    HEADER_SIZE,
    check_segment_header,
    list_segments,
    read_all,
    scan_segment,
    segment_path,
)

LOG_ID_FILE = "archive.id"  # this log's identity for its archive (docs/archive.md)
SEGMENT_HEADER_SIZE = HEADER_SIZE
META_FILE = filenames.META
CLEANER_FILE = filenames.CLEANER_CHECKPOINT
REPLICA_STATE = filenames.REPLICA_STATE
REPLICA_LOCK = filenames.REPLICA_LOCK


@dataclass(frozen=True, slots=True)
class FileStat:
    """What identifies one version of a segment file cheaply (rsync's quick check)."""

    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, stat: os.stat_result) -> FileStat:
        return cls(stat.st_ino, stat.st_size, stat.st_mtime_ns)

    def to_json(self) -> list[int]:
        return [self.ino, self.size, self.mtime_ns]

    @classmethod
    def from_json(cls, value: Any) -> FileStat | None:
        if isinstance(value, list) and len(value) == 3:
            return cls(int(value[0]), int(value[1]), int(value[2]))
        return None


@dataclass(slots=True)
class DurableSegment:
    """One segment as the round sees it: its durable size, and an open descriptor when
    the round will read it (the descriptor pins this version of the file: the cleaner
    renames a rewrite over the name, it never changes these bytes)."""

    base: int
    path: str
    stat: FileStat
    durable_size: int
    active: bool  # the newest segment, still growing: the cleaner never touches it
    fd: int = -1

    def read(self, start: int, end: int) -> bytes:
        return read_all(self.fd, start, end - start)


@dataclass(slots=True)
class DurableView:
    """A consistent, durable state of a log: taken under the cleaner lock, so no cleaning
    pass or retention run is half-way through (the files, ``meta`` and the cleaner point
    describe one state), and cut at the sync point."""

    directory: str
    segments: list[DurableSegment]
    meta: dict[str, Any]
    cleaner: dict[str, Any] | None
    handed_out: int  # the writers' end offset when the view was taken (>= the durable end)
    log_id: str

    def close(self) -> None:
        for segment in self.segments:
            if segment.fd >= 0:
                os.close(segment.fd)
                segment.fd = -1


def capture(
    log: Any, needs_read: Callable[[int, FileStat, int, bool], bool], *, log_id: str
) -> DurableView:
    """The durable view of the open (read-only) ``log``, holding the cleaner lock only for
    the listing, a few ``stat``s and ``open``s (milliseconds, stamped *brief*: a cleaning
    pass that starts then waits for it rather than failing, ``CleanerLock``).
    ``needs_read(base, stat, durable_size, active)`` says which segments get a
    descriptor."""
    directory = log.directory
    with _cleaner_lock(log):
        bases = list_segments(directory)
        point = read_sync_point(directory)
        head = read_log_head(directory)
        newest = bases[-1] if bases else -1
        active_base = head.active_base if head is not None else newest
        segments: list[DurableSegment] = []
        try:
            for base in bases:
                path = segment_path(directory, base)
                try:
                    stat = FileStat.of(os.stat(path))
                except FileNotFoundError:
                    continue  # removed between the listing and now (cannot be: the lock)
                if base < active_base or (point is not None and base < point.base):
                    durable = stat.size  # closed: fdatasynced by the roll that closed it
                elif point is not None and base == point.base:
                    check_durable_length(path, stat.size, point.size)  # (damage: refused)
                    durable = min(point.size, stat.size)  # (0: an empty file)
                else:
                    break  # the active segment with nothing synced yet, and anything newer
                active = base >= active_base
                segment = DurableSegment(base, path, stat, durable, active)
                if durable > 0 and needs_read(base, stat, durable, active):
                    segment.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                segments.append(segment)
            meta = _read_json(os.path.join(directory, META_FILE))
            cleaner_path = os.path.join(directory, CLEANER_FILE)
            cleaner = _read_json(cleaner_path) if os.path.exists(cleaner_path) else None
        except BaseException:
            for segment in segments:
                if segment.fd >= 0:
                    os.close(segment.fd)
            raise
    handed_out = head.end_offset if head is not None else 0
    return DurableView(directory, segments, meta, cleaner, handed_out, log_id)


@contextmanager
def _cleaner_lock(log: Any, attempts: int = 20, pause_s: float = 0.05) -> Iterator[None]:
    """Hold the cleaner lock as a brief holder, tried without waiting a few times over about
    a second: a running pass or retention run is never waited on for long (the caller's
    next round tries again), and a pass that starts meanwhile waits milliseconds for us."""
    from ..errors import LogLockedError

    for attempt in range(attempts):
        lock = log.cleaner_lock(wait=False, brief=True)
        try:
            lock.__enter__()
        except LogLockedError:
            if attempt == attempts - 1:
                raise
            time.sleep(pause_s)
            continue
        try:
            yield
        finally:
            lock.__exit__(None, None, None)
        return


def check_piece(path: str, data: bytes, start: int) -> tuple[int, int | None]:
    """Check the bytes ``data`` of segment ``path`` starting at byte ``start`` with the
    library's batch walker (headers, CRC-32C; the file header when ``start`` is 0).
    Returns ``(whole, next_offset)``: how many bytes of ``data`` are whole batches (a torn
    end is left for a later round) and the offset after the last batch (``None``: none).
    Corruption raises :class:`~compactlog.errors.CorruptLogError` naming file and byte."""
    if start == 0:
        check_segment_header(path, data[:SEGMENT_HEADER_SIZE])
        result = scan_segment(path, data, min(SEGMENT_HEADER_SIZE, len(data)))
    else:
        result = scan_segment(path, data, 0, origin=start)
    return result.valid_end, result.next_offset


def log_id(log: Any, *, create: bool) -> str | None:
    """The log's archive identity (a random id in ``archive.id``, a file the library
    leaves alone): a log restored, recreated or copied from a snapshot has none, so its
    archive starts a new generation. ``create`` writes one when missing (atomically,
    keeping the restore's ``parent`` there: :func:`write_parent`)."""
    document = _log_id_document(log.directory)
    value = document.get("log_id")
    if isinstance(value, str) and value:
        return value
    if not create:
        return None
    value = uuid.uuid4().hex
    document["log_id"] = value
    log.fs.write_atomic(log.directory, LOG_ID_FILE, json.dumps(document).encode())
    return value


def write_parent(directory: str, parent: dict[str, Any]) -> None:
    """Record in a restored log's ``archive.id`` (which has no ``log_id`` yet) the manifest it
    was restored from and its archive's URL: archived again to that URL, its first
    generation names this manifest as its ``parent`` (docs/archive.md, the timeline)."""
    write_small_file(directory, LOG_ID_FILE, json.dumps({"parent": parent}).encode())


def parent_of(log: Any, url: str) -> dict[str, Any] | None:
    """The manifest the log was restored from, if it was restored from the archive at
    ``url`` (``sequence``, ``generation``, ``log_id``, ``end_offset``); else ``None``."""
    parent = _log_id_document(log.directory).get("parent")
    if not isinstance(parent, dict) or parent.get("url") != url:
        return None
    return {k: parent[k] for k in ("sequence", "generation", "log_id", "end_offset") if k in parent}


def _log_id_document(directory: str) -> dict[str, Any]:
    try:
        with open(os.path.join(directory, LOG_ID_FILE), encoding="utf-8") as handle:
            document = json.load(handle)
    except (FileNotFoundError, ValueError):
        return {}
    return document if isinstance(document, dict) else {}


def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            document = json.loads(handle.read())
    except (OSError, ValueError) as error:
        raise ArchiveError(f"cannot read {os.path.basename(path)}: {error}", path=path) from None
    if not isinstance(document, dict):
        raise ArchiveError("not a JSON object", path=path)
    return document


def write_small_file(directory: str, name: str, data: bytes) -> None:
    """Write a state file of a log being restored: temp, fsync, rename, fsync the directory
    (``fsio.FileSystem.write_atomic``, the library's one atomic write)."""
    from ..storage.fsio import FileSystem

    FileSystem().write_atomic(directory, name, data)


def write_offset_floor(directory: str, active_base: int, active_size: int, end: int) -> None:
    """Make the next open of a restored log hand out offsets from ``end`` on: a writers'
    head in ``.lock`` naming ``end`` (with no boot id, so only a hint), which recovery's
    pass 7 takes as the lowest next offset, as it does after a crash that lost unsynced
    records (format.md section 10). Offsets the lost machine handed out are never reused."""
    data = encode_head(Head(0, active_base, end, active_size))
    data += bytes(LOCK_FILE_SIZE - len(data))
    path = os.path.join(directory, filenames.WRITER_LOCK)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def segment_file_name(base: int) -> str:
    return filenames.segment_name(base)


def index_file_name(base: int) -> str:
    return filenames.index_name(base)


def replica_lock(directory: str) -> AbstractContextManager[None]:
    """Held while the follower applies a manifest (``state_files.replica_lock``)."""
    from ..storage.state_files import replica_lock as lock

    return lock(directory)


def fsync_directory(directory: str) -> None:
    from ..storage.fsio import fsync_dir

    fsync_dir(directory)


def index_interval(meta: dict[str, Any]) -> int:
    """The index interval a log's ``meta`` document configures (the library's default
    when it names none): what the restored log's indexes are written at."""
    from ..config import LogConfig

    stored = meta.get("config", {}) if isinstance(meta, dict) else {}
    return int(stored.get("index_interval_bytes", LogConfig().index_interval_bytes))


def write_segment_index(directory: str, base: int, data: bytes | memoryview, interval: int) -> None:
    """Write the index of the closed segment ``base`` whose whole bytes are ``data``, as
    recovery's index rebuild would (``scan_segment`` then ``write_index``), so that opening
    the restored log finds it consistent and does not read the segment again. Not synced
    here: an index is a cache, and the restore's final pass fsyncs it."""
    from ..storage.fsio import DEFAULT_FS
    from ..storage.segment import write_index

    path = segment_path(directory, base)
    result = scan_segment(path, data, HEADER_SIZE, index_interval=interval)
    write_index(DEFAULT_FS, directory, base, result.index_entries)


__all__ = [
    "LOG_ID_FILE",
    "DurableSegment",
    "DurableView",
    "FileStat",
    "capture",
    "check_piece",
    "fsync_directory",
    "index_file_name",
    "index_interval",
    "list_segments",
    "log_id",
    "parent_of",
    "read_all",
    "replica_lock",
    "segment_file_name",
    "write_offset_floor",
    "write_parent",
    "write_segment_index",
    "write_small_file",
]
