"""A table's state held in memory: ``{key: value}`` plus a key order built on demand.

Restore and following apply whole
:class:`~compactlog.encoding.batch_decode.RecordBatch` objects. With no
change callbacks, no size bound and no key order yet, a batch is one ``dict.update`` of its
keys and values (the last record of a key in the batch wins, as in the log) followed by the
removal of keys whose last record was a tombstone: no Python loop per record. Otherwise it
goes record by record, which change events and the size bound need anyway.

A restore of raw bytes with no size bound is collected instead and served frozen
(:mod:`compactlog.table.table_frozen`) from :meth:`MemoryStore.commit` until the table installs
the dict built from it (:meth:`MemoryStore.thaw`); nothing is applied to a frozen state.

The key order (a :class:`sortedcontainers.SortedList` of the keys) is built by the first
read that needs it, at the cost of one sort, and kept up to date from then on (built from a
frozen state, it holds the same keys as the dict that replaces it).

Not thread-safe on its own: :class:`~compactlog.table.table.Table` serializes access.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

from sortedcontainers import SortedList

from ..encoding.batch_decode import RecordBatch
from ..errors import ConfigError, TableFullError
from .table_frozen import FrozenState

ENTRY_OVERHEAD = 100  # bytes counted per key for ``max_bytes`` beside its key and value
FROZEN_RANGE_KEYS = 4096  # a range read of a frozen state takes at most this many keys
_MISSING = object()

Change = tuple[Any, Any, Any, int]  # (key, old, new, offset); None: absent / removed


class MemoryStore:
    """``{key: value}`` of one log, with optional deserializers and size bound."""

    def __init__(
        self,
        key_deserializer: Callable[[bytes], Any] | None = None,
        value_deserializer: Callable[[bytes], Any] | None = None,
        max_bytes: int | None = None,
        path: str | None = None,
    ) -> None:
        self.data: dict[Any, Any] | FrozenState = {}
        self.order: SortedList | None = None
        self.key_deserializer = key_deserializer
        self.value_deserializer = value_deserializer
        self.max_bytes = max_bytes
        self.sizes: dict[Any, int] | None = {} if max_bytes is not None else None
        self.bytes_used = 0
        self.path = path
        # a restore's batches, collected to be served frozen (raw bytes, no bound)
        self.restored: list[RecordBatch] | None = (
            []
            if key_deserializer is None and value_deserializer is None and max_bytes is None
            else None
        )

    @property
    def frozen(self) -> FrozenState | None:
        """The restored state while it is served frozen, else ``None``."""
        return self.data if isinstance(self.data, FrozenState) else None

    def thaw(self, data: dict[Any, Any]) -> None:
        """Install ``data`` (``frozen.to_dict()``, built without the table's lock)."""
        self.data = data

    def apply(self, batch: RecordBatch, changes: list[Change] | None = None) -> None:
        """Apply ``batch`` in offset order; append ``(key, old, new, offset)`` to
        ``changes`` for every record that changed the state, if given."""
        if self.restored is not None:  # a restore (batches of latest_batches): collect
            self.restored.append(batch)
            return
        assert self.frozen is None, "a frozen state is thawed first"
        keys = batch.keys()
        values = batch.values()
        if bool((batch.key_lengths < 0).any()):  # keyless records have no place in a table
            keep = [i for i, key in enumerate(keys) if key is not None]
            keys = [keys[i] for i in keep]
            values = [values[i] for i in keep]
            offsets = batch.offsets[keep].tolist() if changes is not None else None
        else:
            offsets = batch.offsets.tolist() if changes is not None else None
        raw_keys = keys
        if self.key_deserializer is not None:
            keys = list(map(self.key_deserializer, keys))
        tombstones = bool((batch.value_lengths < 0).any())
        deserialize = self.value_deserializer
        if (
            changes is None
            and self.sizes is None
            and self.order is None
            and (deserialize is None or not tombstones)
        ):
            self._update(keys, values, tombstones)
            return
        raw_values = values
        if deserialize is not None:
            values = [None if v is None else deserialize(v) for v in values]
        for i, key in enumerate(keys):
            value = values[i]
            raw = raw_values[i]
            if raw is None:
                old = self._remove(key)
            else:
                old = self._put(key, value, len(raw_keys[i]) + len(raw) + ENTRY_OVERHEAD)
            if changes is not None and (old is not _MISSING or raw is not None):
                assert offsets is not None
                changes.append((key, None if old is _MISSING else old, value, offsets[i]))

    def _update(self, keys: list[Any], values: list[Any], tombstones: bool) -> None:
        """The bulk path (a deserializer only when the batch holds no tombstone)."""
        data = self.data
        deserialize = self.value_deserializer
        if deserialize is None:
            data.update(zip(keys, values, strict=True))
        else:
            data.update(zip(keys, map(deserialize, values), strict=True))
        if tombstones:
            # the key's last record in the batch decides: None now means a tombstone
            for i, value in enumerate(values):
                if value is None and keys[i] in data and data[keys[i]] is None:
                    del data[keys[i]]

    def _put(self, key: Any, value: Any, size: int) -> Any:
        old = self.data.get(key, _MISSING)
        if self.sizes is not None:
            grow = size - self.sizes.get(key, 0)
            if self.max_bytes is not None and self.bytes_used + grow > self.max_bytes:
                raise TableFullError(
                    f"the table would hold more than max_bytes={self.max_bytes} bytes "
                    f"({len(self.data)} keys so far): raise max_bytes, or keep values on disk "
                    "with store='disk' (only a small digest and offset per key in memory)",
                    path=self.path,
                )
            self.sizes[key] = size
            self.bytes_used += grow
        self.data[key] = value
        if old is _MISSING and self.order is not None:
            self.order.add(key)
        return old

    def _remove(self, key: Any) -> Any:
        old = self.data.pop(key, _MISSING)
        if old is not _MISSING:
            if self.sizes is not None:
                self.bytes_used -= self.sizes.pop(key, 0)
            if self.order is not None:
                self.order.remove(key)
        return old

    def commit(self, offset: int) -> None:
        """The restore is complete: serve what it collected frozen (nothing to persist;
        the disk store commits here)."""
        if self.restored is not None:
            batches, self.restored = self.restored, None
            if batches:
                self.data = FrozenState(batches)

    def abandon(self) -> None:
        """Nothing to drop (a restore that is read again starts from a new store)."""

    def sync(self) -> None:
        """Nothing to persist."""

    def close(self) -> None:
        """Drop a frozen state: its batches may hold views of segment files' maps, which
        keep a file removed meanwhile on disk."""
        if self.frozen is not None:
            self.data = {}

    # -- reads ---------------------------------------------------------------------------
    def get(self, key: Any, default: Any = None) -> Any:
        return self.data.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self.data

    def __len__(self) -> int:
        return len(self.data)

    def sorted_keys(self) -> SortedList:
        """The keys in order (built by the first call: one sort)."""
        if self.order is None:
            self.order = SortedList(self.data)
        return self.order

    def range_items(self, start: Any, stop: Any, prefix: Any) -> list[tuple[Any, Any]] | None:
        """``(key, value)`` pairs with ``start <= key < stop`` (or starting with
        ``prefix``), in key order, copied: the caller iterates without the lock. ``None``
        when the state is frozen and the range holds more than :data:`FROZEN_RANGE_KEYS`
        keys (a frozen read costs microseconds a key): the caller builds the dict first."""
        data = self.data
        limit = None if self.frozen is None else FROZEN_RANGE_KEYS
        if limit is not None and len(data) > limit and start is stop is prefix is None:
            return None  # (every key: known too many before any sort)
        keys = self.key_range(start, stop, prefix, limit)
        return None if keys is None else [(key, data[key]) for key in keys]

    def key_range(
        self, start: Any, stop: Any, prefix: Any, limit: int | None = None
    ) -> list[Any] | None:
        """The keys of the range in order (found by bisection, sliced out whole); ``None``
        if there are more than ``limit``."""
        order = self.sorted_keys()
        if prefix is not None:
            start, stop = prefix, prefix_end(prefix)
        first = 0 if start is None else order.bisect_left(start)
        last = len(order) if stop is None else order.bisect_left(stop)
        if limit is not None and last - first > limit:
            return None
        return list(order[first:last]) if last > first else []

    def _check(self) -> None:
        if self.order is not None:
            assert list(self.order) == sorted(self.data)
        if self.sizes is not None:
            assert set(self.sizes) == set(self.data)
            assert self.bytes_used == sum(self.sizes.values())


def prefix_end(prefix: bytes | str) -> bytes | str | None:
    """The least key above every key that starts with ``prefix`` (``None``: none is), so
    those keys are the range ``[prefix, prefix_end(prefix))``."""
    if isinstance(prefix, bytes):
        kept = prefix.rstrip(b"\xff")
        return kept[:-1] + bytes([kept[-1] + 1]) if kept else None
    if isinstance(prefix, str):
        kept_text = prefix.rstrip(chr(sys.maxunicode))
        return kept_text[:-1] + chr(ord(kept_text[-1]) + 1) if kept_text else None
    raise ConfigError(f"items(prefix=) takes bytes or str, not {type(prefix).__name__}")


def merged(parts: list[list[tuple[Any, Any]]]) -> Iterator[tuple[Any, Any]]:
    """Sorted pair lists of disjoint key sets (one per log of a partitioned table), merged."""
    if len(parts) == 1:
        return iter(parts[0])
    import heapq

    return heapq.merge(*parts, key=lambda pair: pair[0])


__all__ = [
    "ENTRY_OVERHEAD",
    "FROZEN_RANGE_KEYS",
    "Change",
    "MemoryStore",
    "TableFullError",
    "merged",
]
