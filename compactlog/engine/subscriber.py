"""Subscribers: independent readers of one log, durable (checkpointed) or transient (JLog).

A durable subscriber keeps its committed position in ``cp.<hex(name)>``; a name starting
with ``~`` is transient (starts at the end, keeps no file). Reading, falling behind the log
start, waiting, exclusive consumers and commit's crash safety: docs/subscribers.md and
docs/architecture.md. Its parts: ``subscriber_names`` (names, checkpoints, the name lock),
``subscriber_cursor`` (the cursor over ``SegmentReader``), ``subscriber_lag`` (lag reports).
"""

from __future__ import annotations

import asyncio
import bisect
import math
import os
import threading
import time
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..encoding.batch_decode import Record, RecordBatch
from ..encoding.serde import RAW, Serde
from ..errors import (
    DecodeError,
    LogClosedError,
    MissingSegmentError,
    SubscriberBusyError,
    SubscriberError,
)
from ..storage import filenames
from ..storage.head import Head, read_published_head
from ..storage.segment import SegmentReader, list_segments, segment_path
from ..storage.state_files import write_checkpoint
from ..storage.tail import scan_start
from .reader import iter_batches
from .subscriber_cursor import Cursor, Descriptors
from .subscriber_lag import SubscriberLag, backlog, lag_report
from .subscriber_names import (
    acquire_name_lock,
    acquire_or_degrade,
    is_transient,
    load_checkpoint,
    lock_path,
    log_start,
    logger,
    name_holder,
    validate_name,
)
from .watch import SLEEP_MAX_S, SLEEP_MIN_S, HeadWatcher

if TYPE_CHECKING:
    from .logview import LogView

COMMIT_ATTEMPTS = 3  # a log opened elsewhere removes stray ``.tmp`` files: retry then


# -- events and reports ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SkipEvent:
    """Offsets a subscriber never saw: its position was below the log start offset."""

    subscriber: str
    from_offset: int  # the position it had
    to_offset: int  # the log start it resumed at
    at_ms: int  # the log's clock when it noticed

    @property
    def offsets_skipped(self) -> int:
        return self.to_offset - self.from_offset


def remove_subscriber(log: LogView, name: str, *, force: bool = False) -> None:
    """Delete durable subscriber ``name``'s checkpoint (it no longer holds retention).

    Refuses with :class:`SubscriberBusyError` while a consumer holds the name; ``force``
    removes the checkpoint anyway (that consumer recreates it on its next commit). The
    lock file goes too, unlinked while holding its lock (see :func:`acquire_name_lock`).
    """
    validate_name(name)
    if is_transient(name):
        raise SubscriberError(f"{name!r} is a transient subscriber: it has no checkpoint")
    try:
        lock_fd = acquire_name_lock(log.directory, name)
    except SubscriberBusyError:
        if not force:
            raise
        lock_fd = -1
    try:
        if load_checkpoint(log.directory, name) is None:
            raise SubscriberError(f"no durable subscriber named {name!r}", path=log.directory)
        try:
            log.fs.remove(os.path.join(log.directory, filenames.checkpoint_name(name)))
        except FileNotFoundError:
            raise SubscriberError(
                f"no durable subscriber named {name!r}", path=log.directory
            ) from None
        if lock_fd >= 0:
            try:
                os.unlink(lock_path(log.directory, name))
            except FileNotFoundError:
                pass
        log.fs.fsync_dir(log.directory)
    finally:
        if lock_fd >= 0:
            os.close(lock_fd)


def set_committed(log: LogView, name: str, offset: int, *, force: bool = False) -> int:
    """Move durable subscriber ``name``'s committed position to ``offset`` (an operator's
    seek; below the log start: the log start). Returns the position stored.

    Takes the name's lock like a consumer, so it refuses with
    :class:`SubscriberBusyError` while one runs: that consumer would overwrite the
    checkpoint on its next commit. ``force`` writes the checkpoint anyway.
    """
    validate_name(name)
    if is_transient(name):
        raise SubscriberError(f"{name!r} is a transient subscriber: it has no checkpoint")
    if load_checkpoint(log.directory, name) is None:
        raise SubscriberError(f"no durable subscriber named {name!r}", path=log.directory)
    try:
        subscriber = Subscriber(log, name)
    except SubscriberBusyError:
        if not force:
            raise
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise SubscriberError(f"offset must be a non-negative int, not {offset!r}") from None
        if offset > log.end_offset:
            raise SubscriberError(
                f"offset {offset} is beyond the end of the log ({log.end_offset})"
            ) from None
        target = max(offset, log_start(log.directory))
        write_checkpoint(log.fs, log.directory, name, target)
        return target
    with subscriber:
        subscriber.seek(offset)
        subscriber.commit()
        return subscriber.position


# -- the subscriber ------------------------------------------------------------------------


class Subscriber:
    """One reader of a log with its own position. See docs/subscribers.md.

    Not meant to be shared by threads polling at once (calls are serialized by a lock).
    A durable name has one consumer at a time in all processes and threads: constructing
    a second raises :class:`SubscriberBusyError` until the first is closed (or its process
    dies). :meth:`Log.close` closes every subscriber the log made.
    """

    def __init__(
        self, log: LogView, name: str, *, start: int | None = None, serde: Serde = RAW
    ) -> None:
        self.log = log
        self.serde = serde  # how poll() converts keys and values (serde.py)
        self.name = validate_name(name)
        self.transient = is_transient(name)
        self.directory = log.directory
        self.skipped: list[SkipEvent] = []
        self._lock = threading.Lock()
        self._closed = False
        self._closing = False  # set without the lock, so a waiting poll notices a close
        self._fds = Descriptors()
        self._finalizer = weakref.finalize(self, self._fds.close)
        try:
            self._setup(start)
        except BaseException:
            self._closed = True
            self._finalizer()
            raise

    def _setup(self, start: int | None) -> None:
        name = self.name
        if not self.transient:
            self._fds.name_lock_fd = acquire_or_degrade(self.directory, name)
        try:
            self._fds.lock_fd = os.open(
                os.path.join(self.directory, filenames.WRITER_LOCK), os.O_RDONLY | os.O_CLOEXEC
            )
        except FileNotFoundError:
            self._fds.lock_fd = -1
        if start is not None:
            start = self._check_offset(start, "start")
        committed = None if self.transient else load_checkpoint(self.directory, name)
        self._committed: int | None = committed
        # until it first reads, a subscriber placed by ``start``/``seek``/"the log start" only
        # follows a moving log start silently: it never had those records to lose
        self._quiet = committed is None
        if committed is not None:
            # an existing checkpoint wins over ``start``: ``start`` places a *new* subscriber
            self._position = committed
            self._checklog_start()
            end = self._end_offset()
            if committed > end:
                # only after a power loss took back records this subscriber had committed
                # past (possible under sync "interval"/"os"); the next writable open skips
                # those offsets (recovery._keep_offsets_unique), so none is reused
                logger.warning(
                    "%s: subscriber %r committed offset %d, past the log's end offset %d: "
                    "records it had read were lost with unsynced data in a crash",
                    self.directory,
                    name,
                    committed,
                    end,
                )
        elif self.transient:
            self._position = self._end_offset() if start is None else self._clamp(start)
        else:
            self._position = self._clamp(start) if start is not None else log_start(self.directory)
            self._write_checkpoint(self._position)  # holds consumed retention from now on
            self._committed = self._position

    # -- properties ----------------------------------------------------------------------
    @property
    def position(self) -> int:
        """The offset the next poll starts from (just after the last record polled)."""
        return self._position

    @property
    def committed(self) -> int | None:
        """The position last committed (or loaded) by this object; ``None`` if transient."""
        return self._committed

    @property
    def durable(self) -> bool:
        """Whether this subscriber commits its position to a checkpoint file under its name
        (``log.subscribe(name)``) so that it resumes there; ``False`` for a transient one."""
        return not self.transient

    @property
    def lag(self) -> int:
        """Records between the position and the log end (offsets: after compaction removed
        some, an upper bound)."""
        self._check_open()
        return max(self._end_offset() - self._position, 0)

    @property
    def lag_bytes(self) -> int:
        """Bytes of segment data from the position to the end of the log."""
        self._check_open()
        return backlog(self.log, self._position)[0]

    @property
    def lag_segments(self) -> int:
        """Segments holding data not yet polled."""
        self._check_open()
        return backlog(self.log, self._position)[1]

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (reads then raise ``LogClosedError``)."""
        return self._closed

    # -- public operations ----------------------------------------------------------------
    def poll(
        self, max_records: int = 1000, max_bytes: int | None = None, timeout_s: float = 0
    ) -> list[Record]:
        """Up to ``max_records`` records from the position on, in offset order.

        ``max_bytes`` bounds the batch bytes read (at least one record is returned when
        any is there). ``timeout_s > 0`` waits that long for records, also ones appended
        by other processes; ``0`` returns at once. Returns ``[]`` when there is none.
        Keys and values are deserialized as the log's ``read`` does; a record that does
        not decode raises :class:`DecodeError` and the position stays where it was (seek
        past ``error.offset``, or read it with a ``raw=True`` subscriber).
        """
        records: list[Record] = []
        convert = self.serde.records
        before = self._position
        batches = self.poll_batches(max_records, max_bytes, timeout_s)
        try:
            for batch in batches:
                records.extend(convert(batch))
        except DecodeError:
            with self._lock:
                self._fds.drop_cursor()
                self._position = before
            raise
        return records

    def poll_batches(
        self, max_records: int = 1000, max_bytes: int | None = None, timeout_s: float = 0
    ) -> list[RecordBatch]:
        """Like :meth:`poll`, as columnar :class:`RecordBatch` objects (no per-record
        Python objects); the first and last batch may be cut to the position and limits,
        and a run of small stored batches (single appends) comes back as one batch."""
        _check_limit(max_records, "max_records")
        if max_bytes is not None:
            _check_limit(max_bytes, "max_bytes")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s < 0:
            raise SubscriberError(f"timeout_s must be a number >= 0, not {timeout_s!r}")
        with self._lock:
            self._check_open()
            deadline = time.monotonic() + timeout_s
            delay = SLEEP_MIN_S
            while True:
                self._check_open()
                before = self._position
                batches = self._read(max_records, max_bytes)
                if self._position != before:
                    self._quiet = False
                if batches or timeout_s <= 0:
                    return batches
                if time.monotonic() >= deadline:
                    return []
                if self._position == before and self._head_has_more():
                    # the head promises records the files do not show yet (a rare race
                    # with a roll or a rewrite): back off instead of spinning
                    time.sleep(delay)
                    delay = min(delay * 2, SLEEP_MAX_S)
                    continue
                if not self._watcher().wait(self._wake, deadline):
                    self._check_open()
                    return []
                self._check_open()

    async def poll_async(
        self, max_records: int = 1000, max_bytes: int | None = None, timeout_s: float = 0
    ) -> list[Record]:
        """:meth:`poll` for a coroutine: waits up to ``timeout_s`` (``math.inf``: until
        records come) without blocking the event loop or taking a thread; the wake-up is
        this log's shared watch in the running loop (``aio.py``). Records found at once are
        returned after the loop has run its other ready tasks once: a consumer draining a
        backlog poll by poll (``async for``) never holds the loop for longer than one poll."""
        from .aio import wait_until

        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s < 0:
            raise SubscriberError(f"timeout_s must be a number >= 0, not {timeout_s!r}")
        deadline = time.monotonic() + timeout_s
        delay = SLEEP_MIN_S
        while True:
            before = self._position
            records = self.poll(max_records, max_bytes, 0)
            if records:
                await asyncio.sleep(0)  # let other tasks run: a backlog takes many polls
                return records
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return records
            if self._position == before and self._head_has_more():
                # the head promises records the files do not show yet (see poll_batches)
                await asyncio.sleep(min(delay, remaining))
                delay = min(delay * 2, SLEEP_MAX_S)
                continue
            await wait_until(self.directory, self._wake, remaining)

    def __aiter__(self) -> AsyncIterator[Record]:
        """``async for record in subscriber``: every record from the position on, waiting
        for appends as they come; ends when the subscriber (or its log) is closed."""
        return self._records_async()

    async def _records_async(self) -> AsyncIterator[Record]:
        while True:
            try:
                records = await self.poll_async(timeout_s=math.inf)
            except LogClosedError:
                return
            for record in records:
                yield record

    def commit(self, offset: int | None = None) -> None:
        """Persist the position (or ``offset``, at most the position) atomically.

        A no-op for transient subscribers, and when nothing changed since the last commit.
        """
        with self._lock:
            self._check_open()
            if self.transient:
                return
            target = self._position if offset is None else self._check_offset(offset, "offset")
            if target > self._position:
                raise SubscriberError(
                    f"cannot commit offset {target} beyond the position {self._position}"
                )
            if target == self._committed:
                return
            self._write_checkpoint(target)
            self._committed = target

    def seek(self, offset: int) -> None:
        """Move the position; the next poll starts at ``offset`` (below the log start: at
        the log start). Not persisted until :meth:`commit`."""
        with self._lock:
            self._check_open()
            offset = self._check_offset(offset, "offset")
            self._fds.drop_cursor()
            self._position = self._clamp(offset)
            self._quiet = True

    def close(self) -> None:
        """Release the descriptors and the name (another consumer may take it at once).
        Does not commit. A poll waiting in another thread returns within
        ``INOTIFY_SAFETY_S`` (raising :class:`LogClosedError`)."""
        self._closing = True
        with self._lock:
            self._closed = True
            self._finalizer()

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = "transient" if self.transient else "durable"
        return (
            f"<compactlog.Subscriber {self.name!r} {kind} position={self._position} "
            f"committed={self._committed}>"
        )

    # -- internals: state ----------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed or self._closing:
            raise LogClosedError(f"subscriber {self.name!r} is closed", path=self.directory)
        if self.log.closed:
            raise LogClosedError("log is closed", path=self.directory)

    def _check_offset(self, offset: object, what: str) -> int:
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise SubscriberError(f"{what} must be a non-negative int, not {offset!r}")
        end = self._end_offset()
        if offset > end:
            raise SubscriberError(f"{what} {offset} is beyond the end of the log ({end})")
        return offset

    def _clamp(self, offset: int) -> int:
        return max(offset, log_start(self.directory))

    def _write_checkpoint(self, offset: int) -> None:
        for attempt in range(COMMIT_ATTEMPTS):
            try:
                write_checkpoint(self.log.fs, self.directory, self.name, offset)
                return
            except FileNotFoundError:
                # another process opening the log removed our ``.tmp`` as a leftover
                if attempt == COMMIT_ATTEMPTS - 1:
                    raise

    def _checklog_start(self) -> None:
        """Resume at the log start if the position fell below it; report the event."""
        start = log_start(self.directory)
        if self._position < start and self._quiet:
            self._position = start
        elif self._position < start:
            event = SkipEvent(self.name, self._position, start, self.log.clock())
            self.skipped.append(event)
            logger.warning(
                "subscriber %r: position %d is below the log start %d (retention removed "
                "%d offsets it had not read); resuming at %d",
                self.name,
                event.from_offset,
                start,
                event.offsets_skipped,
                start,
            )
            self._position = start

    def _head(self) -> Head | None:
        if self._fds.lock_fd < 0:
            try:
                self._fds.lock_fd = os.open(
                    os.path.join(self.directory, filenames.WRITER_LOCK),
                    os.O_RDONLY | os.O_CLOEXEC,
                )
            except FileNotFoundError:
                return None
        return read_published_head(self._fds.lock_fd)

    def _end_offset(self) -> int:
        head = self._head()
        return head.end_offset if head is not None else self.log.end_offset

    def _wake(self) -> bool:
        return self._closing or self.log.closed or self._head_has_more()

    def _head_has_more(self) -> bool:
        head = self._head()
        return head is None or head.end_offset > self._position

    def _watcher(self) -> HeadWatcher:
        if self._fds.watcher is None:
            self._fds.watcher = HeadWatcher(os.path.join(self.directory, filenames.WRITER_LOCK))
        return self._fds.watcher

    # -- internals: reading ----------------------------------------------------------------
    def _read(self, max_records: int, max_bytes: int | None) -> list[RecordBatch]:
        head = self._head()
        if head is None:
            return self._read_without_head(max_records, max_bytes)
        out: list[RecordBatch] = []
        records = 0
        size = 0
        reopened = False
        while self._position < head.end_offset and records < max_records:
            if max_bytes is not None and size >= max_bytes:
                break
            cursor = self._fds.cursor or self._establish()
            if cursor is None or cursor.base > head.active_base:
                break  # nothing readable yet, or a segment newer than the head we read
            batch = cursor.next()
            if batch is None:
                if cursor.base == head.active_base:
                    break  # the active segment's data ends here for now
                if not cursor.at_end():
                    if not cursor.reader.last_segment or reopened:
                        break  # (a closed segment's reader raises on anything else)
                    # opened as the newest segment, closed since: read it again as closed
                    self._fds.drop_cursor()
                    reopened = True
                    continue
                if not self._advance(cursor):
                    break
                continue
            position = self._position
            if batch.next_offset <= position:
                continue
            start = int(np.searchsorted(batch.offsets, position))
            if start:
                batch = batch.split(start)[1]  # (the rest of a batch begun before)
            if not len(batch):
                self._position = batch.next_offset
                continue
            room_bytes = None if max_bytes is None else max_bytes - size
            batch, rest = self._take(batch, max_records - records, room_bytes)
            cursor.pending = rest
            out.append(batch)
            records += len(batch)
            size += batch.size_bytes
        return out

    def _establish(self) -> Cursor | None:
        """Open the segment holding the position (after a skip check), from a fresh listing."""
        self._checklog_start()
        for _attempt in range(5):
            bases = list_segments(self.directory)
            if not bases:
                return None
            i = max(bisect.bisect_right(bases, self._position) - 1, 0)
            base = bases[i]
            try:
                reader = SegmentReader(
                    self.directory,
                    base,
                    last_segment=base == bases[-1],
                    head=self._head,
                    mapped=False,
                )
            except MissingSegmentError:
                self._checklog_start()  # retention removed it meanwhile
                continue
            try:
                if reader.empty:
                    reader.close()
                    return None  # a newest segment whose header is not written (yet)
                pos = scan_start(reader.fd, self.directory, base, self._position)
                cursor = Cursor(reader, pos)
            except BaseException:
                reader.close()
                raise
            self._fds.cursor = cursor
            return cursor
        return None

    def _advance(self, cursor: Cursor) -> bool:
        """The closed segment under ``cursor`` is read to its end: move to the segment
        holding the following offsets. ``False`` if there is none yet."""
        self._fds.drop_cursor()
        bases = list_segments(self.directory)
        j = bisect.bisect_left(bases, cursor.base)
        if j < len(bases) and bases[j] == cursor.base:
            try:
                same = os.stat(segment_path(self.directory, cursor.base)).st_ino == cursor.ino
            except FileNotFoundError:
                same = False
            if same:
                if j + 1 >= len(bases):
                    return False
                # every offset of this unchanged file is below the next base; offsets
                # between the position and this base (if any) are in no file
                self._position = max(self._position, bases[j + 1])
        # else the file was replaced by a rewrite or removed: look the position up again
        return True

    def _read_without_head(self, max_records: int, max_bytes: int | None) -> list[RecordBatch]:
        """No valid head (after a repair, before the next writer): the general reader,
        which tolerates an in-progress tail on its own."""
        self._fds.drop_cursor()
        self._checklog_start()
        out: list[RecordBatch] = []
        records = 0
        size = 0
        for batch in iter_batches(self.directory, self._position, self.log.end_offset):
            if records >= max_records or (max_bytes is not None and size >= max_bytes):
                break
            room_bytes = None if max_bytes is None else max_bytes - size
            batch, _rest = self._take(batch, max_records - records, room_bytes)
            out.append(batch)
            records += len(batch)
            size += batch.size_bytes
        return out

    def _take(
        self, batch: RecordBatch, room: int, room_bytes: int | None
    ) -> tuple[RecordBatch, RecordBatch | None]:
        """Cut ``batch`` to at most ``room`` records (a run of small stored batches also to
        about ``room_bytes``: a stored batch is handed out whole) and move the position past
        what is taken; the rest, if any, is for the next poll."""
        if room_bytes is not None and batch.stored_batches > 1 and batch.size_bytes > room_bytes:
            room = min(room, max(len(batch) * room_bytes // batch.size_bytes, 1))
        if len(batch) > room:
            batch, rest = batch.split(room)
            self._position = int(batch.offsets[-1]) + 1
            return batch, rest
        self._position = batch.next_offset
        return batch, None


def _check_limit(value: object, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SubscriberError(f"{what} must be a positive int, not {value!r}")


__all__ = [
    "SkipEvent",
    "Subscriber",
    "SubscriberLag",
    "acquire_name_lock",
    "backlog",
    "is_transient",
    "lag_report",
    "name_holder",
    "remove_subscriber",
    "set_committed",
    "validate_name",
]
