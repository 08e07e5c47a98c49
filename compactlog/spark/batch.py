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
dirty head ``[p, end)`` may hold many versions, so planning reads the head once and builds
an exact map from key digest to the key's latest offset in the head (24 bytes per key,
shipped to every task). A task then keeps a record iff it is not a tombstone and

* it lies in the head and its offset is its key's latest there, or
* it lies in the tail and its key does not appear in the head at all.

Each task decides alone, so no shuffle is needed; on a compacted log the head is small and
tail records need no digest at all.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from ..compaction.offset_map import OffsetMap, key_digests
from ..errors import ConfigError
from ..format import RecordBatch
from ..reader import iter_batches
from ..segment import list_segments
from ..snapshot import is_snapshot, read_manifest, take_snapshot
from ..state_files import read_cleaner_state
from .arrow import CHUNK_BYTES, CHUNK_RECORDS, Columns, concat_batches
from .options import ReadOptions
from .ranges import Partition, plan_partitions

IMPLICIT_SNAPSHOTS = ".snapshots"
IMPLICIT_PREFIX = "spark-"
UNLIMITED = 1 << 62


class InexactReadError(ConfigError):
    """``asOfOffset`` below the cleaner point: compaction may have removed that state."""


@dataclass(slots=True)
class ReadPlan:
    directory: str  # the snapshot (or, with snapshot=false, the live log) that tasks read
    source: str
    snapshot_end: int
    cleaner_point: int
    start: int
    end: int
    changelog: bool
    head_start: int  # latest mode: records at or after it are judged by ``head_map``
    head_map: OffsetMap | None
    keys: tuple[bytes, ...] | None
    partitions: list[Partition] = field(default_factory=list)
    head_keys: int = 0


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
        reusable = _reusable(root, path, end)
        if reusable is not None:
            return reusable
        dest = os.path.join(root, f"{IMPLICIT_PREFIX}{end:020d}-{now}-{os.getpid()}")
        snapshot = take_snapshot(log, dest)
        return dest, snapshot.end_offset, snapshot.cleaner_point
    finally:
        log.close()


def _reusable(root: str, source: str, end: int) -> tuple[str, int, int] | None:
    for name in sorted(os.listdir(root), reverse=True):
        if not name.startswith(f"{IMPLICIT_PREFIX}{end:020d}-") or name.endswith(".partial"):
            continue
        directory = os.path.join(root, name)
        try:
            manifest = read_manifest(directory)
        except Exception:
            continue
        if manifest.source == source and manifest.end_offset == end:
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
    """Resolve the snapshot, the offset range, the head map and the partitions."""
    directory, snapshot_end, cleaner_point = resolve_snapshot(options)
    bases = list_segments(directory)
    from ..state_files import read_meta

    log_start = max(read_meta(directory).log_start_offset, bases[0] if bases else 0)
    start = max(log_start, options.start_offset or 0)
    end = snapshot_end
    for limit in (options.end_offset, options.as_of):
        if limit is not None:
            end = min(end, limit)
    end = max(end, start)
    if (
        not options.changelog
        and options.as_of is not None
        and options.as_of < min(cleaner_point, snapshot_end)
        and not options.allow_inexact
    ):
        raise InexactReadError(
            f"asOfOffset={options.as_of} is below the cleaner point {cleaner_point}: "
            f"compaction may have removed records of that state. The lowest offset with an "
            f"exact state is {cleaner_point}; set allowInexact=true to read anyway (Kafka's "
            "rule: every key at least its latest record not rewritten since)"
        )
    head_start = max(start, min(cleaner_point, end))
    head_map = None
    head_keys = 0
    if not options.changelog and head_start < end:
        head_map = build_head_map(directory, head_start, end)
        head_keys = len(head_map)
    plan = ReadPlan(
        directory=directory,
        source=os.path.abspath(options.path),
        snapshot_end=snapshot_end,
        cleaner_point=cleaner_point,
        start=start,
        end=end,
        changelog=options.changelog,
        head_start=head_start,
        head_map=head_map if head_keys else None,
        keys=options.keys,
        head_keys=head_keys,
    )
    plan.partitions = plan_partitions(directory, start, end, options.num_partitions)
    return plan


def build_head_map(directory: str, start: int, end: int) -> OffsetMap:
    """Latest offset of every key among the keyed records of ``[start, end)``."""
    head = OffsetMap(UNLIMITED)
    for batch in iter_batches(directory, start, end):
        has_key = batch.key_lengths >= 0
        hi, lo = key_digests(batch.keys_blob, batch.key_lengths)
        offsets = batch.offsets
        if not bool(has_key.all()):
            hi, lo, offsets = hi[has_key], lo[has_key], offsets[has_key]
        head.put(hi, lo, offsets)
    head.flush()
    return head


# -- reading one partition ------------------------------------------------------------


def _chunks(directory: str, start: int, end: int) -> Iterator[Columns]:
    """The partition's records as :class:`Columns` of about :data:`CHUNK_RECORDS`."""
    pending: list[RecordBatch] = []
    records = size = 0
    for batch in iter_batches(directory, start, end):
        pending.append(batch)
        records += len(batch)
        size += len(batch.keys_blob) + len(batch.values_blob)
        if records >= CHUNK_RECORDS or size >= CHUNK_BYTES:
            yield concat_batches(pending)
            pending, records, size = [], 0, 0
    if pending:
        yield concat_batches(pending)


def keep_mask(plan: ReadPlan, columns: Columns) -> np.ndarray | None:
    """Which records of ``columns`` the plan returns (``None``: all of them)."""
    keep: np.ndarray | None = None
    digests = None
    if not plan.changelog:
        keep = (columns.value_lengths >= 0) & (columns.key_lengths >= 0)
        if plan.head_map is not None:
            digests = key_digests(columns.keys_blob, columns.key_lengths)
            latest = plan.head_map.get(*digests)
            in_head = columns.offsets >= plan.head_start
            keep &= np.where(in_head, latest == columns.offsets, latest < 0)
    if plan.keys is not None:
        keep = _key_filter(plan.keys, columns, digests) & (True if keep is None else keep)
    if keep is not None and bool(keep.all()):
        return None
    return keep


def _key_filter(
    keys: tuple[bytes, ...], columns: Columns, digests: tuple[np.ndarray, np.ndarray] | None
) -> np.ndarray:
    if not keys:
        return np.zeros(len(columns), dtype=bool)
    wanted = np.fromiter(map(len, keys), dtype=np.int32, count=len(keys))
    w_hi, w_lo = key_digests(b"".join(keys), wanted)
    hi, lo = digests if digests is not None else key_digests(columns.keys_blob, columns.key_lengths)
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
    for columns in _chunks(plan.directory, partition.start, partition.end):
        keep = keep_mask(plan, columns)
        if keep is not None and not bool(keep.any()):
            continue
        yield columns, keep


__all__ = [
    "InexactReadError",
    "Partition",
    "ReadPlan",
    "build_head_map",
    "keep_mask",
    "plan_partitions",
    "plan_read",
    "read_partition",
    "resolve_snapshot",
]
