"""The end offset of a log as a reader may state it: the one rule of every reader view
(docs/format.md, section 10.2).

While a live writer stands behind the head in ``.lock`` (or the log was closed cleanly
with it), the head's end offset is the truth (``head.read_log_head``). Otherwise the head
is a hint that was never synced, and may be older than the data (unsynced data lost
without a reboot) or newer (records lost with it): the end is where the next writer's
recovery will start new offsets, past the valid data of the newest segment, the hint's
end offset and every durable subscriber checkpoint (``recovery`` passes 5 and 7). So a
view never shows less than a writable open would recover, and never an offset that one
would hand out again.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from ..storage.durable import check_newest_present
from ..storage.head import closed_cleanly, read_log_head
from ..storage.segment import HEADER_SIZE, SegmentReader, list_segments, segment_path
from ..storage.state_files import list_checkpoints

# (directory, base, inode, size, mtime) -> the newest segment's valid data end offset:
# a view without a live writer asks for its end offset again and again, the file does
# not change meanwhile (no writer), and its scan reads the whole newest segment
_DATA_ENDS: dict[tuple[str, int, int, int, int], int] = {}
_LOCK = threading.Lock()
_KEEP = 1024  # (logs: the cleaner service asks about every log it watches)


def view_end_offset(
    directory: str, start_offset: Callable[[], int], *, writer_end: int | None = None
) -> int:
    """The end offset of the log in ``directory`` as any reader may state it (the module
    docstring); ``start_offset()`` gives the log's start offset (the end of an empty log;
    asked only without a trusted head), ``writer_end`` is the end offset of the caller's
    own writer, if it has one (the truth while no head is readable, during its open-time
    recovery)."""
    head = read_log_head(directory, present=writer_end is not None)
    if head is not None:
        return head.end_offset
    if writer_end is not None:
        return writer_end
    stale = read_log_head(directory, any_boot=True)
    if stale is not None and closed_cleanly(directory, stale):
        return stale.end_offset  # (closed, then rebooted: the head is a fact, no scan)
    bases = list_segments(directory)
    check_newest_present(directory, bases)
    last = max(start_offset(), bases[-1] if bases else 0)
    if bases:
        last = max(last, _data_end(directory, bases[-1]))
    return max([last, stale.end_offset if stale else 0, *list_checkpoints(directory).values()])


def _data_end(directory: str, base: int) -> int:
    """The offset after the last valid batch of the newest segment ``base`` (``base`` when
    it holds none); raises as every reader does on damage below the durable point."""
    try:
        stat = os.stat(segment_path(directory, base))
    except FileNotFoundError:
        return base
    key = (directory, base, stat.st_ino, stat.st_size, stat.st_mtime_ns)
    with _LOCK:
        known = _DATA_ENDS.get(key)
    if known is not None:
        return known
    end = base
    with SegmentReader(directory, base, last_segment=True) as reader:
        for _pos, header in reader.headers(HEADER_SIZE):  # (CRCs checked, nothing decoded)
            end = max(end, header.next_offset)
    with _LOCK:
        if len(_DATA_ENDS) >= _KEEP:
            _DATA_ENDS.clear()
        _DATA_ENDS[key] = end
    return end


__all__ = ["view_end_offset"]
