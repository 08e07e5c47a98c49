"""The active segment: the one appends go to, as this process's writer last saw it."""

from __future__ import annotations

import os

from ..encoding.format import INDEX_ENTRY
from . import segment_chain
from .fsio import FileSystem
from .segment import HEADER_SIZE
from .tailmap import TailWindow


class ActiveSegment:
    """The segment appends go to, as this process last saw it.

    ``plain_stop`` and ``plain_deadline`` are the checkpoint of the plain append path
    (``single.py``): a record that would end past byte ``plain_stop`` or is stamped at or
    after ``plain_deadline`` ms goes through :meth:`SegmentWriter._plain_checkpoint` (free
    space, roll, the next mapped window) first; any other skips all three. A new segment
    starts with a checkpoint that every record crosses, so a roll or a refresh needs
    nothing reset. ``window`` is the mapped, reserved room past the data that an exclusive
    writer stores plain records into (``tailmap.py``), ``reserved`` whether the file may
    extend past ``size`` with such room (cut off by :meth:`cut_reserved`).
    """

    __slots__ = (
        "base",
        "fd",
        "first_ts",
        "fs",
        "index_fd",
        "index_size",
        "last_index_pos",
        "plain_deadline",
        "plain_from",
        "plain_stop",
        "reserved",
        "size",
        "window",
    )

    def __init__(
        self, fs: FileSystem, base: int, fd: int, size: int, index_fd: int, index_size: int
    ) -> None:
        self.fs = fs
        self.base = base
        self.fd = fd
        self.size = size
        self.first_ts: int | None = None
        self.index_fd = index_fd
        self.index_size = index_size
        self.last_index_pos = HEADER_SIZE
        self.plain_stop = 0
        self.plain_deadline = -1
        self.plain_from = size  # where the plain path's unchecked bytes start
        self.window: TailWindow | None = None
        self.reserved = False

    def add_index_entry(self, base_offset: int, position: int) -> None:
        """Index the batch at ``position`` holding ``base_offset`` (caller holds both
        locks)."""
        try:
            self.fs.pwrite(
                self.index_fd,
                INDEX_ENTRY.pack(base_offset - self.base, position),
                self.index_size,
            )
            self.index_size += INDEX_ENTRY.size
            self.last_index_pos = position
        except OSError:
            pass  # the index is a cache; it is rebuilt when it disagrees

    def undo_partial_write(self, position: int) -> None:
        """Cut a write that failed part-way back off, at ``position`` (caller holds both
        locks)."""
        if position <= HEADER_SIZE:  # the segment holds no record: it has no age yet
            self.first_ts = None
            self.plain_deadline = -1
        # the truncation below takes any reserved room with it: a map of it must go first
        # (a store past the end of a file is a SIGBUS), and the next checkpoint maps anew
        self.drop_window()
        self.plain_stop = 0
        try:
            self.fs.truncate(self.fd, position)
            self.reserved = False
        except OSError:
            pass  # a torn tail is still cut by the next writer's validation

    # -- the mapped tail of an exclusive writer (tailmap.py) -----------------------------
    def map_window(self, need_end: int, limit: int) -> TailWindow:
        """Reserve and map the room from the data's end to at least ``need_end`` (and on,
        not past ``limit`` unless ``need_end`` is). Raises ``OSError`` where the file
        system refused (no window then)."""
        self.drop_window()
        self.reserved = True  # (a failed reservation may still have grown the file)
        self.window = TailWindow(self.fd, self.size, need_end, limit)
        return self.window

    def drop_window(self) -> None:
        window = self.window
        if window is not None:
            self.window = None
            window.close()

    def cut_reserved(self, link_to: int | None = None) -> None:
        """Cut the reserved room off (caller holds both locks): before a roll publishes
        the next segment, so a closed segment holds data only, and before a clean close,
        whose marker vouches that the file ends where the head says. A roll passes the
        next segment's base as ``link_to``: the header's link (``segment_chain.py``)."""
        self.drop_window()
        if self.reserved:
            self.fs.truncate(self.fd, self.size)
            self.reserved = False
        if link_to is not None:
            segment_chain.stamp(self.fs, self.fd, self.base, link_to)

    def close(self) -> None:
        """Stop appending here: unmap, close the segment and its index."""
        self.drop_window()
        os.close(self.index_fd)
        os.close(self.fd)
