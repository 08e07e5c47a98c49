"""The mapped tail of an ``exclusive=True`` writer's active segment.

Why: a ``pwrite`` per record costs more than everything else a single append does in
Python (docs/benchmarks.md, issue 12). A writer that is the log's only writer for its whole
lifetime can instead reserve the next stretch of the active segment with
``posix_fallocate``, map it shared and store each record into the map: no system call per
record, one per :data:`WINDOW_BYTES`. The stores land in the page cache, where readers of
any process see them (``read``, ``pread`` and maps share it) and where a ``kill -9``
cannot undo them; ``fdatasync`` of the segment writes them out like written pages.

What it changes on disk: while such a writer is live, and after it was killed, the active
segment file may end with up to a window of zero bytes past the data, the preallocated
room. The head in ``.lock`` (``active_size``) says where the data ends, and every reader
of the newest segment stops there (``segment.SegmentReader``); a reader that cannot read
the head finds the zeros where a batch should start and ends the read as at any
incomplete tail. The writer cuts the room off (``ftruncate``) before a roll publishes the
next segment and before a clean close, so closed segments and cleanly closed logs hold
data only; the next writer after a crash truncates it as it truncates a torn tail, without
counting zeros as torn (:func:`only_zeros`). See docs/format.md, "the preallocated tail".

Why reserving and not only growing the file: a store into a map of a sparse stretch that
the file system cannot back (a full disk) kills the process with ``SIGBUS``; reserved
blocks cannot run out, and a full disk shows as ``ENOSPC`` from ``posix_fallocate``, before
any record is stored, where the writer falls back to ``pwrite`` and its refusals.
"""

from __future__ import annotations

import errno
import mmap
import os

WINDOW_BYTES = 1 << 20  # reserved and mapped at a time (one posix_fallocate and mmap each)
AVAILABLE = hasattr(os, "posix_fallocate")  # (not on every platform: pwrite there)
_GRANULE = mmap.ALLOCATIONGRANULARITY

# posix_fallocate failures that mean "not now" (the next window may fit) rather than
# "never on this file system"
RETRYABLE = (errno.ENOSPC, errno.EDQUOT, errno.EINTR, errno.EAGAIN)


class TailWindow:
    """A shared, writable map of the file bytes ``[start, end)``, all reserved on disk."""

    __slots__ = ("end", "map", "start")

    def __init__(self, fd: int, position: int, need_end: int, limit: int) -> None:
        """Reserve and map from ``position`` (rounded down to the map granularity) to
        ``need_end`` and on for a whole window, but not past ``limit`` (the segment's size
        limit) unless ``need_end`` is. Raises ``OSError`` (nothing mapped) when the file
        system cannot reserve the room."""
        start = position - position % _GRANULE
        end = max(need_end, min(start + WINDOW_BYTES, limit))
        os.posix_fallocate(fd, start, end - start)  # also extends the file to ``end``
        self.map = mmap.mmap(fd, end - start, offset=start)
        self.start = start
        self.end = end

    def close(self) -> None:
        self.map.close()


def only_zeros(data: bytes | memoryview) -> bool:
    """Whether ``data`` is all zero bytes: a preallocated tail, not a torn write (a torn
    batch starts with its non-zero length and magic)."""
    return bytes(data).count(0) == len(data)
