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

Each task decides alone, so no shuffle is needed. Tasks query the map through a
:class:`HeadIndex`: head records are judged by a bitmap of the head's latest offsets (no
digest at all), tail records by their digest, first against a small bit filter of the head's
digests (most tail keys are not in the head) and exactly only where the filter says maybe.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from ..arrow.convert import Columns, chunk_columns
from ..compaction.offset_map import OffsetMap, key_digests
from ..errors import ConfigError
from ..reader import iter_batches
from ..segment import list_segments
from ..snapshot import is_snapshot, read_manifest, take_snapshot
from ..state_files import read_cleaner_state
from .options import ReadOptions
from .ranges import Partition, plan_partitions

IMPLICIT_SNAPSHOTS = ".snapshots"
IMPLICIT_PREFIX = "spark-"
UNLIMITED = 1 << 62
_BIT = np.array([1 << i for i in range(8)], dtype=np.uint8)  # _BIT[i]: bit i of a byte
_THREE = np.uint64(3)
_SEVEN = np.uint64(7)


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
    head_start: int  # latest mode: records at or after it are judged by ``head``
    head: HeadIndex | None
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
        if not name.startswith(f"{IMPLICIT_PREFIX}{end:020d}-") or name.endswith(".partial"):
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
    head = HeadIndex(head_map, head_start, end) if head_map is not None and head_keys else None
    plan = ReadPlan(
        directory=directory,
        source=os.path.abspath(options.path),
        snapshot_end=snapshot_end,
        cleaner_point=cleaner_point,
        start=start,
        end=end,
        changelog=options.changelog,
        head_start=head_start,
        head=head,
        keys=options.keys,
        head_keys=head_keys,
    )
    plan.partitions = plan_partitions(directory, start, end, options.num_partitions)
    return plan


class HeadIndex:
    """The dirty head's latest offset per key, shaped for the questions tasks ask.

    ``latest_mask`` answers, for each keyed record of a chunk, "is this the record the
    latest state keeps as far as the head is concerned": a head record (offset at or after
    ``start``) iff it is its key's latest offset, a tail record iff its key has no record in
    the head. Both answers are exact; the two structures below only make them cheap:

    * ``latest bits``: one bit per head offset, set at each key's latest
      (:meth:`OffsetMap.latest_bits`), so head records need no digest and no search;
    * ``filter``: a bitmap indexed by the top bits of the head keys' ``hi`` digests (about
      64 bits per key, so roughly 1 in 60 absent keys hits a set bit by chance). A tail key
      whose bit is clear is not in the head; only the rest are looked up in the map, which
      on a compacted log is the small share of keys updated since the last pass.

    Both are built on first use in each task (never pickled: the map alone is shipped).
    """

    FILTER_BITS_PER_KEY = 64
    MIN_FILTER_BITS = 1 << 16
    MAX_FILTER_BITS = 1 << 30

    def __init__(self, head_map: OffsetMap, start: int, end: int) -> None:
        self.map = head_map
        self.start = start
        self.end = end
        self._bits: np.ndarray | None = None
        self._filter: np.ndarray | None = None
        self._shift = 64

    def __reduce__(self) -> tuple[type[HeadIndex], tuple[OffsetMap, int, int]]:
        return HeadIndex, (self.map, self.start, self.end)  # the caches are rebuilt

    def __len__(self) -> int:
        return len(self.map)

    def _build_filter(self) -> np.ndarray:
        wanted = max(len(self.map) * self.FILTER_BITS_PER_KEY, self.MIN_FILTER_BITS)
        bits = min(1 << (wanted - 1).bit_length(), self.MAX_FILTER_BITS)
        self._shift = 64 - (bits.bit_length() - 1)
        table = np.zeros(bits // 8, dtype=np.uint8)
        slots = self.map.hi >> np.uint64(self._shift)
        np.bitwise_or.at(table, slots >> _THREE, _BIT[slots & _SEVEN])
        self._filter = table
        return table

    def maybe_present(self, hi: np.ndarray) -> np.ndarray:
        """False where a digest is certainly not in the head (no false negatives)."""
        table = self._filter if self._filter is not None else self._build_filter()
        slots = hi >> np.uint64(self._shift)
        return (table[slots >> _THREE] & _BIT[slots & _SEVEN]) != 0

    def latest_mask(self, columns: Columns) -> np.ndarray:
        offsets = columns.offsets
        tail = int(np.searchsorted(offsets, self.start))  # records are in offset order
        result = np.empty(len(offsets), dtype=bool)
        if tail < len(offsets):
            if self._bits is None:
                self._bits = self.map.latest_bits(self.start, self.end)
            inside = offsets[tail:] - self.start  # latest_bits: most significant bit first
            result[tail:] = (self._bits[inside >> 3] & _BIT[7 - (inside & 7)]) != 0
        if tail:
            hi, lo = key_digests(columns.keys_blob, columns.key_lengths[:tail])
            maybe = np.flatnonzero(self.maybe_present(hi))
            absent = np.ones(tail, dtype=bool)
            if len(maybe):
                absent[maybe] = self.map.get(hi[maybe], lo[maybe]) < 0
            result[:tail] = absent
        return result


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


def keep_mask(plan: ReadPlan, columns: Columns) -> np.ndarray | None:
    """Which records of ``columns`` the plan returns (``None``: all of them)."""
    keep: np.ndarray | None = None
    if not plan.changelog:
        keep = (columns.value_lengths >= 0) & (columns.key_lengths >= 0)
        if plan.head is not None:
            keep &= plan.head.latest_mask(columns)
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
    for columns in chunk_columns(iter_batches(plan.directory, partition.start, partition.end)):
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
