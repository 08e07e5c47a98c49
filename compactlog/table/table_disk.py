"""A table's state on disk (``store="disk"``): LMDB, with the offset it reflects inside.

Why LMDB rather than a Bitcask keydir over the log (measured in ``docs/benchmarks.md``): a
keydir maps each key to an offset and reads the value from the log, but the cleaner merges
records into batches of up to ``cleaner_merge_batch_bytes`` with one CRC, so a point read
decodes a whole batch (tens of microseconds to a millisecond); LMDB answers a point read
from its memory map in about a microsecond, keeps nothing per key on the Python heap (its
pages are the OS page cache, shared and evictable) and commits the state and the offset
it reflects in one transaction, so no checkpoint can ever disagree with the state it
names. The price is a second copy of the live values on disk.

Layout: ``<state_dir>/data.mdb`` and ``lock.mdb`` (LMDB's), ``table.lock`` (one table per
state directory), a ``data`` database of ``key -> value`` and a ``meta`` database holding
``offset`` (the state reflects every record below it). The log it was built from holds a
durable subscriber checkpoint of the table (``compactlog.table.table.table_subscriber_name``).

Crash protocol of one :meth:`DiskStore.commit` (one LMDB write transaction):

1. put/delete the keys of the applied batches and put ``offset``: a death here leaves the
   last committed transaction (LMDB's copy-on-write pages; the old root is untouched);
2. commit: LMDB writes the new pages, then the meta page naming the new root. A death
   before the meta page is written leaves the previous state and offset; after, the new.

The map is written in place (``writemap``: no copy of the dirty pages on the heap), so
``data.mdb`` is a sparse file as large as the map: three times the log's bytes at open,
at least 1 GiB, doubled whenever it fills. Commits do not ``fsync`` (``sync=False``): a
killed process loses nothing committed (the pages are in the OS cache);
:meth:`DiskStore.sync` (every ``SYNC_INTERVAL_S`` while following, and on close) makes
them survive a power loss too. On restart the table replays the log from the stored
offset; it rebuilds, and logs why, when the log's start offset passed that offset
(retention removed records the state never saw), when the log's end offset is below it, or
when the log holds no checkpoint of the table's subscriber (the log was recreated).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import Any

from ..encoding.batch_decode import RecordBatch
from ..errors import ConfigError, LogLockedError
from ..storage import lockfile
from .table_memory import Change

MIN_MAP_SIZE = 1 << 30  # the memory map (and data.mdb's apparent size; it is sparse) ...
MAP_PER_LOG_BYTE = 3  # ... at least this many times the log's bytes, doubled when full
SYNC_INTERVAL_S = 1.0
_OFFSET = struct.Struct("<q")
_OFFSET_KEY = b"offset"


class DiskStore:
    """``{key: value}`` of one log in LMDB at ``state_dir``. Keys are the stored bytes
    (and compare as bytes); ``value_deserializer`` applies on the way out."""

    def __init__(
        self,
        state_dir: str,
        value_deserializer: Callable[[bytes], Any] | None = None,
        log_bytes: int = 0,
    ) -> None:
        try:
            import lmdb
        except ImportError:
            raise ConfigError(
                "store='disk' needs the lmdb package: pip install 'compactlog[disk]'"
            ) from None
        os.makedirs(state_dir, exist_ok=True)
        self.state_dir = state_dir
        self.value_deserializer = value_deserializer
        self._lock_fd = _lock_state_dir(state_dir)
        try:
            self.env = lmdb.open(
                state_dir,
                map_size=_map_size(state_dir, log_bytes),
                max_dbs=2,
                sync=False,
                metasync=True,
                lock=True,
                writemap=True,  # dirty pages in the file map, not on the heap
            )
        except BaseException:
            os.close(self._lock_fd)
            raise
        self.data = self.env.open_db(b"data")
        self.meta = self.env.open_db(b"meta")
        self._txn: Any = None  # the write transaction of the changes not committed yet
        # one read transaction for every read, begun anew after each commit (reads and
        # commits are serialized by the table's lock; LMDB's MDB_NOTLS lets any thread use it)
        self._reader: Any = None

    # -- checkpoint ------------------------------------------------------------------------
    def checkpoint(self) -> int | None:
        """The offset of the committed state, ``None`` if there is none."""
        with self.env.begin(db=self.meta) as txn:
            offset = txn.get(_OFFSET_KEY)
        return None if offset is None else int(_OFFSET.unpack(offset)[0])

    def reset(self) -> None:
        """Empty the state, in the transaction the next :meth:`commit` ends: readers see
        the old state until the rebuilt one is committed."""
        txn = self._write()
        txn.drop(self.data, delete=False)
        txn.drop(self.meta, delete=False)

    # -- writing ---------------------------------------------------------------------------
    def _write(self) -> Any:
        if self._txn is None:
            self._txn = self.env.begin(write=True)
        return self._txn

    def apply(self, batch: RecordBatch, changes: list[Change] | None = None) -> None:
        txn = self._write()
        data = self.data
        keys = batch.keys()
        values = batch.values()
        if changes is None:
            for key, value in zip(keys, values, strict=True):
                if key is None:
                    continue
                if value is None:
                    txn.delete(key, db=data)
                else:
                    txn.put(key, value, db=data)
            return
        deserialize = self.value_deserializer or _same
        for key, value, offset in zip(keys, values, batch.offsets.tolist(), strict=True):
            if key is None:
                continue
            old = txn.get(key, db=data)
            if value is None:
                if old is not None:
                    txn.delete(key, db=data)
                    changes.append((key, deserialize(bytes(old)), None, offset))
            else:
                txn.put(key, value, db=data)
                new = deserialize(value)
                changes.append((key, None if old is None else deserialize(bytes(old)), new, offset))

    def commit(self, offset: int) -> None:
        """Steps 1-2 of the module's crash protocol: the changes applied since the last
        commit and ``offset``, in one transaction."""
        txn = self._write()  # 1. (the changes are in it already)
        txn.put(_OFFSET_KEY, _OFFSET.pack(offset), db=self.meta)
        self._txn = None
        txn.commit()  # 2.
        if self._reader is not None:  # (a stale reader would pin the old pages)
            self._reader.abort()
            self._reader = None

    def sync(self) -> None:
        self.env.sync(True)

    def abandon(self) -> None:
        """Drop the changes applied since the last commit."""
        if self._txn is not None:
            self._txn.abort()
            self._txn = None

    def grow(self) -> None:
        """Double the map after ``lmdb.MapFullError`` (the open transaction is dropped:
        the caller applies its batches again)."""
        self.abandon()
        self.env.set_mapsize(self.env.info()["map_size"] * 2)

    # -- reads -----------------------------------------------------------------------------
    def _read(self) -> Any:
        """The read transaction, showing the last commit."""
        if self._reader is None:
            self._reader = self.env.begin(db=self.data)
        return self._reader

    def get(self, key: Any, default: Any = None) -> Any:
        if not isinstance(key, bytes):
            return default
        value = self._read().get(key)
        if value is None:
            return default
        return value if self.value_deserializer is None else self.value_deserializer(value)

    def __contains__(self, key: object) -> bool:
        return self.get(key, None) is not None

    def __len__(self) -> int:
        return int(self._read().stat(self.data)["entries"])

    def range_items(self, start: Any, stop: Any, prefix: Any) -> list[tuple[Any, Any]]:
        deserialize = self.value_deserializer or _same
        out = []
        with self._read().cursor() as cursor:
            first = prefix if prefix is not None else start
            found = cursor.set_range(first) if first is not None else cursor.first()
            while found:
                key = cursor.key()
                if prefix is not None and not key.startswith(prefix):
                    break
                if stop is not None and key >= stop:
                    break
                out.append((key, deserialize(cursor.value())))
                found = cursor.next()
        return out

    def close(self) -> None:
        if self._reader is not None:
            self._reader.abort()
            self._reader = None
        self.abandon()
        self.env.sync(True)
        self.env.close()
        os.close(self._lock_fd)

    def _check(self) -> None:
        assert self._txn is None


def map_full_error() -> type[BaseException]:
    """``lmdb.MapFullError`` (the class is only needed where a disk store exists)."""
    import lmdb

    return lmdb.MapFullError


def _map_size(state_dir: str, log_bytes: int) -> int:
    try:
        present = os.path.getsize(os.path.join(state_dir, "data.mdb"))
    except FileNotFoundError:
        present = 0
    return max(MIN_MAP_SIZE, present, MAP_PER_LOG_BYTE * log_bytes)


def _same(value: Any) -> Any:
    return value


def _lock_state_dir(state_dir: str) -> int:
    """One table per state directory: an ``flock`` on ``table.lock`` (gone with the
    process)."""
    try:
        return lockfile.lock(os.path.join(state_dir, "table.lock"))
    except lockfile.LockHeld as held:
        raise LogLockedError(
            f"the table state directory is in use by {held.holder or 'another process'}",
            path=state_dir,
        ) from None


__all__ = ["DiskStore", "map_full_error"]
