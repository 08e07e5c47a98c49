"""Retention: removing whole closed segments (Kafka's ``delete``, JLog's ``consumed``).

Crash protocol of :func:`delete_segments` (caller holds the writers' and the cleaner's lock):

1. Write ``meta`` with the new log start offset (atomic). Death here: segments below the log
   start remain; the next open or retention pass removes them.
2. Remove each segment and its index, oldest first.
3. fsync the directory.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..config import LogConfig
from . import filenames
from .fsio import FileSystem
from .segment import (
    HEADER_SIZE,
    TimestampCache,
    index_path,
    list_segments,
    max_timestamp,
    segment_path,
)


@dataclass
class RetentionResult:
    segments_deleted: list[int] = field(default_factory=list)
    bytes_deleted: int = 0
    log_start_offset: int = 0
    reason: str = ""


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    base: int
    size: int
    next_base: int  # base of the following segment: every offset here is below it
    max_timestamp: int | None


def closed_segments(directory: str, timestamp_cache: TimestampCache) -> list[SegmentInfo]:
    """Every segment but the active (newest) one, with its largest record timestamp."""
    bases = list_segments(directory)
    infos = []
    for base, next_base in itertools.pairwise(bases):
        size = os.path.getsize(segment_path(directory, base))
        largest = max_timestamp(directory, base, timestamp_cache)
        infos.append(SegmentInfo(base, size, next_base, largest))
    return infos


def select_for_deletion(
    config: LogConfig,
    segments: list[SegmentInfo],
    total_bytes: int,
    now_ms: int,
    subscribers: Mapping[str, int],
) -> tuple[list[SegmentInfo], str]:
    """Which closed segments retention removes now (always a prefix of the log)."""
    chosen: list[SegmentInfo] = []
    if config.deletes_by_retention:
        remaining = total_bytes
        for info in segments:
            expired = (
                config.retention_ms is not None
                and info.max_timestamp is not None
                and now_ms - info.max_timestamp > config.retention_ms
            )
            oversized = (
                config.retention_bytes is not None
                and remaining - info.size >= config.retention_bytes
            )
            empty = info.max_timestamp is None and info.size <= HEADER_SIZE
            if not (expired or oversized or empty):
                break
            chosen.append(info)
            remaining -= info.size
        return chosen, "retention_ms/retention_bytes"
    if config.deletes_when_consumed:
        if not subscribers:
            return [], "no durable subscriber: consumed retention deletes nothing"
        slowest = min(subscribers.values())
        for info in segments:
            if info.next_base > slowest:
                break
            chosen.append(info)
        return chosen, f"every durable subscriber has committed past offset {slowest}"
    return [], f"cleanup_policy={config.cleanup_policy!r} deletes no segments"


def delete_segments(
    fs: FileSystem, directory: str, doomed: list[SegmentInfo], write_start: object
) -> int:
    """Steps 2 and 3 of the protocol (step 1 is ``write_start``, a callable)."""
    if not doomed:
        return 0
    write_start(doomed[-1].next_base)  # type: ignore[operator]
    removed = 0
    for info in doomed:
        for path in (segment_path(directory, info.base), index_path(directory, info.base)):
            try:
                fs.remove(path)
            except FileNotFoundError:
                continue
        removed += info.size
    fs.fsync_dir(directory)
    return removed


def remove_below_start(fs: FileSystem, directory: str, log_start: int) -> list[int]:
    """Finish step 2 after a crash: drop segments wholly below the log start offset."""
    bases = list_segments(directory)
    removed = []
    for base, next_base in itertools.pairwise(bases):
        if next_base <= log_start:
            for name in (filenames.segment_name(base), filenames.index_name(base)):
                try:
                    fs.remove(os.path.join(directory, name))
                except FileNotFoundError:
                    pass
            removed.append(base)
    if removed:
        fs.fsync_dir(directory)
    return removed
