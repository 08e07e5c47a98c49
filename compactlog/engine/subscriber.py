"""Subscribers: independent readers of one log, durable (checkpointed) or transient (JLog).

A durable subscriber keeps its committed position in ``cp.<hex(name)>`` (``state_files``);
a name starting with ``~`` is transient: it starts at the end of the log, keeps no file and
its :meth:`Subscriber.commit` does nothing. Positions are offsets, and offsets never change
(compaction keeps them), so a checkpoint stays valid across cleans.

Reading (the tailing fast path). A subscriber reads segments as ``read()`` does, through
:class:`~compactlog.segment.SegmentReader` (one reader of the bytes, one rule for torn
tails: ``segment.judge_damage``). It keeps a *cursor*: the segment holding its position
open as a ``SegmentReader``, that reader's walk of the batches in progress (kept between
polls, so a chunk read is parsed once) and the decoded rest of a batch a poll did not take
(handed out by later polls without decoding it again, ``RecordBatch.split``). Each poll
reads the shared head from ``.lock`` (one ``pread``), which also bounds the reader: the
active segment is read up to ``head.active_size``, so an append in progress is never looked
at; a closed segment is read to its end. When a segment is exhausted the cursor is
re-established *by offset* from a fresh directory listing, exactly like
``reader.iter_batches``: a segment the cleaner replaced is read to its end as it was (the
reader's descriptor keeps the old inode) and the next lookup lands wherever the following
offsets live now.

Falling behind the log start. Retention may delete segments a subscriber has not read
(``delete`` policy, or an operator's repair; ``consumed`` retention never does that to a
durable subscriber). Whenever the cursor is (re)established, the position is compared
with the log start offset in ``meta``; if it is below, the subscriber resumes at the log
start, appends a :class:`SkipEvent` to :attr:`Subscriber.skipped` and logs a warning on the
``compactlog.engine.subscriber`` logger. It never stalls (JLog's stalled-subscriber pathology).

Waiting. ``poll(timeout_s=t)`` waits for the head's end offset to pass the position. On
Linux it watches ``.lock`` with inotify. Writers publish the head with a store into their
mmap of the file, which inotify does not see, so before sleeping the subscriber sets the
*doorbell* byte there (``head.py``) and the next writer answers it with one ``pwrite`` of the
head, which wakes every sleeper at once; it re-checks at least every ``INOTIFY_SAFETY_S``
in case an event is lost. Where inotify is missing or found not to
fire, it sleeps in steps growing from 50 us to 2 ms between reads of the head.

Exclusive consumers. A durable name has one consumer at a time, in all processes and
threads (Kafka: one consumer per partition and group): the :class:`Subscriber` holds an
``flock`` on ``.cp.<hex(name)>.lock`` (``filenames.subscriber_lock_name``) from construction
to :meth:`Subscriber.close` (or :meth:`Log.close`, or garbage collection), and another
``subscribe(name)`` raises :class:`SubscriberBusyError` naming the holder's pid. The kernel
drops the lock with the holder's last descriptor, so a ``kill -9``-ed consumer never blocks
its successor. See :func:`acquire_name_lock` for the protocol. Transient (``~``) names take
no lock: each transient subscriber is private to its object.

Crash safety of :meth:`Subscriber.commit`: the checkpoint is replaced by
``FileSystem.write_atomic`` (temp, fsync, rename, fsync directory), so a ``kill -9`` at any
instant leaves the old or the new position. A restarted subscriber resumes at its last
committed position: it re-delivers what it had not committed (at-least-once) and never
skips.
"""

from __future__ import annotations

import asyncio
import bisect
import errno
import fcntl
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterator
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
from ..storage import filenames, lockfile
from ..storage.head import Head, read_log_head, read_published_head
from ..storage.segment import (
    HEADER_SIZE,
    SegmentReader,
    list_segments,
    segment_data_size,
    segment_path,
)
from ..storage.state_files import read_checkpoint_file, read_meta, write_checkpoint
from ..storage.tail import scan_start
from .reader import iter_batches
from .watch import SLEEP_MAX_S, SLEEP_MIN_S, HeadWatcher

if TYPE_CHECKING:
    from .logview import LogView

logger = logging.getLogger("compactlog.subscriber")

TRANSIENT_PREFIX = "~"
MAX_NAME_BYTES = 255
COMMIT_ATTEMPTS = 3  # a log opened elsewhere removes stray ``.tmp`` files: retry then
HOLDER_RECORD_BYTES = 32  # ``pid <n>`` padded: rewritten in place by one pwrite
HOLDER_READ_ATTEMPTS = 20  # a holder that just took the lock writes its pid a moment later


# -- names ---------------------------------------------------------------------------------


def validate_name(name: object) -> str:
    """The name itself if it is a valid subscriber name, else :class:`SubscriberError`."""
    if not isinstance(name, str):
        raise SubscriberError(f"a subscriber name must be a str, not {type(name).__name__}")
    if not name:
        raise SubscriberError("a subscriber name must not be empty")
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError as error:
        raise SubscriberError(f"subscriber name {name!r} is not valid UTF-8 ({error})") from None
    if len(encoded) > MAX_NAME_BYTES:
        raise SubscriberError(
            f"subscriber name is {len(encoded)} bytes in UTF-8; at most {MAX_NAME_BYTES} allowed"
        )
    return name


def is_transient(name: str) -> bool:
    return name.startswith(TRANSIENT_PREFIX)


def _load_checkpoint(directory: str, name: str) -> int | None:
    """The committed offset of durable subscriber ``name``, or ``None`` if it has none."""
    file_name = filenames.checkpoint_name(name)
    try:
        stored, offset = read_checkpoint_file(directory, file_name)
    except FileNotFoundError:
        return None
    if stored != name:
        raise SubscriberError(
            f"checkpoint {file_name} belongs to subscriber {stored!r}, not {name!r}",
            path=directory,
        )
    return offset


def _log_start(directory: str) -> int:
    """The log start offset as ``meta`` on disk says now (other processes move it)."""
    return read_meta(directory).log_start_offset


# -- one consumer per name ---------------------------------------------------------------


def _lock_path(directory: str, name: str) -> str:
    return os.path.join(directory, filenames.subscriber_lock_name(name))


def _read_holder(fd: int) -> int | None:
    """The pid a holder wrote into its lock file, ``None`` if there is none (yet)."""
    for _attempt in range(HOLDER_READ_ATTEMPTS):
        text = os.pread(fd, HOLDER_RECORD_BYTES, 0).decode("ascii", errors="replace").split()
        if len(text) == 2 and text[0] == "pid" and text[1].isdigit():
            return int(text[1])
        time.sleep(0.001)
    return None


def _busy(directory: str, name: str, pid: int | None) -> SubscriberBusyError:
    if pid is None:
        who = "another consumer (pid unknown)"
    elif pid == os.getpid():
        who = f"pid {pid} (this process: another Subscriber object or thread)"
    else:
        who = f"pid {pid}"
    return SubscriberBusyError(
        f"subscriber {name!r} is in use by {who}; a durable subscriber has one consumer at "
        "a time: close that one first (its lock goes with its process)",
        subscriber=name,
        pid=pid,
        path=directory,
    )


def acquire_name_lock(directory: str, name: str) -> int:
    """Take durable subscriber ``name``'s lock; return the descriptor that holds it.

    Raises :class:`SubscriberBusyError` (naming the holder's pid) when it is held.
    Closing the descriptor releases it, as does the death of the process.

    Protocol (each step is safe to crash in; the lock is an ``flock``, never a file's
    existence):

    1. Open ``.cp.<hex(name)>.lock``, creating it if missing.
    2. ``flock(LOCK_EX | LOCK_NB)``. If held: read the holder's pid from the file and
       raise :class:`SubscriberBusyError`.
    3. Compare the descriptor's inode with the path's: if :func:`remove_subscriber`
       unlinked the file between steps 1 and 2, this lock is on an orphan inode that
       nobody else can find; close it and start again at 1.
    4. Write ``pid <our pid>`` (fixed width, one ``pwrite``) at byte 0 for the next
       contender's message. A crash here leaves a stale pid in a file nobody holds:
       harmless, the next holder overwrites it.
    """
    path = _lock_path(directory, name)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise _busy(directory, name, _read_holder(fd)) from None
            try:
                same = os.stat(path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:
                os.close(fd)
                continue
            record = f"pid {os.getpid()}".ljust(HOLDER_RECORD_BYTES - 1) + "\n"
            os.pwrite(fd, record.encode("ascii"), 0)
            return fd
        except BaseException:
            try:
                os.close(fd)
            except OSError:
                pass
            raise


def _acquire_or_degrade(directory: str, name: str) -> int:
    """:func:`acquire_name_lock`, except where the lock file cannot be created (a log on a
    read-only file system or directory): such a subscriber cannot commit either, so two of
    them cannot overwrite each other's position; it runs without the lock (a warning says
    so)."""
    try:
        return acquire_name_lock(directory, name)
    except OSError as error:
        if error.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        logger.warning(
            "subscriber %r: cannot create its lock file (%s); running without exclusivity",
            name,
            error.strerror,
        )
        return -1


def name_holder(directory: str, name: str) -> int | None:
    """The pid consuming durable subscriber ``name`` now (0 if its pid is unreadable), or
    ``None`` if nobody is.

    Reads ``/proc/locks`` so that looking never takes the name from a consumer starting
    at that instant; where there is no ``/proc/locks`` it probes with a shared lock taken
    and dropped at once. For display (``compactlog subscribers list``), never for a
    decision: the answer may be stale by the time it is read.
    """
    try:
        fd = os.open(_lock_path(directory, name), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        holders = lockfile.holders(fd)
        if holders is not None:
            if not holders:
                return None
            written = _read_holder(fd)
            return written if written in holders else min(holders)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_holder(fd)
            return pid if pid is not None else 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


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


@dataclass(frozen=True, slots=True)
class SubscriberLag:
    """One durable subscriber, as an operator sees it (JLog's ``jlogctl subscriber``)."""

    name: str
    committed: int
    lag_records: int  # offsets from the committed position to the end (an upper bound)
    lag_bytes: int  # segment bytes at or after the committed position
    lag_segments: int  # segments holding unread bytes
    pending_segments: int  # closed segments not fully consumed: consumed retention keeps them
    below_log_start: bool  # it will skip to the log start on its next poll


def backlog(log: LogView, offset: int) -> tuple[int, int]:
    """``(bytes, segments)`` of segment data holding offsets at or after ``offset``."""
    directory = log.directory
    bases = list_segments(directory)
    if not bases:
        return 0, 0
    i = max(bisect.bisect_right(bases, offset) - 1, 0)
    total = 0
    segments = 0
    head = read_log_head(directory)
    for j in range(i, len(bases)):
        base = bases[j]
        try:
            size = segment_data_size(directory, base, head)
            skip = _byte_position(directory, base, offset, last=j == len(bases) - 1)
        except (FileNotFoundError, MissingSegmentError):
            continue  # removed meanwhile
        unread = max(size - skip, 0)
        if unread:
            total += unread
            segments += 1
    return total, segments


def _byte_position(directory: str, base: int, offset: int, *, last: bool) -> int:
    """Byte position in segment ``base`` of the first batch holding an offset >= ``offset``."""
    if offset <= base:
        return HEADER_SIZE
    with SegmentReader(directory, base, last_segment=last) as reader:
        end = reader.readable_size()
        for position, header in reader.headers(scan_start(reader.fd, directory, base, offset)):
            if header.next_offset > offset:
                return position
        return end


def lag_report(log: LogView) -> list[SubscriberLag]:
    """Every durable subscriber with its lag in records, bytes and segments, slowest first.

    ``pending_segments`` counts the closed segments it has not consumed entirely: under
    ``cleanup_policy="consumed"`` the slowest subscriber's count is what stays on disk.
    """
    bases = list_segments(log.directory)
    closed_next = bases[1:]  # a closed segment's offsets are all below the next base
    start = _log_start(log.directory)
    end = log.end_offset
    report = []
    for name, committed in log.subscribers().items():
        lag_bytes, lag_segments = backlog(log, committed)
        report.append(
            SubscriberLag(
                name=name,
                committed=committed,
                lag_records=max(end - max(committed, start), 0),
                lag_bytes=lag_bytes,
                lag_segments=lag_segments,
                pending_segments=sum(1 for nxt in closed_next if nxt > committed),
                below_log_start=committed < start,
            )
        )
    report.sort(key=lambda r: (r.committed, r.name))
    return report


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
        if _load_checkpoint(log.directory, name) is None:
            raise SubscriberError(f"no durable subscriber named {name!r}", path=log.directory)
        try:
            log.fs.remove(os.path.join(log.directory, filenames.checkpoint_name(name)))
        except FileNotFoundError:
            raise SubscriberError(
                f"no durable subscriber named {name!r}", path=log.directory
            ) from None
        if lock_fd >= 0:
            try:
                os.unlink(_lock_path(log.directory, name))
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
    if _load_checkpoint(log.directory, name) is None:
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
        target = max(offset, _log_start(log.directory))
        write_checkpoint(log.fs, log.directory, name, target)
        return target
    with subscriber:
        subscriber.seek(offset)
        subscriber.commit()
        return subscriber.position


# -- the subscriber ------------------------------------------------------------------------


class _Cursor:
    """Where a subscriber reads: the segment holding its position, open as a
    :class:`SegmentReader` (the one reader of segments, shared with ``read()``), the walk
    of its batches in progress (kept between polls: what one read fetched is parsed once)
    and the rest of a decoded batch not handed out yet (decoded once, however many polls
    take it)."""

    __slots__ = ("batches", "ino", "pending", "pos", "reader")

    def __init__(self, reader: SegmentReader, pos: int) -> None:
        self.reader = reader
        self.ino = os.fstat(reader.fd).st_ino
        self.pos = pos  # the byte after the last batch taken from the walk
        self.batches: Iterator[RecordBatch] | None = None
        self.pending: RecordBatch | None = None

    @property
    def base(self) -> int:
        return self.reader.base

    def next(self) -> RecordBatch | None:
        """The next batch (a run of small ones comes as one): what is pending, else the
        walk's next; ``None`` where the readable data ends for now (a new walk starts
        there next time, seeing what was written since)."""
        if self.pending is not None:
            batch, self.pending = self.pending, None
            return batch
        if self.batches is None:
            self.batches = self.reader.runs(self.pos)
        try:
            batch = next(self.batches, None)
        except BaseException:
            self.batches = None  # (a walk that raised is over: the next starts anew)
            raise
        if batch is None:
            self.batches = None
            return None
        self.pos = batch.position + batch.size_bytes
        return batch

    def at_end(self) -> bool:
        """Whether the walk reached the end of the file (not a torn tail before it)."""
        return self.pending is None and self.pos >= os.fstat(self.reader.fd).st_size

    def close(self) -> None:
        if self.batches is not None:
            self.batches.close()
            self.batches = None
        self.pending = None
        self.reader.close()


class _Descriptors:
    """The file descriptors a subscriber holds; closed by :meth:`Subscriber.close` or,
    if the user forgets, when the subscriber is garbage collected."""

    def __init__(self) -> None:
        self.lock_fd = -1
        self.name_lock_fd = -1  # durable names: the flock making this the only consumer
        self.cursor: _Cursor | None = None
        self.watcher: HeadWatcher | None = None

    def drop_cursor(self) -> None:
        if self.cursor is not None:
            self.cursor.close()
            self.cursor = None

    def close(self) -> None:
        self.drop_cursor()
        if self.watcher is not None:
            self.watcher.close()
            self.watcher = None
        if self.lock_fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1
        if self.name_lock_fd >= 0:  # last: the name is free once nothing else is open
            os.close(self.name_lock_fd)
            self.name_lock_fd = -1


class Subscriber:
    """One reader of a log with its own position. See the module docstring.

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
        self._fds = _Descriptors()
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
            self._fds.name_lock_fd = _acquire_or_degrade(self.directory, name)
        try:
            self._fds.lock_fd = os.open(
                os.path.join(self.directory, filenames.WRITER_LOCK), os.O_RDONLY | os.O_CLOEXEC
            )
        except FileNotFoundError:
            self._fds.lock_fd = -1
        if start is not None:
            start = self._check_offset(start, "start")
        committed = None if self.transient else _load_checkpoint(self.directory, name)
        self._committed: int | None = committed
        # until it first reads, a subscriber placed by ``start``/``seek``/"the log start" only
        # follows a moving log start silently: it never had those records to lose
        self._quiet = committed is None
        if committed is not None:
            # an existing checkpoint wins over ``start``: ``start`` places a *new* subscriber
            self._position = committed
            self._check_log_start()
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
            self._position = self._clamp(start) if start is not None else _log_start(self.directory)
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
        return max(offset, _log_start(self.directory))

    def _write_checkpoint(self, offset: int) -> None:
        for attempt in range(COMMIT_ATTEMPTS):
            try:
                write_checkpoint(self.log.fs, self.directory, self.name, offset)
                return
            except FileNotFoundError:
                # another process opening the log removed our ``.tmp`` as a leftover
                if attempt == COMMIT_ATTEMPTS - 1:
                    raise

    def _check_log_start(self) -> None:
        """Resume at the log start if the position fell below it; report the event."""
        start = _log_start(self.directory)
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

    def _establish(self) -> _Cursor | None:
        """Open the segment holding the position (after a skip check), from a fresh listing."""
        self._check_log_start()
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
                self._check_log_start()  # retention removed it meanwhile
                continue
            try:
                if reader.empty:
                    reader.close()
                    return None  # a newest segment whose header is not written (yet)
                pos = scan_start(reader.fd, self.directory, base, self._position)
                cursor = _Cursor(reader, pos)
            except BaseException:
                reader.close()
                raise
            self._fds.cursor = cursor
            return cursor
        return None

    def _advance(self, cursor: _Cursor) -> bool:
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
        self._check_log_start()
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
