"""What a compaction pass does when the operating system refuses a write (issue 8).

Every file change of a pass goes through the log's :class:`~compactlog.storage.fsio.FileSystem`
seam. The pass runs with it wrapped in :class:`GuardedFS`, which turns an ``OSError`` into
:class:`WriteFailed` naming the operation and the path (``os.write`` alone does not say
which file). The cleaner then rolls back (:func:`roll_back`) and raises the public error
(:func:`public_error`): :class:`~compactlog.errors.DiskFullError` for ``ENOSPC`` and
``EDQUOT``, :class:`~compactlog.errors.CompactionWriteError` otherwise; never a bare
``OSError``. Such a failure does not mark the log uncleanable: its cause (a full disk, a
permission, a failing device) is outside the log, and a later pass succeeds once it is
gone. A corrupt batch still marks it (``compact_log``). A read that fails (``EIO`` on a
segment) raises :class:`~compactlog.errors.CompactionError` (:func:`read_error`).
"""

from __future__ import annotations

import errno as errnos
import os
from collections.abc import Sequence
from typing import Protocol

from ..errors import (
    CompactionError,
    CompactionWriteError,
    CompactLogError,
    DiskFullError,
    WriteFailed,
)
from ..storage import swap
from ..storage.fsio import FileSystem
from .dirty import Segment

DISK_FULL = frozenset({errnos.ENOSPC, errnos.EDQUOT})


class Group(Protocol):
    """What :func:`roll_back` reads of the cleaner's group writer (``group.GroupWriter``),
    named here so that this module does not import the cleaner back."""

    @property
    def segments(self) -> Sequence[Segment]: ...
    @property
    def size(self) -> int: ...
    @property
    def installing(self) -> bool: ...
    def discard(self) -> None: ...


class GuardedFS(FileSystem):
    """The log's file system, with every ``OSError`` of a change turned into
    :class:`WriteFailed`. ``FileNotFoundError`` of ``remove`` and ``rename`` passes through
    unchanged: callers expect it (a file already gone)."""

    def __init__(self, inner: FileSystem) -> None:
        self.inner = inner
        self.paths: dict[int, str] = {}

    def _path(self, fd: int) -> str | None:
        return self.paths.get(fd)

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        try:
            fd = self.inner.open(path, flags, mode)
        except OSError as error:
            raise WriteFailed("open", path, error) from error
        self.paths[fd] = path
        return fd

    def close(self, fd: int) -> None:
        path = self.paths.pop(fd, None)
        try:
            self.inner.close(fd)
        except OSError as error:
            raise WriteFailed("close", path, error) from error

    def write(self, fd: int, data: bytes | memoryview) -> None:
        try:
            self.inner.write(fd, data)
        except OSError as error:
            raise WriteFailed("write", self._path(fd), error) from error

    def pwrite(self, fd: int, data: bytes | memoryview, position: int) -> None:
        try:
            self.inner.pwrite(fd, data, position)
        except OSError as error:
            raise WriteFailed("write", self._path(fd), error) from error

    def pwritev(self, fd: int, buffers: list[bytes | memoryview], position: int) -> None:
        try:
            self.inner.pwritev(fd, buffers, position)
        except OSError as error:
            raise WriteFailed("write", self._path(fd), error) from error

    def fsync(self, fd: int) -> None:
        try:
            self.inner.fsync(fd)
        except OSError as error:
            raise WriteFailed("fsync", self._path(fd), error) from error

    def fdatasync(self, fd: int) -> None:
        try:
            self.inner.fdatasync(fd)
        except OSError as error:
            raise WriteFailed("fsync", self._path(fd), error) from error

    def truncate(self, fd: int, length: int) -> None:
        try:
            self.inner.truncate(fd, length)
        except OSError as error:
            raise WriteFailed("truncate", self._path(fd), error) from error

    def rename(self, source: str, target: str) -> None:
        try:
            self.inner.rename(source, target)
        except FileNotFoundError:
            raise
        except OSError as error:
            raise WriteFailed(f"rename over {os.path.basename(target)}", source, error) from error

    def remove(self, path: str) -> None:
        try:
            self.inner.remove(path)
        except FileNotFoundError:
            raise
        except OSError as error:
            raise WriteFailed("remove", path, error) from error

    def fsync_dir(self, directory: str) -> None:
        try:
            self.inner.fsync_dir(directory)
        except OSError as error:
            raise WriteFailed("fsync", directory, error) from error

    def free_bytes(self, directory: str) -> int:
        return self.inner.free_bytes(directory)

    def write_atomic(self, directory: str, name: str, data: bytes) -> None:
        try:
            self.inner.write_atomic(directory, name, data)
        except OSError as error:
            raise WriteFailed("write", os.path.join(directory, name), error) from error


def roll_back(fs: FileSystem, directory: str, group: Group, failure: WriteFailed) -> None:
    """Undo the group a write failed in, and note on ``failure`` what was done.

    Before the swap (``group.installing`` false) the group's ``.rw`` files go. During it,
    :func:`compactlog.storage.swap.resolve_interrupted_swap` decides from the ``.rw`` files: undo
    before the rename of the ``.log.rw``, completion after it. When that fails too (the
    fault persists), the intent and the ``.rw`` files stay as they are: the next pass, or
    the next open, resolves them the same way (a ``.log.rw`` is never removed while the
    intent names it: see ``swap.py``).
    """
    first, last = group.segments[0].base, group.segments[-1].base
    failure.group = f"segments {first}..{last}" if last != first else f"segment {first}"
    failure.needed_bytes = sum(s.size for s in group.segments)
    failure.written_bytes = group.size
    if group.installing:
        try:
            failure.rollback.extend(swap.resolve_interrupted_swap(fs, directory))
        except (WriteFailed, OSError, CompactLogError) as error:
            failure.rollback.append(
                f"the swap could not be resolved now ({error}); the next pass or open of "
                "the log resolves it (cleaner.swap is kept)"
            )
            return
    try:
        group.discard()
    except (WriteFailed, OSError) as error:
        failure.rollback.append(
            f"the rewrite could not be removed now ({error}); the next pass or open removes it"
        )
    else:
        if not failure.rollback:
            failure.rollback.append("the unfinished rewrite was removed")


def public_error(failure: WriteFailed, fs: FileSystem, directory: str) -> CompactionError:
    """The error a caller sees: what failed, on which path, what was needed, what the
    rollback did, and that the log is intact."""
    error = failure.error
    code = error.errno
    reason = error.strerror or str(error)
    what = f"compaction could not {failure.operation} ({reason}, errno {code})"
    if failure.group:
        what += f" while rewriting {failure.group}"
    undone = "; ".join(failure.rollback) or "nothing to undo"
    after = (
        f"rolled back: {undone}. The log is readable and writable, its cleaner point did "
        "not move, and the next pass starts over"
    )
    if code in DISK_FULL:
        try:
            free: int | None = fs.free_bytes(directory)
        except OSError:
            free = None
        need = (
            f"; the group needs up to {failure.needed_bytes:,} bytes "
            f"({failure.written_bytes:,} written)"
            if failure.group
            else ""
        )
        free_text = f"{free:,} bytes free" if free is not None else "free space unknown"
        return DiskFullError(
            f"disk full: {what}{need}, {free_text}; {after} once space is freed",
            path=failure.path,
            errno=code,
            operation=failure.operation,
            needed_bytes=failure.needed_bytes,
            written_bytes=failure.written_bytes,
            free_bytes=free,
        )
    return CompactionWriteError(
        f"{what}; {after}", path=failure.path, errno=code, operation=failure.operation
    )


def read_error(error: OSError, directory: str) -> CompactionError:
    """A read of the pass failed (``EIO`` on a segment, a file that vanished): the group in
    progress was removed and nothing else had changed for it."""
    reason = error.strerror or str(error)
    return CompactionError(
        f"compaction could not read ({reason}, errno {error.errno}); the group in progress "
        "was removed, the log is readable and writable and its cleaner point did not move",
        path=error.filename if isinstance(error.filename, str) else directory,
        errno=error.errno,
        operation="read",
    )
