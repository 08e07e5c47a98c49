"""A subscriber's cursor: the segment holding its position, read through the one
:class:`~compactlog.storage.segment.SegmentReader`, and the descriptors a subscriber holds.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

from ..encoding.batch_decode import RecordBatch
from ..storage.segment import SegmentReader
from .watch import HeadWatcher


class Cursor:
    """Where a subscriber reads: the segment holding its position, open as a
    :class:`SegmentReader` (the one reader of segments, shared with ``read()``), the walk
    of its batches in progress (kept between polls: what one read fetched is parsed once)
    and the rest of a decoded batch not handed out yet (decoded once, however many polls
    take it)."""

    __slots__ = ("batches", "ino", "pending", "pos", "reader")

    def __init__(self, reader: SegmentReader, pos: int) -> None:
        self.reader = reader
        self.ino = os.fstat(reader.fd).st_ino
        self.pos = pos  # the byte after the last batch taken from the walk
        self.batches: Iterator[RecordBatch] | None = None
        self.pending: RecordBatch | None = None

    @property
    def base(self) -> int:
        return self.reader.base

    def next(self) -> RecordBatch | None:
        """The next batch (a run of small ones comes as one): what is pending, else the
        walk's next; ``None`` where the readable data ends for now (a new walk starts
        there next time, seeing what was written since)."""
        if self.pending is not None:
            batch, self.pending = self.pending, None
            return batch
        if self.batches is None:
            self.batches = self.reader.runs(self.pos)
        try:
            batch = next(self.batches, None)
        except BaseException:
            self.batches = None  # (a walk that raised is over: the next starts anew)
            raise
        if batch is None:
            self.batches = None
            return None
        self.pos = batch.position + batch.size_bytes
        return batch

    def at_end(self) -> bool:
        """Whether the walk reached the end of the file (not a torn tail before it)."""
        return self.pending is None and self.pos >= os.fstat(self.reader.fd).st_size

    def close(self) -> None:
        if self.batches is not None:
            self.batches.close()
            self.batches = None
        self.pending = None
        self.reader.close()


class Descriptors:
    """The file descriptors a subscriber holds; closed by :meth:`Subscriber.close` or,
    if the user forgets, when the subscriber is garbage collected."""

    def __init__(self) -> None:
        self.lock_fd = -1
        self.name_lock_fd = -1  # durable names: the flock making this the only consumer
        self.cursor: Cursor | None = None
        self.watcher: HeadWatcher | None = None

    def drop_cursor(self) -> None:
        if self.cursor is not None:
            self.cursor.close()
            self.cursor = None

    def close(self) -> None:
        self.drop_cursor()
        if self.watcher is not None:
            self.watcher.close()
            self.watcher = None
        if self.lock_fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1
        if self.name_lock_fd >= 0:  # last: the name is free once nothing else is open
            os.close(self.name_lock_fd)
            self.name_lock_fd = -1
