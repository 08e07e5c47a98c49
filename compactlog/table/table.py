"""Tables: a log's latest state as a live, read-only mapping (Kafka Streams' KTable).

``Table(path)`` (or ``log.table()``) restores the state of a log (or of a directory of
``partition-<N>`` logs) as of its end offset, then follows appends of any process.

Restore. Each log is opened read-only and its end offset ``E`` read first; the state is
every record in ``[log start, E)`` applied in offset order (a tombstone removes its key),
and the table's offset is ``E``, never "the last record + 1": when the last records were
compacted or expired away the table still reflects ``E`` and waits for nothing that no
longer exists (the quixstreams #1017 hang). The reader follows offsets, not files
(``reader.iter_batches``), so a cleaning pass running meanwhile changes nothing: offsets
never change, and records that vanish were superseded. Retention moving the log start
meanwhile may have removed records before they were read: the restore starts again.
A memory store of raw bytes restores the latest state as of ``E`` (``latest_batches``)
and serves point reads from it frozen (:mod:`compactlog.table.table_frozen`) while its dict is
built in the background (:meth:`_Part.thaw`: by the follower before it applies anything,
or by a thread of its own with ``follow=False``; an ordered read of more than
``FROZEN_RANGE_KEYS`` keys waits for it).

Following. A subscriber starts at ``E`` and waits on the writers' inotify wake-up
(``watch.HeadWatcher``: no polling loop); a background thread per log applies what each
poll returns. It is transient (``~table``) for the memory store; the disk store's is
durable (:func:`table_subscriber_name`), see :mod:`compactlog.table.table_disk`.
``follow=False`` leaves that to :meth:`Table.refresh`. If retention removes records the
table had not applied yet (it fell below the log start), or the cleaner removed a
tombstone it had not applied yet (it fell more than ``delete_retention_ms`` behind:
:mod:`compactlog.table.table_identity`), the table restores that log again and logs a warning
(:attr:`Table.rebuilds` counts them). A disk store resumes from its committed offset only
when that is still a state of the log (the same decision module).

Consistency: a read sees the state of one offset, and never waits for the follower's work.
The follower works out a slice of a poll (:meth:`_Part._apply`: deserializing, old values,
the size bound; a disk store's puts into its write transaction) without the table's lock,
then publishes it and moves the offset in one hold of the lock (a few dict updates, or one
LMDB commit); every read holds the lock too, so it sees the state before or after a slice.
Slices are cut between batches only (:meth:`_Part._slices`), so a batch of up to
``POLL_RECORDS`` records is never seen in part. Iteration and range reads copy the keys
(and values) of their range while holding the lock, then iterate the copy: an iteration
running while the follower applies changes never raises and never mixes two states (it
shows the state of the moment it started). asyncio: :mod:`compactlog.table.table_async`.

Change callbacks (:meth:`Table.on_change`) run on the follower's thread, after the poll's
changes are applied, in offset order. An exception in one is logged on the
``compactlog.table.table`` logger, kept in :attr:`Table.error` and raised (once) by the next read;
the follower goes on. An error of the follower itself (a corrupt log) stops it: every read
raises it from then on.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from ..encoding.serde import Deserializer, Side, declared_formats, side, undecodable
from ..engine.subscriber import set_committed
from ..errors import (
    ConfigError,
    DecodeError,
    ForeignTableStateError,
    InexactReadError,
    LogClosedError,
    TableError,
    TableStateCorruptError,
)
from ..storage.log_identity import ensure_log_id
from ..storage.logdirs import check_log_or_partitioned, is_partitioned, list_partitions
from ..storage.state_files import read_meta
from .table_async import AppliedWaiters, open_in_thread
from .table_disk import SYNC_INTERVAL_S, DiskStore, map_full_error
from .table_identity import (
    FOREIGN_STATE_POLICIES,
    HorizonWatch,
    foreign_reason,
    stale_reason,
    tombstone_horizon,
)
from .table_keys import KeyCodec
from .table_memory import Change, MemoryStore, merged

logger = logging.getLogger("compactlog.table")

FOLLOWER_NAME = "~table"
POLL_RECORDS = 1 << 16  # records per poll while following (a larger batch is cut)
SLICE_MIN_RECORDS = 1 << 10  # a poll is applied in slices of at least this many records ...
SLICE_S = 0.01  # ... else about as many as the follower applies in this time
ORDER_STEP = 1 << 11  # keys put into the key order per hold of the lock
ORDER_PAUSE_S = 0.0001  # between two: a reader's turn (``table_frozen.THAW_PAUSE_S``'s why)
POLL_WAIT_S = 1.0  # a follower's wait per poll (it wakes at once on an append or a close)
PROGRESS_EVERY_S = 5.0  # restore progress log lines at most this often
RESTORE_ATTEMPTS = 5  # restores in a row that retention overlapped, before keeping one
DECODE_ERROR_POLICIES = ("raise", "skip")
SKIPPED_KEPT = 1000  # the skipped records' errors a table keeps (the latest; all are counted)


class RestoreProgress:
    """Restore progress for the ``progress`` callback: records applied so far and the
    offsets to cover (an upper bound on records: compaction leaves gaps)."""

    __slots__ = ("end_offset", "records", "start_offset")

    def __init__(self, start_offset: int, end_offset: int) -> None:
        self.start_offset = start_offset
        self.end_offset = end_offset
        self.records = 0

    def __repr__(self) -> str:
        return f"restored {_count(self.records)} of {_count(self.total)} records"

    @property
    def total(self) -> int:
        return max(self.end_offset - self.start_offset, self.records)


def table_subscriber_name(state_dir: str) -> str:
    """The durable subscriber of a disk table (one per state directory)."""
    digest = hashlib.sha256(os.path.abspath(state_dir).encode()).hexdigest()[:16]
    return f"table-{digest}"


def _log_bytes(log: Any) -> int:
    from ..storage.segment import segment_path

    total = 0
    for base in log.get_segments():
        try:
            total += os.path.getsize(segment_path(log.directory, base))
        except FileNotFoundError:
            pass  # merged or removed meanwhile
    return total


def _count(n: int) -> str:
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f}M"
    if n >= 10_000:
        return f"{n / 1000:.0f}k"
    return str(n)


class _Part:
    """One log of the table: its read-only open, its store, its follower and offset."""

    def __init__(self, table: Table, directory: str, number: int) -> None:
        from ..log import open_log

        self.table = table
        self.number = number
        self.log = open_log(directory, read_only=True, create=False)
        try:
            self.key, self.value = table._sides(self.log)
            self.store: MemoryStore | DiskStore = table._new_store(self.log)
        except BaseException:
            self.log.close()
            raise
        self.offset = 0
        self.settled = 0  # the offset whose change callbacks have run
        # a disk store's follower is durable: its checkpoint in the log marks the log the
        # state was built from (gone if the log is recreated) and holds consumed retention
        state_dir = getattr(self.store, "state_dir", None)
        self._name = FOLLOWER_NAME if state_dir is None else table_subscriber_name(state_dir)
        self.subscriber: Any = None
        self.thread: threading.Thread | None = None
        self.thawer: threading.Thread | None = None  # builds a frozen state's dict
        self._thawing = threading.Lock()  # one builder at a time
        self.horizon = HorizonWatch(directory)  # expired deletes past the follower
        self._applying = threading.Lock()  # one applier at a time (follower or refresh)
        self.slice_records = POLL_RECORDS  # adapted to the follower's speed (:meth:`_pace`)

    @property
    def frozen(self) -> bool:
        """Whether the state is served frozen (:mod:`compactlog.table.table_frozen`)."""
        return isinstance(self.store, MemoryStore) and self.store.frozen is not None

    def thaw(self) -> None:
        """Replace a frozen restored state by its dict, built without the table's lock so
        reads go on meanwhile; at once if there is none. Before anything is applied
        (:meth:`poll`) and before a large ordered read."""
        if not self.frozen:
            return
        store = self.store
        assert isinstance(store, MemoryStore)
        with self._thawing:
            frozen = store.frozen
            if frozen is None:  # another thread built it meanwhile
                return
            data = frozen.to_dict(stop=lambda: self.table._closing)
            if data is None:
                return
            with self.table._lock:
                store.thaw(data)

    def restore(self, rebuild: str | None = None) -> None:
        """Bring the state to the end offset now, then follow from there: a fresh memory
        store; a disk store from its committed offset, or emptied first when ``rebuild``
        (why) is given or that offset cannot be trusted. A rebuild is logged and counted."""
        log = self.log
        store = self.store
        overlapped = 0  # restores that retention overlapped
        wiped = False  # a damaged disk state was removed
        while True:
            end = log.end_offset
            start = log.start_offset
            if not isinstance(store, DiskStore):
                store = self.table._new_store(log)
            try:
                self._restore_into(store, rebuild, start, end)
            except InexactReadError:
                continue  # a cleaning pass moved its point past ``end`` meanwhile: read on
            except TableStateCorruptError as error:
                assert isinstance(store, DiskStore)
                if wiped:
                    raise  # (damaged again at once: not a damaged file, say so)
                wiped = True
                store.wipe(error)  # a cache of the log: read it again
                rebuild = f"the state was damaged ({store.wiped})"
                continue
            except BaseException as error:
                if not isinstance(store, DiskStore) or not isinstance(error, map_full_error()):
                    raise
                store.grow()  # the transaction is dropped: start again with a larger map
                continue
            moved = read_meta(log.directory).log_start_offset
            if moved <= start or overlapped == RESTORE_ATTEMPTS - 1:
                break
            # retention ran meanwhile: records between what was read and the new log start
            # may have been skipped unseen; read again (the disk store drops its transaction)
            overlapped += 1
            logger.warning(
                "%s: retention moved the log start from %d to %d during the restore; "
                "restoring again",
                log.directory,
                start,
                moved,
            )
            store.abandon()
        store.commit(end)
        with self.table._lock:
            self.store = store
            self.offset = self.settled = end
            self.table._notify()
        if self.subscriber is None:
            self.subscriber = log.subscribe(self._name, start=end)
        self.subscriber.seek(end)
        self.subscriber.skipped.clear()  # (a durable follower's position below the start)
        self.subscriber.commit()

    def _restore_into(
        self, store: MemoryStore | DiskStore, rebuild: str | None, start: int, end: int
    ) -> None:
        log = self.log
        begin = start
        resumed = False
        if isinstance(store, DiskStore):
            found = store.checkpoint()
            if rebuild is None and store.wiped is not None:
                rebuild = f"the state was damaged ({store.wiped})"
            store.wiped = None
            log_id = ensure_log_id(log.directory)
            if rebuild is None and found is not None:
                rebuild = self._resume_refused(store, found, log_id, start, end)
            resumed = rebuild is None and found is not None
            if resumed:
                begin = found  # resume: replay only what was appended since
            else:
                store.reset()
            store.bind(log_id)
        if rebuild is not None:
            logger.warning("%s: rebuilding the table: %s", log.directory, rebuild)
            with self.table._lock:
                self.table.rebuilds += 1
        self._replay(store, begin, end)
        horizon = tombstone_horizon(log.directory) if resumed else 0
        if horizon > begin:
            # the cleaner removed a tombstone past the state while it was read: again
            store.abandon()
            self._restore_into(store, stale_reason(begin, True, start, end, horizon), start, end)

    def _resume_refused(
        self, store: DiskStore, found: int, log_id: str | None, start: int, end: int
    ) -> str | None:
        """Why a disk state committed at ``found`` is not resumed (``table_identity.py``);
        raises :class:`ForeignTableStateError` for another log's state when told to."""
        directory = self.log.directory
        foreign = foreign_reason(store.log_id(), log_id)
        if foreign is not None and self.table._foreign_state == "error":
            raise ForeignTableStateError(
                f"{foreign}; the state directory {store.state_dir} belongs to another log "
                "(foreign_state='rebuild' rebuilds it, or give each log its own state_dir)",
                path=directory,
            )
        marked = self._name in self.log.subscribers()
        return foreign or stale_reason(found, marked, start, end, tombstone_horizon(directory))

    def _replay(self, store: MemoryStore | DiskStore, begin: int, end: int) -> None:
        """Apply ``[begin, end)`` to ``store`` (a fresh memory store: the latest state as of
        ``end``, each live key's record once), reporting progress."""
        progress = RestoreProgress(begin, end)
        report = self.table._progress
        last_line = time.monotonic()
        if isinstance(store, MemoryStore):
            batches = self.log.latest_batches(end)
        else:
            batches = self.log.read_batches(begin, end)
        for batch in batches:
            self._apply_batch(store, batch, None)
            progress.records += len(batch)
            now = time.monotonic()
            if now - last_line >= PROGRESS_EVERY_S:
                last_line = now
                logger.info("%s: %r", self.log.directory, progress)
            if report is not None:
                report(progress)

    def poll(self, timeout_s: float) -> bool:
        """Apply what one poll returns (waiting up to ``timeout_s`` for it); ``True`` if
        the offset moved."""
        with self._applying:
            table = self.table
            self.thaw()
            before = self.offset
            batches = self.subscriber.poll_batches(POLL_RECORDS, timeout_s=timeout_s)
            position = self.subscriber.position
            if position == before:
                return False
            if self._fell_behind(before, batches):
                self.table._rebuilt(self, before)
                return True
            missed = self.horizon.missed(before, time.monotonic())
            if missed is not None:  # (table_identity.py, rule 4)
                self.restore(
                    f"the cleaner removed expired tombstones below offset {missed}, past the "
                    f"table's offset {before} (it fell more than delete_retention_ms behind)"
                )
                return True
            records = sum(map(len, batches))
            started = time.perf_counter() if records >= SLICE_MIN_RECORDS else 0.0
            slices = [(batches, position)]
            if records > self.slice_records:
                slices = list(self._slices(batches, position))
            for group, end in slices:
                changes: list[Change] | None = [] if table._callbacks else None
                self._apply(group, changes, end)
                if changes:
                    table._emit(changes)
                with table._lock:
                    self.settled = end  # wait_for returns once the callbacks ran too
                    table._notify()
            if started:
                self._pace(records, time.perf_counter() - started)
            return True

    def _slices(self, batches: list[Any], position: int) -> Iterator[tuple[list[Any], int]]:
        """``batches`` in groups of about :attr:`slice_records` records, each with the
        offset applying it moves the table to. Cut only between batches: a batch (up to
        :data:`POLL_RECORDS` records) is applied whole, and so is a run of small batches
        that the reader returns as one (single appends, ``small_runs.py``)."""
        group: list[Any] = []
        records = 0
        for number, batch in enumerate(batches):
            group.append(batch)
            records += len(batch)
            if records >= self.slice_records and number < len(batches) - 1:
                yield group, batch.next_offset
                group, records = [], 0
        yield group, position

    def _apply(self, batches: list[Any], changes: list[Change] | None, position: int) -> None:
        """Apply ``batches`` and move the offset to ``position``. The work is done without
        the table's lock (deserializing, looking up old values; a disk store's puts go
        into its write transaction, which readers do not see); only making it visible
        holds the lock, so a read waits for a few dict updates or one LMDB commit, never
        for a whole poll. Readers see the state before or after, never a part of it."""
        store = self.store
        table = self.table
        if isinstance(store, MemoryStore):
            pending = self._prepared(store, batches, changes)
            with table._lock:
                store.publish(pending)
                self.offset = position
            while store.unordered:  # the key order, in steps (an ordered read: all first)
                with table._lock:
                    if store.fold_order(ORDER_STEP):
                        return
                time.sleep(ORDER_PAUSE_S)
            return
        while True:
            try:
                for batch in batches:
                    self._apply_batch(store, batch, changes)
                with table._lock:
                    store.commit(position)
                    self.offset = position
                return
            except map_full_error():
                with table._lock:
                    store.grow()
                if changes is not None:
                    changes.clear()

    def _prepared(
        self, store: MemoryStore, batches: list[Any], changes: list[Change] | None
    ) -> Any:
        """``store.prepare`` under the table's ``on_decode_error`` policy: a memory store
        decodes as it prepares, so batches are looked at again only when that fails
        (preparing changes nothing), and prepared again without their undecodable records."""
        try:
            return store.prepare(batches, changes)
        except Exception:
            found = False
            kept = []
            for batch in batches:
                bad = undecodable(batch, self.key, self.value, self.log.directory)
                found = found or bool(bad)
                kept.append(self.table._decodable(self, batch, bad) if bad else batch)
            if not found:
                raise
            if changes is not None:
                changes.clear()
            return store.prepare(kept, changes)

    def _apply_batch(
        self, store: MemoryStore | DiskStore, batch: Any, changes: list[Change] | None
    ) -> None:
        """``store.apply`` under the table's ``on_decode_error`` policy. A memory store
        decodes as it applies (a failed batch is looked at again, on the error path only,
        and applied without its undecodable records: applying a batch is idempotent); a
        disk store keeps bytes and decodes on read, so its batches are decoded first."""
        if isinstance(store, DiskStore) and self.value.deserialize is not None:
            batch = self.table._decodable(self, batch, None)
        try:
            store.apply(batch, changes)
        except Exception:
            bad = undecodable(batch, self.key, self.value, self.log.directory)
            if not bad:
                raise
            store.apply(self.table._decodable(self, batch, bad), changes)

    def _pace(self, records: int, seconds: float) -> None:
        """Size the slices so that one takes about :data:`SLICE_S` to apply: a follower
        that is behind publishes (and calls back) every slice, so a record's change
        callback does not wait for the 65k records polled after it. Measured on polls of
        at least :data:`SLICE_MIN_RECORDS` records (smaller ones are applied whole)."""
        per_second = records / max(seconds, 1e-6)
        wanted = int(per_second * SLICE_S)
        self.slice_records = min(POLL_RECORDS, max(SLICE_MIN_RECORDS, wanted))

    def _fell_behind(self, before: int, batches: list[Any]) -> bool:
        """Retention removed offsets from ``before`` on that the table never applied."""
        if self.subscriber.skipped:
            self.subscriber.skipped.clear()
            return True
        first = batches[0].base_offset if batches else self.subscriber.position
        return first > before and read_meta(self.log.directory).log_start_offset > before

    def follow(self) -> None:
        table = self.table
        synced = time.monotonic()
        while not table._closing:
            try:
                self.poll(POLL_WAIT_S)
                if time.monotonic() - synced >= SYNC_INTERVAL_S:
                    synced = time.monotonic()
                    self.store.sync()
                    self.subscriber.commit()  # (a no-op for a transient follower)
            except LogClosedError:
                return
            except BaseException as error:  # the follower must not die silently
                if table._closing:
                    return
                logger.exception("table follower of %s stopped", self.log.directory)
                with table._lock:
                    table._fatal = error
                    table._notify(everyone=True)
                return

    def close(self) -> None:
        if self.subscriber is not None:
            self.subscriber.close()
        for thread in (self.thread, self.thawer):
            if thread is not None and thread is not threading.current_thread():
                thread.join()
        self.store.close()
        if self.subscriber is not None and self.subscriber.durable:
            set_committed(self.log, self._name, self.offset)
        self.log.close()


class Table(Mapping[Any, Any]):
    """The latest value of every key of a log (or a directory of ``partition-<N>`` logs),
    kept current. See the module docstring for restore, following and consistency.

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
        self._parts: list[_Part] = []
        try:
            for number, directory in directories:
                part = _Part(self, directory, number)
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

    def _sides(self, log: Any) -> tuple[Side, Side]:
        """How a log's keys and values decode: what was given (a callable or a format's
        name), else the log's declared format (bytes with ``raw=True``)."""
        formats = {"key_format": "bytes", "value_format": "bytes"}
        if not self._raw:
            formats = declared_formats(log.config)
        key = side("key", formats["key_format"], None, self._key_deserializer)
        value = side("value", formats["value_format"], None, self._value_deserializer)
        return key, value

    def _decodable(self, part: _Part, batch: Any, bad: list[tuple[int, DecodeError]] | None) -> Any:
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
        return DiskStore(state_dir, value.deserialize, _log_bytes(log), keys)

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

    def _part(self, partition: int | None) -> _Part:
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

    def _rebuilt(self, part: _Part, offset: int) -> None:
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
        raise KeyError(key)

    def get(self, key: Any, default: Any = None) -> Any:
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
        return (key for key, _value in self.items(start, stop, prefix=prefix))

    def values(self, start: Any = None, stop: Any = None, *, prefix: Any = None) -> Any:  # type: ignore[override]
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
