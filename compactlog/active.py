"""The active segment: the one appends go to, as this process's writer last saw it."""

from __future__ import annotations

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
    extend past ``size`` with such room (cut off by :meth:`SegmentWriter._cut_reserved`).
    """

    __slots__ = (
        "base",
        "fd",
        "first_ts",
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

    def __init__(self, base: int, fd: int, size: int, index_fd: int, index_size: int) -> None:
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
