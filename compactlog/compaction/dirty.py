"""The dirty ratio: one definition, Kafka's cleanable ratio, for every figure that shows it.

The cleaner's selection (``cleaner.py``, step 1), the service's ranking and metrics, and
the CLI's ``meta``, ``stats`` and ``compact --if-due`` all call :func:`measure`, so they
agree at any moment. Over the closed segments (the active segment is the writers' and is
never cleaned):

- the cleaner point ``p`` is ``cleaner.checkpoint``'s first dirty offset, raised to the log
  start and the first segment, and kept at or below the active segment's base;
- the first uncleanable offset ``u`` is the active segment's base, or the base of the first
  segment past ``p`` holding a record younger than ``min_compaction_lag_ms``;
- clean bytes are the closed segments wholly below ``p``; dirty bytes are the closed
  segments from ``p`` up to ``u`` (whole segments, as Kafka counts them);
- ``ratio = dirty / (clean + dirty)``, 0 when both are 0.

The active segment and the segments held back by ``min_compaction_lag_ms`` are in neither
count; :class:`DirtyShare` reports their bytes apart so a display can state them.
``docs/compaction.md`` ("The dirty ratio") is the user-facing statement of this rule.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass

from ..storage.head import read_log_head
from ..storage.segment import (
    TimestampCache,
    bound_by_head,
    list_segments,
    max_timestamp,
    segment_path,
)
from ..storage.state_files import read_cleaner_state


@dataclass(frozen=True, slots=True)
class Segment:
    """A closed segment: its offsets ``[base, next_base)`` and its file size."""

    base: int
    next_base: int
    size: int


@dataclass(frozen=True, slots=True)
class DirtyShare:
    """The figures of :func:`measure` (bytes are segment file bytes)."""

    first_dirty_offset: int
    first_uncleanable_offset: int
    clean_bytes: int
    dirty_bytes: int
    lagging_bytes: int  # closed segments from u on (held back by min_compaction_lag_ms)
    active_bytes: int  # the active segment's data

    @property
    def ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0

    @property
    def has_dirty(self) -> bool:
        """Whether there is a dirty section to clean: closed segments in ``[p, u)``. (With
        ``p`` inside a segment held back by the lag, ``u == p``: its bytes count as dirty,
        but there is nothing to map.)"""
        return self.first_uncleanable_offset > self.first_dirty_offset and self.dirty_bytes > 0

    @property
    def total_bytes(self) -> int:
        return self.clean_bytes + self.dirty_bytes + self.lagging_bytes + self.active_bytes


def closed_segments(directory: str) -> tuple[list[Segment], int, int]:
    """The closed segments with their sizes, the active segment's base and its data bytes
    (``0, 0`` without any segment)."""
    bases = list_segments(directory)
    if not bases:
        return [], 0, 0
    closed = [
        Segment(base, nxt, os.path.getsize(segment_path(directory, base)))
        for base, nxt in itertools.pairwise(bases)
    ]
    active = bases[-1]
    try:
        active_size = os.path.getsize(segment_path(directory, active))
    except FileNotFoundError:  # rolled and cleaned away since the listing
        active_size = 0
    return closed, active, bound_by_head(active_size, active, read_log_head(directory))


def measure(
    directory: str,
    segments: list[Segment],
    active_base: int,
    *,
    cleaner_point: int,
    log_start: int,
    min_compaction_lag_ms: int,
    now: int,
    active_bytes: int = 0,
    timestamp_cache: TimestampCache | None = None,
) -> DirtyShare:
    """The rule of the module docstring over ``segments`` (closed, ascending). Reads batch
    headers only when ``min_compaction_lag_ms`` is set, and then only of dirty segments up
    to the first young one (``timestamp_cache`` keeps each segment's answer)."""
    if not segments:
        return DirtyShare(active_base, active_base, 0, 0, 0, active_bytes)
    first_dirty = max(cleaner_point, log_start, segments[0].base)
    first_dirty = min(first_dirty, active_base)
    uncleanable = active_base
    if min_compaction_lag_ms > 0:
        horizon = now - min_compaction_lag_ms
        for seg in segments:
            if seg.next_base <= first_dirty:
                continue
            largest = max_timestamp(directory, seg.base, timestamp_cache)
            if largest is not None and largest > horizon:
                uncleanable = seg.base
                break
    uncleanable = max(uncleanable, first_dirty)
    clean = dirty = lagging = 0
    for seg in segments:
        if seg.next_base <= first_dirty:
            clean += seg.size
        elif seg.base < uncleanable:
            dirty += seg.size
        else:
            lagging += seg.size
    return DirtyShare(first_dirty, uncleanable, clean, dirty, lagging, active_bytes)


def measure_log(
    directory: str,
    *,
    min_compaction_lag_ms: int,
    log_start: int,
    now: int,
    timestamp_cache: TimestampCache | None = None,
) -> DirtyShare:
    """:func:`measure` of the log at ``directory`` as it is on disk now."""
    segments, active_base, active_bytes = closed_segments(directory)
    return measure(
        directory,
        segments,
        active_base,
        cleaner_point=read_cleaner_state(directory).first_dirty_offset,
        log_start=log_start,
        min_compaction_lag_ms=min_compaction_lag_ms,
        now=now,
        active_bytes=active_bytes,
        timestamp_cache=timestamp_cache,
    )
