"""Tables: a log's latest state as a live, read-only mapping (Kafka Streams' KTable).

``Table(path)`` (or ``log.table()``) restores the state of a log (or of a directory of
``partition-<N>`` logs) as of its end offset, then follows appends of any process; each
log is a :class:`~compactlog.table.table_part.Part`. Restore, following, consistency and
change callbacks: docs/tables.md.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from ..encoding.serde import Deserializer, Side, declared_formats, side, undecodable
from ..errors import ConfigError, DecodeError, LogClosedError, TableError
from ..storage.logdirs import check_log_or_partitioned, is_partitioned, list_partitions
from .table_async import AppliedWaiters, open_in_thread
from .table_disk import DiskStore
from .table_identity import FOREIGN_STATE_POLICIES
from .table_keys import KeyCodec, missing_key
from .table_memory import Change, MemoryStore, merged
from .table_part import POLL_WAIT_S, Part, RestoreProgress, log_bytes

logger = logging.getLogger("compactlog.table")

DECODE_ERROR_POLICIES = ("raise", "skip")
SKIPPED_KEPT = 1000  # the skipped records' errors a table keeps (the latest; all are counted)


class Table(Mapping[Any, Any]):
    """The latest value of every key of a log (or a directory of ``partition-<N>`` logs),
    kept current. Restore, following and consistency: docs/tables.md.

    ``follow``: follow appends in a background thread (else call :meth:`refresh`).
    ``key_deserializer`` / ``value_deserializer``: callables applied to the stored bytes
    (keys then compare as what they return), or the name of a built-in format (``"str"``,
    ``"json"``, ``"bytes"``, as ``open()`` takes); by default the log's declared formats
    (``key_format``/``value_format``, :mod:`compactlog.encoding.serde`), bytes with
    ``raw=True``. ``on_decode_error``: what a stored key or value its format cannot decode
    does (Kafka Streams' deserialization exception handler). ``"raise"`` (the default): the
    restore raises :class:`~compactlog.errors.DecodeError` naming the log and the offset,
    and a follower stops with it (reads raise ``TableError`` from it). ``"skip"``: the
    record is left out (the key keeps the value it had; after a restore from the latest
    state it is absent), a warning names the log and the offset, and
    :attr:`skipped_count` and :attr:`skipped` (the latest ``SKIPPED_KEPT`` errors) report it.
    ``max_bytes``: refuse to hold more than this many bytes of keys and values (plus
    ``ENTRY_OVERHEAD`` per key) in memory.
    ``store="disk"`` with ``state_dir``: keep the state in LMDB there instead
    (:mod:`compactlog.table.table_disk`): almost nothing per key in memory, and a restart
    replays only the records appended since the state was last committed.
    ``foreign_state``: a disk state built from another log is rebuilt (``"rebuild"``) or
    refused with :class:`~compactlog.errors.ForeignTableStateError` (``"error"``).
    ``progress``: called with a :class:`RestoreProgress` after every restored batch.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        follow: bool = True,
        key_deserializer: Deserializer | str | None = None,
        value_deserializer: Deserializer | str | None = None,
        max_bytes: int | None = None,
        store: str = "memory",
        state_dir: str | os.PathLike[str] | None = None,
        progress: Callable[[RestoreProgress], None] | None = None,
        raw: bool = False,
        foreign_state: str = "rebuild",
        on_decode_error: str = "raise",
    ) -> None:
        if on_decode_error not in DECODE_ERROR_POLICIES:
            raise ConfigError(f"on_decode_error must be 'raise' or 'skip', not {on_decode_error!r}")
        if max_bytes is not None and (isinstance(max_bytes, bool) or max_bytes <= 0):
            raise ConfigError(f"max_bytes must be a positive int, not {max_bytes!r}")
        if store not in ("memory", "disk"):
            raise ConfigError(f"store must be 'memory' or 'disk', not {store!r}")
        if foreign_state not in FOREIGN_STATE_POLICIES:
            raise ConfigError(f"foreign_state must be 'rebuild' or 'error', not {foreign_state!r}")
        if (store == "disk") != (state_dir is not None):
            raise ConfigError("store='disk' takes a state_dir (and only it does)")
        if store == "disk" and (key_deserializer is not None or max_bytes is not None):
            raise ConfigError(
                "store='disk' keeps keys as the log's declared key format (stored as bytes "
                "in LMDB) and bounds nothing in memory: key_deserializer and max_bytes are "
                "for store='memory'"
            )
        self._state_dir = None if state_dir is None else os.path.abspath(os.fspath(state_dir))
        self.path = os.path.abspath(os.fspath(path))
        self.follow = follow
        self._key_deserializer = key_deserializer
        self._value_deserializer = value_deserializer
        self._max_bytes = max_bytes
        self._progress = progress
        self._raw = raw
        self._foreign_state = foreign_state
        self.on_decode_error = on_decode_error
        self.skipped: collections.deque[DecodeError] = collections.deque(maxlen=SKIPPED_KEPT)
        self.skipped_count = 0
        self._lock = threading.RLock()
        self._moved = threading.Condition(self._lock)
        self._waiters = AppliedWaiters()  # wait_for_async's coroutines
        self._callbacks: list[Callable[[Any, Any, Any, int], None]] = []
        self._error: BaseException | None = None  # a callback's, raised once
        self._fatal: BaseException | None = None  # the follower's, raised by every read
        self._closing = False
        self.rebuilds = 0
        self.partitioned = is_partitioned(self.path)
        if not self.partitioned:
            check_log_or_partitioned(self.path)
        directories = list_partitions(self.path) if self.partitioned else [(0, self.path)]
        self._parts: list[Part] = []
        try:
            for number, directory in directories:
                part = Part(self, directory, number)
                self._parts.append(part)
                part.restore()
            for part in self._parts:
                # the follower builds a frozen state's dict before it applies anything
                if follow:
                    part.thread = threading.Thread(
                        target=part.follow,
                        name=f"compactlog-table-{part.log.directory}",
                        daemon=True,
                    )
                    part.thread.start()
                elif part.frozen:
                    part.thawer = threading.Thread(
                        target=part.thaw,
                        name=f"compactlog-table-thaw-{part.log.directory}",
                        daemon=True,
                    )
                    part.thawer.start()
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _open_log(directory: str) -> Any:
        """A part's log, opened read-only (the one import of ``log.py`` from the tables:
        ``tests/test_layers.py``'s named exception)."""
        from ..log import open_log

        return open_log(directory, read_only=True, create=False)

    def _sides(self, log: Any) -> tuple[Side, Side]:
        """How a log's keys and values decode: what was given (a callable or a format's
        name), else the log's declared format (bytes with ``raw=True``)."""
        formats = {"key_format": "bytes", "value_format": "bytes"}
        if not self._raw:
            formats = declared_formats(log.config)
        key = side("key", formats["key_format"], None, self._key_deserializer)
        value = side("value", formats["value_format"], None, self._value_deserializer)
        return key, value

    def _decodable(self, part: Part, batch: Any, bad: list[tuple[int, DecodeError]] | None) -> Any:
        """``batch`` without the records whose key or value does not decode (``bad``, or
        found now), under the ``on_decode_error`` policy: raise the first one's error, or
        leave them out and report them."""
        if bad is None:
            bad = undecodable(batch, part.key, part.value, part.log.directory)
        if not bad:
            return batch
        if self.on_decode_error == "raise":
            raise bad[0][1]
        keep = np.ones(len(batch), dtype=bool)
        for row, error in bad:
            keep[row] = False
            logger.warning("skipping a record (on_decode_error='skip'): %s", error)
        with self._lock:
            self.skipped.extend(error for _row, error in bad)
            self.skipped_count += len(bad)
        return batch.select(keep)

    @classmethod
    async def open_async(cls, path: str | os.PathLike[str], **options: Any) -> Table:
        """``Table(path, **options)`` for asyncio: the restore (seconds for millions of
        keys) runs in the event loop's default executor, so the loop keeps running. A task
        cancelled while it waits leaves no table open: it is closed when the restore ends."""
        return await open_in_thread(lambda: cls(path, **options), Table.close)

    async def close_async(self) -> None:
        """:meth:`close` for asyncio (it joins the follower threads) in the executor."""
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    def _new_store(self, log: Any) -> MemoryStore | DiskStore:
        key, value = self._sides(log)
        if self._state_dir is None:
            return MemoryStore(key.deserialize, value.deserialize, self._max_bytes, log.directory)
        state_dir = self._state_dir
        if self.partitioned:
            state_dir = os.path.join(state_dir, os.path.basename(log.directory))
        key_format = "bytes" if self._raw else declared_formats(log.config)["key_format"]
        keys = KeyCodec(key_format)  # (table_keys.py)
        return DiskStore(state_dir, value.deserialize, log_bytes(log), keys)

    # -- offsets and waiting ---------------------------------------------------------------
    @property
    def offset(self) -> int:
        """The offset the state reflects: every record below it is applied. A partitioned
        table has one per log: see :attr:`offsets`."""
        if self.partitioned:
            raise ConfigError(
                "a partitioned table has one offset per log: use table.offsets",
                path=self.path,
            )
        return self._parts[0].offset

    @property
    def offsets(self) -> dict[int, int]:
        """``{partition number: offset}`` (``{0: offset}`` for a single log)."""
        with self._lock:
            return {part.number: part.offset for part in self._parts}

    def wait_for(
        self, offset: int, timeout: float | None = None, *, partition: int | None = None
    ) -> None:
        """Return once the record at ``offset`` (e.g. what ``append`` returned) is applied
        (``table.offset > offset``) and the change callbacks up to it have run. Raises
        ``TimeoutError`` after ``timeout`` seconds."""
        part = self._part(partition)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                self._raise_errors()
                if part.settled > offset:
                    return
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(
                        f"table offset {part.settled} did not pass {offset} within {timeout} s"
                    )
                if self.follow:
                    self._moved.wait(remaining)
                    continue
            part.poll(min(POLL_WAIT_S, remaining) if remaining is not None else POLL_WAIT_S)

    async def wait_for_async(
        self, offset: int, timeout: float | None = None, *, partition: int | None = None
    ) -> None:
        """:meth:`wait_for` for asyncio: woken by the follower once it has applied
        ``offset`` (:mod:`compactlog.table.table_async`), no thread per waiter."""
        part = self._part(partition)
        if not self.follow:  # (nobody else applies records: refresh in the loop's executor)
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(
                None, lambda: self.wait_for(offset, timeout, partition=partition)
            )
            return

        def ready() -> bool:
            return (
                part.settled > offset
                or self._closing
                or self._fatal is not None
                or self._error is not None
            )

        applied = await self._waiters.wait(ready, timeout)
        with self._lock:
            self._raise_errors()
        if not applied:
            raise TimeoutError(
                f"table offset {part.settled} did not pass {offset} within {timeout} s"
            )

    def _notify(self, everyone: bool = False) -> None:
        """Wake the waiters (the caller holds the lock): the offset moved, or
        (``everyone``) an error or a close."""
        self._moved.notify_all()
        self._waiters.wake(everyone)

    def refresh(self) -> None:
        """Apply every record appended so far (for ``follow=False``; with ``follow=True``
        it waits until the follower has)."""
        for part in self._parts:
            end = part.log.end_offset
            if self.follow:
                self.wait_for(end - 1, partition=part.number)
                continue
            while part.offset < end and part.poll(0):
                pass

    def _part(self, partition: int | None) -> Part:
        if partition is None:
            if self.partitioned:
                raise ConfigError(
                    "a partitioned table needs partition= (offsets are per log)", path=self.path
                )
            return self._parts[0]
        for part in self._parts:
            if part.number == partition:
                return part
        raise ConfigError(f"no partition {partition} in this table", path=self.path)

    def _rebuilt(self, part: Part, offset: int) -> None:
        part.restore(
            f"retention removed records from offset {offset} on before the table applied "
            "them; restoring that log again"
        )

    # -- changes ---------------------------------------------------------------------------
    def on_change(
        self, callback: Callable[[Any, Any, Any, int], None]
    ) -> Callable[[Any, Any, Any, int], None]:
        """Call ``callback(key, old, new, offset)`` for every change the follower applies
        (``old``/``new`` ``None``: absent / removed). Usable as a decorator."""
        with self._lock:
            self._callbacks.append(callback)
        return callback

    def _emit(self, changes: list[Change]) -> None:
        callbacks = list(self._callbacks)
        for key, old, new, offset in changes:
            for callback in callbacks:
                try:
                    callback(key, old, new, offset)
                except Exception as error:
                    logger.exception(
                        "table change callback %r failed at offset %d", callback, offset
                    )
                    with self._lock:
                        self._error = error

    @property
    def error(self) -> BaseException | None:
        """The last error of a change callback (until a read raises it), or the error that
        stopped the follower."""
        return self._fatal or self._error

    def _raise_errors(self) -> None:
        if self._closing:
            raise LogClosedError("table is closed", path=self.path)
        if self._fatal is not None:
            raise TableError(
                f"the table's follower stopped: {self._fatal}", path=self.path
            ) from self._fatal
        if self._error is not None:
            error, self._error = self._error, None
            raise TableError("a change callback raised", path=self.path) from error

    # -- reads -----------------------------------------------------------------------------
    def __getitem__(self, key: Any) -> Any:
        with self._lock:
            self._raise_errors()
            for part in self._parts:
                value = part.store.get(key, _ABSENT)
                if value is not _ABSENT:
                    return value
            label = self._parts[0].key.label
        raise missing_key(key, label)

    def get(self, key: Any, default: Any = None) -> Any:
        """The value of ``key``, or ``default`` when the table has no such key."""
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: object) -> bool:
        with self._lock:
            self._raise_errors()
            return any(key in part.store for part in self._parts)

    def __len__(self) -> int:
        with self._lock:
            self._raise_errors()
            return sum(len(part.store) for part in self._parts)

    def __iter__(self) -> Iterator[Any]:
        return (key for key, _value in self.items())

    def items(  # type: ignore[override]
        self, start: Any = None, stop: Any = None, *, prefix: Any = None
    ) -> Iterator[tuple[Any, Any]]:
        """``(key, value)`` in key order: all, those with ``start <= key < stop``, or those
        whose key starts with ``prefix`` (bytes or str keys), as of one offset."""
        if prefix is not None and (start is not None or stop is not None):
            raise ConfigError("items() takes start/stop or prefix, not both")
        while True:
            with self._lock:
                self._raise_errors()
                parts = [part.store.range_items(start, stop, prefix) for part in self._parts]
            # a large range of a frozen state waits for its dict, then is read again
            frozen = [part for part, items in zip(self._parts, parts, strict=True) if items is None]
            if not frozen:
                return merged(parts)  # type: ignore[arg-type]
            for part in frozen:
                part.thaw()

    def keys(self, start: Any = None, stop: Any = None, *, prefix: Any = None) -> Any:  # type: ignore[override]
        """The keys in key order: all, those with ``start <= key < stop``, or those that
        start with ``prefix`` (bytes or str keys), as of one offset (see :meth:`items`)."""
        return (key for key, _value in self.items(start, stop, prefix=prefix))

    def values(self, start: Any = None, stop: Any = None, *, prefix: Any = None) -> Any:  # type: ignore[override]
        """The values in their keys' order: all, those of keys with ``start <= key < stop``,
        or of keys that start with ``prefix``, as of one offset (see :meth:`items`)."""
        return (value for _key, value in self.items(start, stop, prefix=prefix))

    # -- closing ---------------------------------------------------------------------------
    def close(self) -> None:
        """Stop following and close the logs; reads then raise ``LogClosedError``."""
        self._closing = True
        with self._lock:
            self._notify(everyone=True)  # waiters raise LogClosedError
        for part in self._parts:
            part.close()

    def __enter__(self) -> Table:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._closing:
            return f"<compactlog.Table {self.path!r} closed>"
        with self._lock:
            keys = sum(len(part.store) for part in self._parts)
        return f"<compactlog.Table {self.path!r} offsets={self.offsets} keys={keys}>"


_ABSENT = object()

__all__ = ["RestoreProgress", "Table", "TableError"]
