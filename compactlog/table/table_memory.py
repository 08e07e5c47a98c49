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
from itertools import repeat
from typing import Any

from sortedcontainers import SortedList

from ..encoding.batch_decode import RecordBatch
from ..encoding.serde import map_decode
from ..errors import ConfigError, TableFullError
from .table_frozen import FrozenState

ENTRY_OVERHEAD = 100  # bytes counted per key for ``max_bytes`` beside its key and value
FROZEN_RANGE_KEYS = 4096  # a range read of a frozen state takes at most this many keys
_MISSING = object()
_REMOVED = object()  # a key's last record in a :class:`Pending` is a tombstone

Change = tuple[Any, Any, Any, int]  # (key, old, new, offset); None: absent / removed


class Pending:
    """What :meth:`MemoryStore.prepare` worked out for :meth:`MemoryStore.publish`."""

    __slots__ = ("added", "bytes_used", "puts", "removes", "sizes", "tombstones")

    def __init__(self, bytes_used: int) -> None:
        self.puts: dict[Any, Any] = {}  # key -> its new value
        self.removes: list[Any] = []  # keys to remove
        self.tombstones = False  # whether ``puts`` holds tombstones (``_REMOVED``)
        self.added: list[Any] = []  # keys new to the state (when a key order is kept)
        self.sizes: dict[Any, int] = {}  # key -> its new size (0: removed), with max_bytes
        self.bytes_used = bytes_used


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
        # published changes not yet in ``order``: (keys added, keys removed), oldest first
        self._unordered: list[tuple[list[Any], list[Any]]] = []
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
        self.publish(self.prepare([batch], changes))

    def prepare(self, batches: list[RecordBatch], changes: list[Change] | None = None) -> Pending:
        """The state's change by ``batches`` (in offset order), worked out without changing
        the state: keys and values deserialized, old values looked up, the size bound
        checked (``TableFullError`` leaves the state as it was). The slow part of applying,
        so the caller does it without the table's lock; only the store's one writer (the
        follower) calls it, so the state cannot change between this and :meth:`publish`."""
        assert self.frozen is None, "a frozen state is thawed first"
        pending = Pending(self.bytes_used)
        for batch in batches:
            self._prepare(batch, changes, pending)
        if pending.tombstones:  # keys whose last record is one are removed, not put
            pending.removes = [key for key, value in pending.puts.items() if value is _REMOVED]
            for key in pending.removes:
                del pending.puts[key]
        if self.order is not None or self.sizes is not None:
            data = self.data
            pending.added = [key for key in pending.puts if key not in data]
            pending.removes = [key for key in pending.removes if key in data]
        return pending

    def _prepare(self, batch: RecordBatch, changes: list[Change] | None, pending: Pending) -> None:
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
            keys = map_decode(self.key_deserializer, keys)
        tombstones = bool((batch.value_lengths < 0).any())
        deserialize = self.value_deserializer
        puts = pending.puts
        decoded = values  # (the present values decoded as one column: no frame per value)
        if deserialize is not None and tombstones:
            present = iter(map_decode(deserialize, [v for v in values if v is not None]))
            decoded = [v if v is None else next(present) for v in values]
        elif deserialize is not None:
            decoded = map_decode(deserialize, values)
        if changes is None and self.sizes is None:  # the bulk path: the last record wins
            if tombstones:
                pending.tombstones = True
                decoded = [_REMOVED if v is None else v for v in decoded]
            puts.update(zip(keys, decoded, strict=True))
            return
        data = self.data
        sizes = self.sizes
        puts_get, data_get = puts.get, data.get  # (bound once: the loop runs per record)
        add = None if changes is None else changes.append
        ats = offsets if offsets is not None else repeat(0, len(keys))
        rows = zip(keys, values, decoded, raw_keys, ats, strict=True)
        for key, raw, new, raw_key, at in rows:
            old = puts_get(key, _MISSING)
            if old is _MISSING:
                old = data_get(key, _MISSING)
            elif old is _REMOVED:
                old = _MISSING
            if raw is None:
                if old is _MISSING:
                    continue  # (a tombstone of an absent key changes nothing)
                puts[key] = _REMOVED
                pending.tombstones = True
                if sizes is not None:
                    pending.bytes_used -= self._size(pending, key)
                    pending.sizes[key] = 0
                value = None
            else:
                value = new
                if sizes is not None:
                    self._grow(pending, key, len(raw_key) + len(raw) + ENTRY_OVERHEAD)
                puts[key] = value
            if add is not None:
                add((key, None if old is _MISSING else old, value, at))

    def _grow(self, pending: Pending, key: Any, size: int) -> None:
        """Count ``key`` at ``size`` bytes in ``pending``; ``TableFullError`` past the bound."""
        grow = size - self._size(pending, key)
        if self.max_bytes is not None and pending.bytes_used + grow > self.max_bytes:
            raise TableFullError(
                f"the table would hold more than max_bytes={self.max_bytes} bytes "
                f"({len(self.data)} keys so far): raise max_bytes, or keep values on disk "
                "with store='disk' (only a small digest and offset per key in memory)",
                path=self.path,
            )
        pending.sizes[key] = size
        pending.bytes_used += grow

    def _size(self, pending: Pending, key: Any) -> int:
        """``key``'s counted bytes as of ``pending`` (0: absent)."""
        if key in pending.sizes:
            return pending.sizes[key]
        assert self.sizes is not None
        return self.sizes.get(key, 0)

    def publish(self, pending: Pending) -> None:
        """Make ``pending`` (:meth:`prepare`'s) the state: C-level dict updates, fast
        enough to hold the table's lock for. The key order's part is queued, not done:
        :meth:`fold_order` does it in steps, and any ordered read first."""
        data = self.data
        assert isinstance(data, dict)
        data.update(pending.puts)
        for key in pending.removes:
            data.pop(key, None)
        if self.sizes is not None:
            for key, size in pending.sizes.items():
                if size:
                    self.sizes[key] = size
                else:
                    self.sizes.pop(key, None)
            self.bytes_used = pending.bytes_used
        if self.order is not None and (pending.added or pending.removes):
            self._unordered.append((pending.added, pending.removes))

    @property
    def unordered(self) -> bool:
        """Whether published changes wait to be put into the key order."""
        return bool(self._unordered)

    def fold_order(self, step: int | None = None) -> bool:
        """Bring the key order up to date by at most ``step`` keys (``None``: all), in
        the order the changes were published; ``True`` once it is. The caller holds the
        table's lock."""
        todo = self._unordered
        if self.order is None:
            todo.clear()
            return True
        budget = -1 if step is None else step  # (-1: no limit)
        while todo and budget:
            added, removed = todo[0]  # (disjoint: the order within one item is free)
            keys = added or removed
            count = len(keys) if budget < 0 else min(budget, len(keys))
            if keys is added:
                self.order.update(keys[:count])
            else:
                for key in keys[:count]:
                    self.order.discard(key)
            del keys[:count]
            if budget > 0:
                budget -= count
            if not added and not removed:
                todo.pop(0)
        return not todo

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
            self._unordered.clear()
            self.order = SortedList(self.data)
        self.fold_order()
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
        self.fold_order()
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
