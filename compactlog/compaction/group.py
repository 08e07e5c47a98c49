"""One group's rewrite: ``<first>.log.rw`` written in chunks (its writeback started early)
and its index entries, then ``<first>.idx.rw``; or both removed when the group is given up.

The cleaner (``cleaner.py``) fills a :class:`GroupWriter` per group of closed segments;
``storage/swap.py`` installs the files; ``failures.roll_back`` undoes a refused write.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

import numpy as np

from ..storage import filenames
from ..storage.fsio import FileSystem
from ..storage.segment import HEADER_SIZE, index_path, new_segment_bytes, segment_path, write_index
from .dirty import Segment

WRITE_CHUNK = 1 << 20
WRITEBACK_CHUNK = 8 << 20  # start writing a rewrite back every this many bytes


def _writeback_starter() -> Callable[[int, int, int], None]:
    """Linux ``sync_file_range(fd, start, length, SYNC_FILE_RANGE_WRITE)``: start writing
    dirty pages back without waiting. A hint only: the swap's fsync is what makes a rewrite
    durable, and finds less left to wait for. A no-op where it is not available."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.sync_file_range
    except (OSError, AttributeError):
        return lambda fd, start, length: None
    call.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    call.restype = ctypes.c_int

    def start(fd: int, offset: int, length: int) -> None:
        call(fd, offset, length, 2)  # SYNC_FILE_RANGE_WRITE; a failure changes nothing

    return start


_start_writeback = _writeback_starter()


class GroupWriter:
    """Writes one group's ``<first>.log.rw`` and collects its index entries."""

    def __init__(self, fs: FileSystem, directory: str, first: int, interval: int) -> None:
        self.fs = fs
        self.directory = directory
        self.first = first
        self.interval = interval
        self.segments: list[Segment] = []
        self.path = filenames.rewrite_name(segment_path(directory, first))
        self.fd = -1  # created at the first write: a group left alone never makes a file
        self.created = False
        self.pending: list[bytes | np.ndarray] = [new_segment_bytes()]
        self.pending_bytes = HEADER_SIZE
        self.size = HEADER_SIZE
        self.entries: list[tuple[int, int]] = []
        self.last_entry = -1
        self.changed = False
        self.installing = False  # from here on, the swap protocol owns the files
        self.before_write: Callable[[], None] | None = None  # called before the first write
        self.written = 0  # bytes written to the file so far
        self.hinted = 0  # bytes whose writeback was started (see _start_writeback)

    def add(self, base_offset: int, *parts: bytes | np.ndarray) -> int:
        """Append one batch (its bytes, possibly in parts); returns its size."""
        if self.last_entry < 0 or self.size - self.last_entry >= self.interval:
            self.entries.append((base_offset, self.size))
            self.last_entry = self.size
        size = 0
        for part in parts:
            self.pending.append(part)
            size += len(part)
        self.pending_bytes += size
        self.size += size
        if self.pending_bytes >= WRITE_CHUNK:
            self._flush()
        return size

    def _flush(self) -> None:
        if self.before_write is not None:
            self.before_write()
            self.before_write = None
        if self.pending:
            if not self.created:
                self.fd = self.fs.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                self.created = True
            self.fs.write(self.fd, b"".join(self.pending))
            self.written += self.pending_bytes
            self.pending = []
            self.pending_bytes = 0
            if self.written - self.hinted >= WRITEBACK_CHUNK:
                _start_writeback(self.fd, self.hinted, self.written - self.hinted)
                self.hinted = self.written

    def finish(self) -> None:
        self._flush()
        self.fs.close(self.fd)
        self.fd = -1
        write_index(self.fs, self.directory, self.first, self.entries, temp=True)

    def discard(self) -> None:
        if self.fd >= 0:
            self.fs.close(self.fd)
            self.fd = -1
        if not self.created:
            return
        for path in (self.path, filenames.rewrite_name(index_path(self.directory, self.first))):
            try:
                self.fs.remove(path)
            except FileNotFoundError:
                pass


__all__ = ["GroupWriter"]
