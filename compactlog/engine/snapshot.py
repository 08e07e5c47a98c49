"""Consistent point-in-time snapshots of a live log (``Log.snapshot``, ``compactlog snapshot``).

A snapshot is itself a log directory, opened with ``compactlog.open(dest, read_only=True)``:
closed segments hard-linked (copied when the destination is on another file system), the
active segment copied up to a batch boundary, copies of the indexes, ``meta`` and
``cleaner.checkpoint``, and a manifest ``snapshot.json`` (format in ``docs/format.md``).

Why hard links are safe: no code changes a closed segment in place. The cleaner writes a
``.rw`` file and renames it over the segment (``swap.py``), retention and repair unlink or
rename; each gives the live log a *new* inode under the old name and leaves the inode the
snapshot links to untouched. Indexes are copied, not linked, because a rebuild rewrites an
index in place. The active segment is the only file writers extend, so it is copied.

Why the result is consistent: the writers publish their head (active segment, end offset,
its size at a batch boundary) in ``.lock`` after every append (``head.py``); the snapshot
ends exactly there. The cleaner lock is held while the closed segments are linked and the
cleaner point read, so no cleaning pass or retention run is half-way through: the files and
the cleaner point describe one state. Writers are never blocked: the snapshot takes no
writer lock, and the active segment's bytes below the published size never change.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..encoding.documents import DocumentKind, decode_document
from ..encoding.format import (
    FORMAT_VERSION,
    INDEX_ENTRY,
    INDEX_FILE_HEADER,
    SEGMENT_FILE_HEADER,
    crc32c,
)
from ..errors import NotALogError, SnapshotError
from ..storage import filenames
from ..storage.fsio import fsync_dir, fsync_file
from ..storage.head import read_log_head
from ..storage.segment import (
    HEADER_SIZE,
    index_path,
    list_segments,
    read_all,
    scan_segment,
    segment_path,
)
from ..storage.state_files import read_cleaner_state, read_meta

if TYPE_CHECKING:
    from .logview import LogView

MANIFEST = filenames.SNAPSHOT_MANIFEST
MANIFEST_MAGIC = "compactlog-snapshot"
MANIFEST_VERSION = 1
MANIFEST_KIND = DocumentKind(
    MANIFEST, MANIFEST_MAGIC, "manifest_version", MANIFEST_VERSION, "a compactlog snapshot manifest"
)
PARTIAL_SUFFIX = ".partial"
COPY_CHUNK = 8 << 20
CRC_CHUNK = 64 << 20


@dataclass(frozen=True, slots=True)
class SnapshotFile:
    """One file of a snapshot as the manifest records it."""

    name: str
    size: int
    crc32c: int
    linked: bool  # a hard link to the source's file (else a copy)

    def to_json(self) -> dict[str, Any]:
        """The file's entry in ``snapshot.json``."""
        return {"name": self.name, "size": self.size, "crc32c": self.crc32c, "linked": self.linked}


@dataclass(slots=True)
class Snapshot:
    """What ``snapshot.json`` holds: where it came from, which offsets, which files."""

    path: str
    source: str
    start_offset: int
    end_offset: int
    cleaner_point: int
    created_ms: int
    files: list[SnapshotFile] = field(default_factory=list)
    format_version: int = FORMAT_VERSION
    seconds: float = 0.0

    @property
    def total_bytes(self) -> int:
        """The bytes of every file of the snapshot."""
        return sum(f.size for f in self.files)

    @property
    def linked_files(self) -> int:
        """How many files are hard links to the source log's (closed segments)."""
        return sum(1 for f in self.files if f.linked)

    def to_json(self) -> dict[str, Any]:
        """The manifest, ``snapshot.json``, as a JSON-ready dict."""
        return {
            "magic": MANIFEST_MAGIC,
            "manifest_version": MANIFEST_VERSION,
            "format_version": self.format_version,
            "source": self.source,
            "start_offset": self.start_offset,
            "end_offset": self.end_offset,
            "cleaner_point": self.cleaner_point,
            "created_ms": self.created_ms,
            "files": [f.to_json() for f in self.files],
        }


def is_snapshot(directory: str | os.PathLike[str]) -> bool:
    return os.path.isfile(os.path.join(os.fspath(directory), MANIFEST))


def read_manifest(directory: str | os.PathLike[str]) -> Snapshot:
    """Parse ``snapshot.json``; a newer manifest or format version is refused."""
    directory = os.path.abspath(os.fspath(directory))
    path = os.path.join(directory, MANIFEST)
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        raise NotALogError("not a compactlog snapshot (no snapshot.json)", path=directory) from None

    def build(document: dict[str, Any]) -> Snapshot:
        return Snapshot(
            path=directory,
            source=str(document["source"]),
            start_offset=int(document["start_offset"]),
            end_offset=int(document["end_offset"]),
            cleaner_point=int(document["cleaner_point"]),
            created_ms=int(document["created_ms"]),
            format_version=int(document["format_version"]),
            files=[
                SnapshotFile(str(f["name"]), int(f["size"]), int(f["crc32c"]), bool(f["linked"]))
                for f in document["files"]
            ],
        )

    return decode_document(
        data, MANIFEST_KIND, build, lambda message: SnapshotError(message, path=path)
    )


# -- taking a snapshot ----------------------------------------------------------------


def take_snapshot(log: LogView, dest: str | os.PathLike[str], *, durable: bool = True) -> Snapshot:
    """Make a consistent copy of ``log`` as of its end offset now, at ``dest``.

    ``durable=False`` skips every fsync (steps 3-5) for a snapshot that only serves as a
    consistent view for the process taking it and is deleted when it is done, such as the
    one ``compactlog restore`` reads: a process crash loses nothing (the page cache keeps
    the bytes), and after an operating-system crash such a snapshot is garbage anyway.
    Everything else (links, copies, CRCs, the renames) is the same.

    Crash protocol (``dest`` must not exist; its parent must):

    1. Remove a ``<dest>.partial`` left by an earlier attempt, create it afresh. Death
       here or in 2-4: only ``<dest>.partial`` exists, never ``dest``; the next snapshot to
       ``dest`` removes it (nothing else reads it).
    2. Holding the cleaner lock (a running pass or retention finishes first; writers go on):
       read the writers' head (active segment base, end offset, size), ``meta`` and the
       cleaner point; hard-link (or copy) every segment below the active base, copy their
       indexes, and open the active segment. Then release the lock.
    3. Copy the active segment up to the head's size (a batch boundary) and the index
       entries below it; verify those bytes form whole valid batches ending at the end
       offset; compute every file's CRC and size.
    4. fsync every copied file, write ``snapshot.json`` (temp, fsync, rename), fsync the
       directory.
    5. Rename ``<dest>.partial`` to ``dest`` and fsync the parent directory. A death
       before the rename leaves no ``dest``; after it, a complete snapshot (with
       ``durable=False``, complete unless the operating system crashed).
    """
    started = time.perf_counter()
    dest = os.path.abspath(os.fspath(dest))
    if os.path.lexists(dest):
        raise SnapshotError("snapshot destination already exists", path=dest)
    parent = os.path.dirname(dest)
    if not os.path.isdir(parent):
        raise SnapshotError("the snapshot destination's parent directory does not exist", path=dest)
    if log.writer is not None:
        log.writer.materialize()  # this process's precommitted records are part of it
    # 1.
    partial = dest + PARTIAL_SUFFIX
    if os.path.lexists(partial):
        shutil.rmtree(partial)
    os.mkdir(partial)
    try:
        # 2.
        with log.cleaner_lock(wait=True):
            state = _link_closed(log, partial, durable)
        # 3.
        try:
            files = state.files + _copy_active(log.directory, partial, state, durable)
        finally:
            os.close(state.active_fd)
        snapshot = Snapshot(
            path=dest,
            source=log.directory,
            start_offset=state.start_offset,
            end_offset=state.end_offset,
            cleaner_point=min(state.cleaner_point, state.end_offset),
            created_ms=time.time_ns() // 1_000_000,
            files=files,
        )
        # 4.
        if durable:
            fsync_dir(partial)
            log.fs.write_atomic(partial, MANIFEST, _manifest_bytes(snapshot))
        else:  # nothing reads <dest>.partial, so the manifest needs no rename either
            _write_new(os.path.join(partial, MANIFEST), _manifest_bytes(snapshot), False)
        # 5.
        os.rename(partial, dest)
        if durable:
            fsync_dir(parent)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    snapshot.seconds = time.perf_counter() - started
    return snapshot


@dataclass(slots=True)
class _Linked:
    files: list[SnapshotFile]
    start_offset: int
    end_offset: int
    cleaner_point: int
    active_base: int
    active_size: int
    active_fd: int


def _link_closed(log: LogView, partial: str, durable: bool) -> _Linked:
    """Step 2: everything that must be read under the cleaner lock."""
    source = log.directory
    head = read_log_head(source)
    bases = list_segments(source)
    if not bases:
        raise SnapshotError("the log has no segment", path=source)
    if head is not None and head.active_base in bases:
        active_base, active_size, end = head.active_base, head.active_size, head.end_offset
    else:
        # no writer ever published a head here (or it names a segment that is gone): the
        # newest segment, up to its last valid batch, is the state
        active_base = bases[-1]
        active_size, end = _scan_end(source, active_base)
    meta = read_meta(source)
    cleaner = read_cleaner_state(source)
    files: list[SnapshotFile] = []
    for name in (filenames.META, filenames.CLEANER_CHECKPOINT):
        if os.path.exists(os.path.join(source, name)):
            files.append(
                _copy_file(os.path.join(source, name), os.path.join(partial, name), durable)
            )
    for base in bases:
        if base >= active_base:
            break
        files.append(
            _link_or_copy(segment_path(source, base), segment_path(partial, base), durable)
        )
        if os.path.exists(index_path(source, base)):
            files.append(_copy_file(index_path(source, base), index_path(partial, base), durable))
    active_fd = os.open(segment_path(source, active_base), os.O_RDONLY | os.O_CLOEXEC)
    start = max(meta.log_start_offset, bases[0])
    return _Linked(
        files, start, end, cleaner.first_dirty_offset, active_base, active_size, active_fd
    )


def _scan_end(directory: str, base: int) -> tuple[int, int]:
    path = segment_path(directory, base)
    with open(path, "rb") as handle:
        data = handle.read()
    result = scan_segment(path, data, HEADER_SIZE)
    return result.valid_end, result.next_offset if result.next_offset is not None else base


def _copy_active(source: str, partial: str, state: _Linked, durable: bool) -> list[SnapshotFile]:
    """Step 3: the active segment's bytes below the published size, checked whole."""
    path = segment_path(partial, state.active_base)
    if state.active_size <= HEADER_SIZE:
        # a segment just rolled: the head is published before the file gets its header
        data = SEGMENT_FILE_HEADER
        _write_new(path, data, durable)
        _write_new(index_path(partial, state.active_base), INDEX_FILE_HEADER, durable)
        return [
            SnapshotFile(os.path.basename(path), len(data), crc32c(data), False),
            SnapshotFile(
                filenames.index_name(state.active_base),
                len(INDEX_FILE_HEADER),
                crc32c(INDEX_FILE_HEADER),
                False,
            ),
        ]
    data = read_all(state.active_fd, 0, state.active_size)
    if len(data) < state.active_size:
        raise SnapshotError(
            f"active segment is {len(data)} bytes, the writers' head says {state.active_size}",
            path=segment_path(source, state.active_base),
        )
    result = scan_segment(path, data, HEADER_SIZE)
    reached = result.next_offset if result.next_offset is not None else state.active_base
    if result.torn_bytes or reached != state.end_offset:
        raise SnapshotError(
            f"active segment up to byte {state.active_size} does not end at a batch boundary "
            f"of offset {state.end_offset} (a writer died mid-append: open the log once to "
            "recover it, then snapshot again)",
            path=segment_path(source, state.active_base),
        )
    _write_new(path, data, durable)
    files = [SnapshotFile(os.path.basename(path), len(data), crc32c(data), False)]
    index_source = index_path(source, state.active_base)
    if os.path.exists(index_source):
        with open(index_source, "rb") as handle:
            index = handle.read()
        usable = (len(index) - HEADER_SIZE) // INDEX_ENTRY.size
        kept = [index[:HEADER_SIZE]]
        for i in range(max(usable, 0)):
            entry = index[HEADER_SIZE + i * INDEX_ENTRY.size : HEADER_SIZE + (i + 1) * 8]
            _relative, position = INDEX_ENTRY.unpack(entry)
            if position >= state.active_size:
                break
            kept.append(entry)
        blob = b"".join(kept)
        _write_new(index_path(partial, state.active_base), blob, durable)
        files.append(SnapshotFile(os.path.basename(index_source), len(blob), crc32c(blob), False))
    return files


def _link_or_copy(source: str, target: str, durable: bool) -> SnapshotFile:
    try:
        os.link(source, target)
        linked = True
    except OSError as error:
        if error.errno not in (18, 1, 95, 31):  # EXDEV, EPERM, EOPNOTSUPP, EMLINK
            raise
        shutil.copyfile(source, target)
        if durable:
            fsync_file(target)
        linked = False
    size, crc = file_crc(target)
    return SnapshotFile(os.path.basename(target), size, crc, linked)


def _copy_file(source: str, target: str, durable: bool) -> SnapshotFile:
    with open(source, "rb") as handle:
        data = handle.read()
    _write_new(target, data, durable)
    return SnapshotFile(os.path.basename(target), len(data), crc32c(data), False)


def _write_new(path: str, data: bytes, durable: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view[:COPY_CHUNK])
            view = view[written:]
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def file_crc(path: str) -> tuple[int, int]:
    """``(size, crc32c)`` of a whole file, read through ``mmap`` in chunks."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            return 0, crc32c(b"")
        with mmap.mmap(handle.fileno(), size, prot=mmap.PROT_READ) as mapped:
            view = memoryview(mapped)
            crc = 0
            try:
                for start in range(0, size, CRC_CHUNK):
                    crc = crc32c(view[start : start + CRC_CHUNK], crc)
            finally:
                view.release()
    return size, crc


def _manifest_bytes(snapshot: Snapshot) -> bytes:
    return json.dumps(snapshot.to_json(), indent=1).encode() + b"\n"


# -- checking a snapshot ----------------------------------------------------------------


def verify_manifest(directory: str | os.PathLike[str]) -> list[str]:
    """Problems with a snapshot's files against its manifest (sizes, CRCs, missing or extra
    segments); an empty list when every file is as the manifest recorded it."""
    snapshot = read_manifest(directory)
    root = snapshot.path
    problems: list[str] = []
    listed = {f.name for f in snapshot.files}
    for entry in snapshot.files:
        path = os.path.join(root, entry.name)
        if not os.path.exists(path):
            problems.append(f"{entry.name}: listed in snapshot.json but missing")
            continue
        size, crc = file_crc(path)
        if size != entry.size:
            problems.append(f"{entry.name}: {size} bytes, snapshot.json says {entry.size}")
        elif crc != entry.crc32c:
            problems.append(
                f"{entry.name}: crc32c {crc:#010x}, snapshot.json says {entry.crc32c:#010x}"
            )
    for name in sorted(os.listdir(root)):
        kind = filenames.parse_filename(name).kind
        if kind in (filenames.FileKind.SEGMENT, filenames.FileKind.INDEX) and name not in listed:
            problems.append(f"{name}: not listed in snapshot.json (added after the snapshot)")
    return problems


__all__ = [
    "MANIFEST",
    "Snapshot",
    "SnapshotError",
    "SnapshotFile",
    "file_crc",
    "is_snapshot",
    "read_manifest",
    "take_snapshot",
    "verify_manifest",
]
