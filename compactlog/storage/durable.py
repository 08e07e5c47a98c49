"""The durable point of a log: up to where its bytes are known to be on disk, and so where
damage stops being a torn tail (docs/format.md, sections 7 and 10).

Writers store the *sync point* in ``.lock`` (``head.py``) after every sync and make it
durable at ``flush()``, at ``close()`` (after the final sync: the whole active segment),
after a roll and at most a second or a MiB behind otherwise. On disk it is never newer
than the truth. So below it (and in every segment before the one it names) the bytes are
what a writer made durable: a batch there that fails its CRC, or bytes missing there, are
damage (:class:`CorruptLogError`, :class:`MissingSegmentError`), whatever follows; only
past it may a power loss have left a torn tail for recovery to cut.

A ``.lock`` without a sync point (all zeros: logs written before it existed, or a torn
store) knows nothing durable: the whole newest segment is judged as a possible torn tail,
the rule of those versions. A directory without ``.lock`` was never opened by a writer (a
snapshot, a restore): no power loss to allow for, and the classical rule (a tail is torn
when nothing valid follows it) applies.
"""

from __future__ import annotations

import os

from ..errors import CorruptLogError, MissingSegmentError
from . import filenames
from .head import read_sync_point

WHOLE = 1 << 62  # :func:`unsynced_from` for a segment that is durable whole
HEADER_BYTES = 16  # a segment's file header (format.FILE_HEADER)


def unsynced_from(directory: str, base: int) -> int | None:
    """The byte of the newest segment ``base`` from which nothing is known to be on disk:
    the sync point in ``.lock``; 0 when it holds none; :data:`WHOLE` for a segment before
    the one the sync point names (it was synced whole before the next one was made);
    ``None`` when there is no ``.lock`` (which every writer creates before anything else:
    no writer, no power loss to allow for, the classical torn-tail rule)."""
    if not os.path.exists(os.path.join(directory, filenames.WRITER_LOCK)):
        return None
    point = read_sync_point(directory)
    if point is None:
        return 0
    end = point.durable_end(base)
    return WHOLE if end is None else end


def durable_size(directory: str, base: int) -> int:
    """How many bytes of the newest segment ``base`` are known to be on disk, when the sync
    point names it (0 otherwise: nothing known, or a whole older segment whose size no one
    recorded)."""
    point = read_sync_point(directory)
    return point.size if point is not None and point.base == base else 0


def check_durable_length(path: str, size: int, durable: int) -> None:
    """Raise :class:`CorruptLogError` when the newest segment at ``path`` ends (``size``)
    before its durable point ``durable``: bytes a writer made durable are missing (a file
    cut by hand or by a failing disk), never a torn tail."""
    if HEADER_BYTES <= size < durable or 0 < size < min(durable, HEADER_BYTES):
        raise CorruptLogError(
            f"the segment ends at byte {size}, but {durable} bytes of it were made durable "
            "(by a sync or a clean close): data below the durable point is missing; "
            "`compactlog repair` keeps every valid batch",
            path=path,
            position=size,
        )


def missing_newest(directory: str, bases: list[int]) -> str | None:
    """The name of the segment the sync point names when records in it were made durable
    and it is newer than every segment in ``bases`` (a listing of ``directory``) and gone:
    its records would silently be missing. ``None`` when there is no such segment."""
    point = read_sync_point(directory)
    if point is None or point.size <= HEADER_BYTES or (bases and point.base <= bases[-1]):
        return None
    name = filenames.segment_name(point.base)
    if os.path.exists(os.path.join(directory, name)):
        return None  # (the listing is older than a roll)
    return name


def check_newest_present(directory: str, bases: list[int]) -> None:
    """Raise :class:`MissingSegmentError` for :func:`missing_newest`."""
    name = missing_newest(directory, bases)
    if name is not None:
        raise MissingSegmentError(
            f"segment {name} is missing, and records in it had been made durable (synced "
            "or closed cleanly); `compactlog repair` accepts the loss",
            path=directory,
            position=0,
        )


__all__ = [
    "WHOLE",
    "check_durable_length",
    "check_newest_present",
    "durable_size",
    "missing_newest",
    "unsynced_from",
]
