"""How far durable subscribers are behind: in records, bytes and segments (JLog's
``jlogctl subscriber``, ``compactlog subscribers list``).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import MissingSegmentError
from ..storage.head import read_log_head
from ..storage.segment import HEADER_SIZE, SegmentReader, list_segments, segment_data_size
from ..storage.tail import scan_start
from .subscriber_names import log_start

if TYPE_CHECKING:
    from .logview import LogView


@dataclass(frozen=True, slots=True)
class SubscriberLag:
    """One durable subscriber, as an operator sees it (JLog's ``jlogctl subscriber``)."""

    name: str
    committed: int
    lag_records: int  # offsets from the committed position to the end (an upper bound)
    lag_bytes: int  # segment bytes at or after the committed position
    lag_segments: int  # segments holding unread bytes
    pending_segments: int  # closed segments not fully consumed: consumed retention keeps them
    below_log_start: bool  # it will skip to the log start on its next poll


def backlog(log: LogView, offset: int) -> tuple[int, int]:
    """``(bytes, segments)`` of segment data holding offsets at or after ``offset``."""
    directory = log.directory
    bases = list_segments(directory)
    if not bases:
        return 0, 0
    i = max(bisect.bisect_right(bases, offset) - 1, 0)
    total = 0
    segments = 0
    head = read_log_head(directory)
    for j in range(i, len(bases)):
        base = bases[j]
        try:
            size = segment_data_size(directory, base, head)
            skip = _byte_position(directory, base, offset, last=j == len(bases) - 1)
        except (FileNotFoundError, MissingSegmentError):
            continue  # removed meanwhile
        unread = max(size - skip, 0)
        if unread:
            total += unread
            segments += 1
    return total, segments


def _byte_position(directory: str, base: int, offset: int, *, last: bool) -> int:
    """Byte position in segment ``base`` of the first batch holding an offset >= ``offset``."""
    if offset <= base:
        return HEADER_SIZE
    with SegmentReader(directory, base, last_segment=last) as reader:
        end = reader.readable_size()
        for position, header in reader.headers(scan_start(reader.fd, directory, base, offset)):
            if header.next_offset > offset:
                return position
        return end


def lag_report(log: LogView) -> list[SubscriberLag]:
    """Every durable subscriber with its lag in records, bytes and segments, slowest first.

    ``pending_segments`` counts the closed segments it has not consumed entirely: under
    ``cleanup_policy="consumed"`` the slowest subscriber's count is what stays on disk.
    """
    bases = list_segments(log.directory)
    closed_next = bases[1:]  # a closed segment's offsets are all below the next base
    start = log_start(log.directory)
    end = log.end_offset
    report = []
    for name, committed in log.subscribers().items():
        lag_bytes, lag_segments = backlog(log, committed)
        report.append(
            SubscriberLag(
                name=name,
                committed=committed,
                lag_records=max(end - max(committed, start), 0),
                lag_bytes=lag_bytes,
                lag_segments=lag_segments,
                pending_segments=sum(1 for nxt in closed_next if nxt > committed),
                below_log_start=committed < start,
            )
        )
    report.sort(key=lambda r: (r.committed, r.name))
    return report
