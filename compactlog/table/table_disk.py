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
``offset`` (the state reflects every record below it) and ``log_id`` (the log it was
built from, :mod:`compactlog.storage.log_identity`). The log it was built from holds a
durable subscriber checkpoint of the table (``compactlog.table.table_part.table_subscriber_name``).

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
offset, or rebuilds and logs why when the state may not be a state of the log (another
log's, by the ``log_id`` the ``meta`` database records; a recreated log; retention or an
expired tombstone past it): :mod:`compactlog.table.table_identity` decides.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
from collections.abc import Callable
from typing import Any

from ..encoding.batch_decode import RecordBatch
from ..errors import ConfigError, LogLockedError, TableError, TableStateCorruptError
from ..storage import lockfile
from .table_keys import KeyCodec
from .table_memory import Change

logger = logging.getLogger("compactlog.table")

MIN_MAP_SIZE = 1 << 30  # the memory map (and data.mdb's apparent size; it is sparse) ...
MAP_PER_LOG_BYTE = 3  # ... at least this many times the log's bytes, doubled when full
SYNC_INTERVAL_S = 1.0
_OFFSET = struct.Struct("<q")
_OFFSET_KEY = b"offset"
_LOG_ID_KEY = b"log_id"
_LMDB_FILES = ("data.mdb", "lock.mdb")


class DiskStore:
    """``{key: value}`` of one log in LMDB at ``state_dir``. Keys are stored as bytes and
    read as the log's declared key format (``keys``, :mod:`compactlog.table.table_keys`);
    ``value_deserializer`` applies on the way out.

    A damaged LMDB file (``lmdb.InvalidError``, ``CorruptedError``...) is never served: at
    open the state directory is emptied and :attr:`wiped` says why (the table rebuilds it
    from the log, which it caches); later, every call raises
    :class:`~compactlog.errors.TableStateCorruptError` naming the directory."""

    def __init__(
        self,
        state_dir: str,
        value_deserializer: Callable[[bytes], Any] | None = None,
        log_bytes: int = 0,
        keys: KeyCodec | None = None,
    ) -> None:
        try:
            import lmdb  # noqa: F401
        except ImportError:
            raise ConfigError(
                "store='disk' needs the lmdb package: pip install 'compactlog[disk]'"
            ) from None
        os.makedirs(state_dir, exist_ok=True)
        self.state_dir = state_dir
        self.value_deserializer = value_deserializer
        self.keys = keys or KeyCodec()
        self._to_stored = None if self.keys.format == "bytes" else self.keys.stored
        self.wiped: str | None = None  # why a damaged state was emptied (wipe)
        self._txn: Any = None  # the write transaction of the changes not committed yet
        # one read transaction for every read, begun anew after each commit (reads and
        # commits are serialized by the table's lock; LMDB's MDB_NOTLS lets any thread use it)
        self._reader: Any = None
        self.env: Any = None
        self._lock_fd = _lock_state_dir(state_dir)
        try:
            self._open(log_bytes)
        except BaseException:
            os.close(self._lock_fd)
            raise

    def _open(self, log_bytes: int) -> None:
        """Open the environment; a damaged one is emptied (:meth:`wipe`)."""
        try:
            self._open_env(log_bytes)
            self.checkpoint()  # (reads the meta database: a damaged tree shows here)
        except TableStateCorruptError as error:
            self.wipe(error, log_bytes)

    def wipe(self, error: BaseException, log_bytes: int = 0) -> None:
        """Remove a damaged state (``error`` says how it is damaged) and open an empty one:
        it is a cache of the log, which the table reads again. :attr:`wiped` says why."""
        cause = error.__cause__ or error
        self.wiped = f"{type(cause).__name__}: {cause}"
        logger.warning(
            "%s: the table state is damaged (%s); removing it to rebuild it from the log",
            self.state_dir,
            self.wiped,
        )
        self._reader = self._txn = None  # (their environment is closed below)
        self._close_env()
        for name in _LMDB_FILES:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(self.state_dir, name))
        self._open_env(log_bytes)

    def _open_env(self, log_bytes: int) -> None:
        import lmdb

        try:
            self.env = lmdb.open(
                self.state_dir,
                map_size=_map_size(self.state_dir, log_bytes),
                max_dbs=2,
                sync=False,
                metasync=True,
                lock=True,
                writemap=True,  # dirty pages in the file map, not on the heap
            )
            self.data = self.env.open_db(b"data")
            self.meta = self.env.open_db(b"meta")
        except corrupt_errors() as error:
            raise self._corrupt(error) from error

    def _close_env(self) -> None:
        if self.env is not None:
            with contextlib.suppress(Exception):
                self.env.close()
            self.env = None

    def _corrupt(self, error: BaseException) -> TableStateCorruptError:
        return TableStateCorruptError(
            f"the table state (LMDB) is damaged: {type(error).__name__}: {error}; it is a "
            "cache of the log: reopen the table to rebuild it (or delete the directory)",
            path=self.state_dir,
        )

    # -- checkpoint ------------------------------------------------------------------------
    def checkpoint(self) -> int | None:
        """The offset of the committed state, ``None`` if there is none."""
        offset = self._meta_get(_OFFSET_KEY)
        return None if offset is None else int(_OFFSET.unpack(offset)[0])

    def log_id(self) -> str | None:
        """The id of the log the committed state was built from (``None``: not recorded,
        a state of an older compactlog)."""
        found = self._meta_get(_LOG_ID_KEY)
        return None if found is None else bytes(found).decode()

    def _meta_get(self, key: bytes) -> bytes | None:
        try:
            with self.env.begin(db=self.meta) as txn:
                found = txn.get(key)
        except corrupt_errors() as error:
            raise self._corrupt(error) from error
        return None if found is None else bytes(found)

    def reset(self) -> None:
        """Empty the state, in the transaction the next :meth:`commit` ends: readers see
        the old state until the rebuilt one is committed."""
        txn = self._write()
        txn.drop(self.data, delete=False)
        txn.drop(self.meta, delete=False)

    def bind(self, log_id: str | None) -> None:
        """Record the id of the log the state is built from, in the next commit."""
        txn = self._write()
        if log_id is None:
            txn.delete(_LOG_ID_KEY, db=self.meta)
        else:
            txn.put(_LOG_ID_KEY, log_id.encode(), db=self.meta)

    # -- writing ---------------------------------------------------------------------------
    def _write(self) -> Any:
        if self._txn is None:
            self._txn = self.env.begin(write=True)
        return self._txn

    def apply(self, batch: RecordBatch, changes: list[Change] | None = None) -> None:
        import lmdb

        try:
            self._apply(batch, changes)
        except corrupt_errors() as error:
            raise self._corrupt(error) from error
        except lmdb.BadValsizeError as error:
            raise self._unfit_key(batch) from error

    def _unfit_key(self, batch: RecordBatch) -> TableError:
        """LMDB takes keys of 1 to ``max_key_size`` bytes (511): say which key is not."""
        limit = self.env.max_key_size()
        for key, offset in zip(batch.keys(), batch.offsets.tolist(), strict=True):
            if key is not None and not 0 < len(key) <= limit:
                return TableError(
                    f"the key at offset {offset} has {len(key)} bytes: a disk table takes "
                    f"keys of 1 to {limit} bytes (LMDB's limit); use store='memory'",
                    path=self.state_dir,
                )
        return TableError("LMDB refused a key or value of this batch", path=self.state_dir)

    def _apply(self, batch: RecordBatch, changes: list[Change] | None) -> None:
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
        table_key = self.keys.key
        for key, value, offset in zip(keys, values, batch.offsets.tolist(), strict=True):
            if key is None:
                continue
            old = txn.get(key, db=data)
            if value is None:
                if old is not None:
                    txn.delete(key, db=data)
                    changes.append((table_key(key), deserialize(bytes(old)), None, offset))
            else:
                txn.put(key, value, db=data)
                new = deserialize(value)
                old_value = None if old is None else deserialize(bytes(old))
                changes.append((table_key(key), old_value, new, offset))

    def commit(self, offset: int) -> None:
        """Steps 1-2 of the module's crash protocol: the changes applied since the last
        commit and ``offset``, in one transaction."""
        txn = self._write()  # 1. (the changes are in it already)
        txn.put(_OFFSET_KEY, _OFFSET.pack(offset), db=self.meta)
        self._txn = None
        try:
            txn.commit()  # 2.
        except corrupt_errors() as error:
            raise self._corrupt(error) from error
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
        to_stored = self._to_stored
        if to_stored is None:  # (bytes keys: the old fast path, no call)
            if not isinstance(key, bytes):
                return default
        else:
            key = to_stored(key)
            if key is None:
                return default
        try:
            value = self._read().get(key)
        except corrupt_errors() as error:
            raise self._corrupt(error) from error
        if value is None:
            return default
        return value if self.value_deserializer is None else self.value_deserializer(value)

    def __contains__(self, key: object) -> bool:
        return self.get(key, None) is not None

    def __len__(self) -> int:
        return int(self._read().stat(self.data)["entries"])

    def range_items(self, start: Any, stop: Any, prefix: Any) -> list[tuple[Any, Any]]:
        """``(key, value)`` pairs of the range in key order, as a memory table orders
        them (:mod:`compactlog.table.table_keys`)."""
        try:
            if self.keys.ordered:
                return self._cursor_range(start, stop, prefix)
            return self._sorted_range(start, stop, prefix)
        except corrupt_errors() as error:
            raise self._corrupt(error) from error

    def _cursor_range(self, start: Any, stop: Any, prefix: Any) -> list[tuple[Any, Any]]:
        """Byte order is key order: walk LMDB's cursor over the range."""
        codec = self.keys
        if prefix is not None:
            prefix = codec.prefix(prefix)
        for bound in (start, stop):
            if bound is not None and codec.stored(bound) is None:
                raise TypeError(
                    f"items() of {codec.format} keys takes {codec.key_type.__name__} bounds, "
                    f"not {type(bound).__name__}"
                )
        first = prefix if prefix is not None else (None if start is None else codec.stored(start))
        last = None if stop is None else codec.stored(stop)
        deserialize = self.value_deserializer or _same
        table_key = codec.key
        out = []
        with self._read().cursor() as cursor:
            found = cursor.set_range(first) if first is not None else cursor.first()
            while found:
                key = cursor.key()
                if prefix is not None and not key.startswith(prefix):
                    break
                if last is not None and key >= last:
                    break
                out.append((table_key(key), deserialize(cursor.value())))
                found = cursor.next()
        return out

    def _sorted_range(self, start: Any, stop: Any, prefix: Any) -> list[tuple[Any, Any]]:
        """Byte order is not key order (JSON): decode the candidates, filter, sort."""
        codec = self.keys
        first = None if prefix is None else codec.prefix(prefix)
        deserialize = self.value_deserializer or _same
        pairs = []
        with self._read().cursor() as cursor:
            found = cursor.set_range(first) if first is not None else cursor.first()
            while found:
                stored = cursor.key()
                if first is not None and not stored.startswith(first):
                    break
                key = codec.key(stored)
                if (start is None or start <= key) and (stop is None or key < stop):
                    pairs.append((key, cursor.value()))
                found = cursor.next()
        pairs.sort(key=lambda pair: pair[0])
        return [(key, deserialize(value)) for key, value in pairs]

    def close(self) -> None:
        if self._reader is not None:
            self._reader.abort()
            self._reader = None
        try:
            self.abandon()
            self.env.sync(True)
        finally:
            self._close_env()
            os.close(self._lock_fd)

    def _check(self) -> None:
        assert self._txn is None


def corrupt_errors() -> tuple[type[BaseException], ...]:
    """The ``lmdb`` errors that mean a damaged state directory (never a full map or a
    busy reader). ``BadDbiError``: a damaged main tree loses the named databases."""
    import lmdb

    return (
        lmdb.InvalidError,
        lmdb.BadDbiError,
        lmdb.CorruptedError,
        lmdb.PageNotFoundError,
        lmdb.VersionMismatchError,
    )


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


__all__ = ["DiskStore", "corrupt_errors", "map_full_error"]
