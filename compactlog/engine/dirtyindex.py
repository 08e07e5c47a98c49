"""The dirty section of a log as an index: which records the latest state keeps.

Below the cleaner point ``p`` (the clean tail) a cleaning pass left every key at most
once; only the dirty section ``[p, end)`` may hold several versions of a key. So a record belongs to
the latest state (tombstones aside) iff it lies in the dirty section and is its key's latest there,
or lies in the tail and its key has no record in the dirty section. :class:`DirtyIndex` answers that
for whole batches; ``Log.latest`` and the Spark source's latest mode both use it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from ..encoding.batch_decode import RecordBatch
from ..encoding.offset_map import OffsetMap, key_digests
from .reader import iter_batches

UNLIMITED = 1 << 62
_BIT = np.array([1 << i for i in range(8)], dtype=np.uint8)  # _BIT[i]: bit i of a byte
_THREE = np.uint64(3)
_SEVEN = np.uint64(7)


class DirtyIndex:
    """The dirty section's latest offset per key, shaped for the questions tasks ask.

    ``latest_mask`` answers, for each keyed record of a chunk, "is this the record the
    latest state keeps as far as the dirty section is concerned": a record (offset at or after
    ``start``) iff it is its key's latest offset, a tail record iff its key has no record in
    the dirty section. Both answers are exact; the two structures below only make them cheap:

    * ``latest bits``: one bit per offset of the dirty section, set at each key's latest
      (:meth:`OffsetMap.latest_bits`), so dirty-section records need no digest and no search;
    * ``filter``: a bitmap indexed by the top bits of the dirty-section keys' ``hi`` digests (about
      64 bits per key, so roughly 1 in 60 absent keys hits a set bit by chance). A tail key
      whose bit is clear is not in the dirty section; only the rest are looked up in the map, which
      on a compacted log is the small share of keys updated since the last pass.

    Both are built on first use in each task (never pickled: the map alone is shipped).
    """

    FILTER_BITS_PER_KEY = 64
    MIN_FILTER_BITS = 1 << 16
    MAX_FILTER_BITS = 1 << 30

    def __init__(self, dirty_map: OffsetMap, start: int, end: int) -> None:
        self.map = dirty_map
        self.start = start
        self.end = end
        self._bits: np.ndarray | None = None
        self._filter: np.ndarray | None = None
        self._shift = 64

    def __reduce__(self) -> tuple[type[DirtyIndex], tuple[OffsetMap, int, int]]:
        return DirtyIndex, (self.map, self.start, self.end)  # the caches are rebuilt

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
        """False where a digest is certainly not in the dirty section (no false negatives)."""
        table = self._filter if self._filter is not None else self._build_filter()
        slots = hi >> np.uint64(self._shift)
        return (table[slots >> _THREE] & _BIT[slots & _SEVEN]) != 0

    def latest_mask(self, columns: Any) -> np.ndarray:
        """``columns``: offsets in order, ``keys_blob`` and ``key_lengths`` (a
        :class:`~compactlog.encoding.batch_decode.RecordBatch` or the Spark reader's
        ``Columns``)."""
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


def build_dirty_map(directory: str, start: int, end: int) -> OffsetMap:
    """Latest offset of every key among the keyed records of ``[start, end)``."""
    return dirty_map_of(iter_batches(directory, start, end))


def dirty_map_of(batches: Iterable[RecordBatch]) -> OffsetMap:
    """Latest offset of every key among the keyed records of ``batches``."""
    latest = OffsetMap(UNLIMITED)
    for batch in batches:
        has_key = batch.key_lengths >= 0
        hi, lo = key_digests(batch.keys_blob, batch.key_lengths)
        offsets = batch.offsets
        if not bool(has_key.all()):
            hi, lo, offsets = hi[has_key], lo[has_key], offsets[has_key]
        latest.put(hi, lo, offsets)
    latest.flush()
    return latest


__all__ = ["DirtyIndex", "build_dirty_map", "dirty_map_of"]
