"""One log of a table (``table.py``): its read-only open, its store, its restore and its
follower. How restore and following work, and what a read sees meanwhile:
docs/tables.md.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from ..encoding.serde import Side, undecodable
from ..engine.subscriber import set_committed
from ..errors import (
    DecodeError,
    ForeignTableStateError,
    InexactReadError,
    LogClosedError,
    TableStateCorruptError,
)
from ..storage.log_identity import ensure_log_id
from ..storage.state_files import read_meta, replica_quiet
from .table_disk import SYNC_INTERVAL_S, DiskStore, map_full_error
from .table_identity import HorizonWatch, foreign_reason, stale_reason, tombstone_horizon
from .table_memory import Change, MemoryStore

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


def log_bytes(log: Any) -> int:
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


class Owner(Protocol):
    """What a :class:`Part` uses of the :class:`~compactlog.table.table.Table` owning it
    (one lock, the notifications, the store and decode choices shared by its parts)."""

    rebuilds: int
    _lock: threading.Lock
    _closing: bool
    _fatal: BaseException | None
    _foreign_state: str
    _progress: Callable[[RestoreProgress], None] | None
    _callbacks: list[Callable[[list[Change]], None]]

    def _open_log(self, directory: str) -> Any: ...
    def _sides(self, log: Any) -> tuple[Side, Side]: ...
    def _new_store(self, log: Any) -> MemoryStore | DiskStore: ...
    def _notify(self, everyone: bool = False) -> None: ...
    def _rebuilt(self, part: Part, offset: int) -> None: ...
    def _emit(self, changes: list[Change]) -> None: ...
    def _decodable(
        self, part: Part, batch: Any, bad: list[tuple[int, DecodeError]] | None
    ) -> Any: ...


class Part:
    """One log of the table: its read-only open, its store, its follower and offset."""

    def __init__(self, table: Owner, directory: str, number: int) -> None:
        self.table = table
        self.number = number
        self.log = table._open_log(directory)
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
            started = time.monotonic()
            data = frozen.to_dict(stop=lambda: self.table._closing)
            if data is None:
                return
            with self.table._lock:
                store.thaw(data)
            logger.info(
                "%s: the restored state's dict is built (%d keys), %.1f s",
                self.log.directory,
                len(data),
                time.monotonic() - started,
            )

    def restore(self, rebuild: str | None = None) -> None:
        """Bring the state to the end offset now, then follow from there: a fresh memory
        store; a disk store from its committed offset, or emptied first when ``rebuild``
        (why) is given or that offset cannot be trusted. A rebuild is logged and counted."""
        log = self.log
        store = self.store
        started = time.monotonic()
        overlapped = 0  # restores that retention overlapped
        wiped = False  # a damaged disk state was removed
        while True:
            if not isinstance(store, DiskStore):
                store = self.table._new_store(log)
            try:
                # on a replica, no manifest is applied meanwhile: a cleaned rewrite renamed
                # in between the end read here and the segments read would make the state
                # at ``end`` lack records cleaned away for successors past it
                with replica_quiet(log.directory):
                    end = log.end_offset
                    start = log.start_offset
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
        logger.info(
            "%s: restored to offset %d (%d keys), %.1f s",
            log.directory,
            end,
            len(store),
            time.monotonic() - started,
        )
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
