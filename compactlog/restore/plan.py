"""Planning a batch read: which snapshot, which offsets, which partitions, which records.

Planning runs once per query, in Spark's planning worker (:func:`plan_read`); reading runs
in every task (:func:`read_partition`). Neither imports pyspark, so both are tested alone.

Consistency. A snapshot directory is read as it is. A live log is first snapshotted at its
end offset (an *implicit snapshot* under ``<log>/.snapshots/``, hard links, reused while
the log's end offset is unchanged, removed after ``snapshotRetentionMinutes``), so every
task reads the same files whatever the writers and the cleaner do meanwhile.

Latest per key across partitions. Partitions are offset ranges following groups of
segments, so a key's versions may sit in several of them. Below the cleaner point ``p``
(the clean tail) every key appears at most once: that is what a cleaning pass leaves. The
dirty section ``[p, end)`` may hold many versions, so planning reads it once and builds an
exact map from key digest to the key's latest offset there (24 bytes per key, shipped to
every task). A task then keeps a record iff it is not a tombstone and

* it lies in the dirty section and its offset is its key's latest there, or
* it lies in the tail and its key does not appear in the dirty section at all.

Each task decides alone, so no shuffle is needed. Tasks query the map through a
:class:`~compactlog.engine.dirtyindex.DirtyIndex` (``Log.latest`` uses it too): dirty-section
records are judged by a bitmap of the dirty section's latest offsets (no digest at all), tail
records by their digest, first against a small bit filter of the dirty section's digests (most
tail keys are not in the dirty section) and exactly only where the filter says maybe.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..arrow.convert import chunk_columns
from ..encoding.batch_decode import Columns
from ..encoding.offset_map import key_digests
from ..engine.dirtyindex import DirtyIndex, build_dirty_map
from ..engine.latest import check_exact
from ..engine.reader import iter_batches
from ..engine.snapshot import PARTIAL_SUFFIX, is_snapshot, read_manifest, take_snapshot
from ..errors import InexactReadError
from ..storage.segment import list_segments
from ..storage.state_files import read_cleaner_state
from .options import ReadOptions
from .ranges import Partition, plan_partitions

IMPLICIT_SNAPSHOTS = ".snapshots"
IMPLICIT_PREFIX = "spark-"


@dataclass(slots=True)
class ReadPlan:
    directory: str  # the snapshot (or, with snapshot=false, the live log) that tasks read
    source: str
    snapshot_end: int
    cleaner_point: int
    start: int
    end: int
    changelog: bool
    dirty_start: int  # latest mode: records at or after it are judged by ``dirty``
    dirty: DirtyIndex | None
    keys: tuple[bytes, ...] | None
    partitions: list[Partition] = field(default_factory=list)
    dirty_keys: int = 0
    archive: Any = None  # an archive in object storage (archive_read.ArchiveRead): tasks fetch


# -- choosing what to read ------------------------------------------------------------


def resolve_snapshot(options: ReadOptions, now_ns: int | None = None) -> tuple[str, int, int]:
    """``(directory, end offset, cleaner point)`` of the state to read."""
    from ..log import open_log

    path = os.path.abspath(options.path)
    if is_snapshot(path):
        manifest = read_manifest(path)
        return path, manifest.end_offset, manifest.cleaner_point
    log = open_log(path, read_only=True, create=False)
    try:
        end = log.end_offset
        if not options.snapshot:
            point = read_cleaner_state(path).first_dirty_offset
            return path, end, min(point, end)
        root = os.path.abspath(options.snapshot_dir or os.path.join(path, IMPLICIT_SNAPSHOTS))
        os.makedirs(root, exist_ok=True)
        now = time.time_ns() if now_ns is None else now_ns
        _prune(root, now, options.snapshot_retention_minutes)
        point = min(read_cleaner_state(path).first_dirty_offset, end)
        reusable = _reusable(root, path, end, point, log.start_offset)
        if reusable is not None:
            return reusable
        dest = os.path.join(root, f"{IMPLICIT_PREFIX}{end:020d}-{now}-{os.getpid()}")
        snapshot = take_snapshot(log, dest)
        return dest, snapshot.end_offset, snapshot.cleaner_point
    finally:
        log.close()


def _reusable(
    root: str, source: str, end: int, cleaner_point: int, start: int
) -> tuple[str, int, int] | None:
    """An implicit snapshot of the log's state now: the same end offset, and the same
    cleaner point and log start, so that neither a cleaning pass (a snapshot from before it
    holds every superseded record: the same state, read many times slower, its segments
    kept on disk) nor retention (records the log no longer has) happened since."""
    for name in sorted(os.listdir(root), reverse=True):
        if not name.startswith(f"{IMPLICIT_PREFIX}{end:020d}-") or name.endswith(PARTIAL_SUFFIX):
            continue
        directory = os.path.join(root, name)
        try:
            manifest = read_manifest(directory)
        except Exception:
            continue
        if (
            manifest.source == source
            and manifest.end_offset == end
            and manifest.cleaner_point == cleaner_point
            and manifest.start_offset == start
        ):
            return directory, manifest.end_offset, manifest.cleaner_point
    return None


def _prune(root: str, now_ns: int, retention_minutes: int) -> None:
    """Remove implicit snapshots older than the retention (their names carry the time)."""
    limit = now_ns - retention_minutes * 60 * 1_000_000_000
    for name in os.listdir(root):
        if not name.startswith(IMPLICIT_PREFIX):
            continue
        parts = name.split("-")
        try:
            created = int(parts[2].split(".")[0])
        except (IndexError, ValueError):
            continue
        if created < limit:
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)


def plan_read(options: ReadOptions) -> ReadPlan:
    """Resolve the snapshot, the offset range, the dirty-section map and the partitions."""
    from .archive_read import is_archive_url

    if is_archive_url(options.path):
        return _plan_archive(options)
    directory, snapshot_end, cleaner_point = resolve_snapshot(options)
    bases = list_segments(directory)
    from ..storage.state_files import read_meta

    log_start = max(read_meta(directory).log_start_offset, bases[0] if bases else 0)
    start = max(log_start, options.start_offset or 0)
    end = snapshot_end
    for limit in (options.end_offset, options.as_of):
        if limit is not None:
            end = min(end, limit)
    end = max(end, start)
    if not options.changelog and options.as_of is not None:
        check_exact(
            options.as_of,
            cleaner_point,
            snapshot_end,
            allow_inexact=options.allow_inexact,
            names=("asOfOffset", "allowInexact=true"),
        )
    dirty_start = max(start, min(cleaner_point, end))
    dirty_map = None
    dirty_keys = 0
    if not options.changelog and dirty_start < end:
        dirty_map = build_dirty_map(directory, dirty_start, end)
        dirty_keys = len(dirty_map)
    dirty = (
        DirtyIndex(dirty_map, dirty_start, end) if dirty_map is not None and dirty_keys else None
    )
    plan = ReadPlan(
        directory=directory,
        source=os.path.abspath(options.path),
        snapshot_end=snapshot_end,
        cleaner_point=cleaner_point,
        start=start,
        end=end,
        changelog=options.changelog,
        dirty_start=dirty_start,
        dirty=dirty,
        keys=options.keys,
        dirty_keys=dirty_keys,
    )
    plan.partitions = plan_partitions(directory, start, end, options.num_partitions)
    return plan


def _plan_archive(options: ReadOptions) -> ReadPlan:
    """:func:`plan_read` for an archive URL (``archive_read.py``): the manifest is the
    snapshot; the dirty section is fetched here for its map, everything else by the tasks."""
    from .archive_read import choose, materialize, partitions

    read, manifest = choose(options)
    bases = [s.base for s in manifest.segments]
    start = max(manifest.start_offset, bases[0] if bases else 0, options.start_offset or 0)
    end = manifest.end_offset
    if options.end_offset is not None:
        end = min(end, options.end_offset)
    end = max(end, start)
    cleaner_point = min(manifest.cleaner_point, manifest.end_offset)
    dirty_start = max(start, min(cleaner_point, end))
    directory = materialize(read, dirty_start, end)
    dirty_map = None
    if not options.changelog and dirty_start < end:
        dirty_map = build_dirty_map(directory, dirty_start, end)
    dirty_keys = len(dirty_map) if dirty_map is not None else 0
    plan = ReadPlan(
        directory=directory,
        source=options.path,
        snapshot_end=manifest.end_offset,
        cleaner_point=cleaner_point,
        start=start,
        end=end,
        changelog=options.changelog,
        dirty_start=dirty_start,
        dirty=DirtyIndex(dirty_map, dirty_start, end) if dirty_keys else None,
        keys=options.keys,
        dirty_keys=dirty_keys,
        archive=read,
    )
    plan.partitions = partitions(read, start, end, options.num_partitions)
    return plan


# -- reading one partition ------------------------------------------------------------


def keep_mask(plan: ReadPlan, columns: Columns) -> np.ndarray | None:
    """Which records of ``columns`` the plan returns (``None``: all of them)."""
    keep: np.ndarray | None = None
    if not plan.changelog:
        keep = (columns.value_lengths >= 0) & (columns.key_lengths >= 0)
        if plan.dirty is not None:
            keep &= plan.dirty.latest_mask(columns)
    if plan.keys is not None:
        keep = _key_filter(plan.keys, columns) & (True if keep is None else keep)
    if keep is not None and bool(keep.all()):
        return None
    return keep


def _key_filter(keys: tuple[bytes, ...], columns: Columns) -> np.ndarray:
    if not keys:
        return np.zeros(len(columns), dtype=bool)
    wanted = np.fromiter(map(len, keys), dtype=np.int32, count=len(keys))
    w_hi, w_lo = key_digests(b"".join(keys), wanted)
    hi, lo = key_digests(columns.keys_blob, columns.key_lengths)
    match = np.isin(hi, w_hi) & np.isin(lo, w_lo) & (columns.key_lengths >= 0)
    # digests narrow it down; the bytes decide (a 128-bit collision never returns a wrong key)
    wanted_set = set(keys)
    ends = np.cumsum(np.maximum(columns.key_lengths, 0), dtype=np.int64)
    for i in np.flatnonzero(match).tolist():
        key = columns.keys_blob[ends[i] - columns.key_lengths[i] : ends[i]]
        if key not in wanted_set:
            match[i] = False
    return match


def read_partition(
    plan: ReadPlan, partition: Partition
) -> Iterator[tuple[Columns, np.ndarray | None]]:
    """The chunks of one partition with the mask of records to return."""
    directory = plan.directory
    if plan.archive is not None:  # this task fetches its own segments (no shared disk)
        from .archive_read import materialize

        directory = materialize(plan.archive, partition.start, partition.end)
    for columns in chunk_columns(iter_batches(directory, partition.start, partition.end)):
        keep = keep_mask(plan, columns)
        if keep is not None and not bool(keep.any()):
            continue
        yield columns, keep


__all__ = [
    "InexactReadError",
    "Partition",
    "ReadPlan",
    "build_dirty_map",
    "keep_mask",
    "plan_partitions",
    "plan_read",
    "read_partition",
    "resolve_snapshot",
]
