"""Durability for the writer: what a sync covers, group commit, and the sync point.

A sync (``SegmentWriter._run_sync``) takes a :class:`SyncJob` from :class:`SyncJobs` (the
active segment as it is now, the segments left behind since the last sync and whether the
directory changed), fsyncs it with :func:`sync_files`, then stores the sync point
(:class:`SyncPoint`, head.py). :class:`GroupCommit` lets many threads wait for one sync:
the first one to find no sync running runs one for everyone's writes so far.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Callable
from contextlib import nullcontext
from time import monotonic
from typing import TYPE_CHECKING, Any, NamedTuple

from ..config import LogConfig
from ..errors import WriteRefusedError
from .fsio import FileSystem
from .head import SYNC_POINT_AT, SYNC_POINT_END, encode_sync_point
from .segment import segment_path

if TYPE_CHECKING:
    from .active import ActiveSegment

SYNC_POINT_SECONDS = 1.0  # how stale the durable sync point may get (see SyncPoint.store)
SYNC_POINT_BYTES = 1 << 20


class SyncJob(NamedTuple):
    retired: list[int]  # bases of segments left behind since the last sync
    active_fd: int
    dir_dirty: bool
    base: int  # the active segment and its size when the job was taken
    size: int


class SyncJobs:
    """What the next sync must cover besides the active segment (the writer's lock guards
    it): the segments left behind since the last one, and whether the directory changed."""

    __slots__ = ("dir_dirty", "retired")

    def __init__(self) -> None:
        self.retired: list[int] = []  # bases of segments left behind, not yet fsynced
        self.dir_dirty = False

    def take(self, active_fd: int, base: int, size: int) -> SyncJob:
        """The job for the active segment ``base`` of ``size`` bytes; the rest is cleared."""
        retired, self.retired = self.retired, []
        dir_dirty, self.dir_dirty = self.dir_dirty, False
        return SyncJob(retired, active_fd, dir_dirty, base, size)


def sync_files(fs: FileSystem, directory: str, job: SyncJob) -> None:
    """fdatasync the segments left behind and the active one, then fsync the directory if
    it changed."""
    for base in job.retired:
        _sync_closed_segment(fs, directory, base)
    fs.fdatasync(job.active_fd)
    if job.dir_dirty:
        fs.fsync_dir(directory)


def _sync_closed_segment(fs: FileSystem, directory: str, base: int) -> None:
    try:
        fd = fs.open(segment_path(directory, base), os.O_RDONLY)
    except FileNotFoundError:
        return  # removed by retention, or replaced by a cleaner that fsynced its output
    try:
        fs.fdatasync(fd)
    finally:
        fs.close(fd)


class SyncPoint:
    """The sync point in ``.lock`` (head.py): as last stored, and as last made durable."""

    def __init__(self, fs: FileSystem, lock_fd: int, head_map: mmap.mmap) -> None:
        self._fs = fs
        self._lock_fd = lock_fd
        self._head_map = head_map
        self.stored = (-1, -1)  # (base, size) as last stored
        self._durable = (-1, -1)
        self._durable_at = float("-inf")
        self.force = False  # make the next one durable whatever its age (flush, close)

    def store(self, job: SyncJob) -> None:
        """Store the sync point into ``.lock`` (caller holds the writer's lock).

        Stored after every sync (no system call), made durable with an ``fdatasync`` of
        ``.lock`` only when it names a new segment (a roll: so that a missing active segment
        is known to have held synced data), when ``flush()``/``close()`` ask, and otherwise
        at most once per :data:`SYNC_POINT_SECONDS` or :data:`SYNC_POINT_BYTES`: a point
        that is older on disk only widens the tail that recovery may cut after a power loss
        (all of it unsynced data or, at worst, synced data a disk damaged), never loses an
        acknowledged record."""
        self.stored = (job.base, job.size)
        self._head_map[SYNC_POINT_AT:SYNC_POINT_END] = encode_sync_point(job.base, job.size)
        durable_base, durable_size = self._durable
        now = monotonic()
        if (
            self.force
            or job.dir_dirty
            or job.base != durable_base
            or job.size - durable_size >= SYNC_POINT_BYTES
            or now - self._durable_at >= SYNC_POINT_SECONDS
        ):
            self._fs.fdatasync(self._lock_fd)
            self._durable = (job.base, job.size)
            self._durable_at = now
            self.force = False


class GroupCommit:
    """Writes numbered in sequence, and threads waiting for theirs to be on disk: the first
    waiter to find no sync running runs one that covers every write so far; the others wait
    for it, and most find their write covered."""

    def __init__(self) -> None:
        self.synced_seq = 0
        self._cond = threading.Condition()
        self._syncing = False

    def wait_for(
        self, seq: int, sync_once: Callable[[], int], refusal: Callable[[], Exception | None]
    ) -> None:
        """Return once every write up to ``seq`` is on disk. ``sync_once`` syncs and returns
        the sequence number its sync covered; ``refusal`` is the error to raise instead
        (a failed fsync stops the writer) or ``None``."""
        with self._cond:
            while self.synced_seq < seq:
                error = refusal()
                if error is not None:
                    raise error
                if self._syncing:
                    self._cond.wait()
                    continue
                self._syncing = True
                try:
                    self._cond.release()
                    try:
                        target = sync_once()
                    finally:
                        self._cond.acquire()
                    self.synced_seq = max(self.synced_seq, target)
                finally:
                    self._syncing = False
                    self._cond.notify_all()

    def synced(self, seq: int) -> None:
        """Every write up to ``seq`` is on disk (a sync run outside :meth:`wait_for`)."""
        with self._cond:
            self.synced_seq = max(self.synced_seq, seq)


class WriterSyncs:
    """The writer's syncs (a part of ``SegmentWriter``, which the mixin joins).

    ``sync="always"`` fsyncs before ``append*`` returns, with group commit (threads that
    find the writer busy queue their records, and the next holder writes and syncs them
    together), and before the head publishes the records: readers never see a record a
    power loss could take back. ``"interval"`` fsyncs from the background thread, which
    also writes the linger buffer and materializes the precommit buffer; ``"os"`` leaves it
    to the kernel. ``flush()`` fsyncs under every policy. After each sync the writer stores
    the sync point into ``.lock`` (head.py): what recovery may cut after a power loss
    starts there.
    """

    # what the syncs use of the writer
    directory: str
    fs: FileSystem
    config: LogConfig
    lock: threading.Lock
    active: ActiveSegment | None
    closed: bool
    steady: bool
    sync_failed: OSError | None
    write_seq: int
    linger: Any
    precommit: Any
    _group_commit: GroupCommit
    _sync_jobs: SyncJobs
    _sync_point: SyncPoint
    _stop: threading.Event
    _kick: threading.Event
    _background: threading.Thread | None

    def start_background(self) -> None:
        """Start the interval thread (interval fsync, precommit materialization and the
        linger timer)."""
        if (
            self.config.sync == "interval"
            or self.config.precommit_bytes > 0
            or self.linger is not None
        ):
            self._background = threading.Thread(
                target=self._background_loop, name="compactlog-sync", daemon=True
            )
            self._background.start()

    def _background_loop(self) -> None:
        interval = self.config.sync_interval_ms / 1000
        linger = self.config.linger_ms / 1000
        next_interval = monotonic() + interval
        while True:
            self._kick.wait(self._background_wait(next_interval, linger))
            self._kick.clear()
            if self._stop.is_set():
                break
            try:
                if self.linger is not None:
                    self.flush_linger(older_than=linger)
                now = monotonic()
                if now < next_interval:
                    continue
                next_interval = now + interval
                if self.precommit is not None and self.precommit.count:
                    self.materialize()
                if self.config.sync == "interval":
                    self.sync_all()
            except Exception:
                continue

    def _background_wait(self, next_interval: float, linger: float) -> float:
        now = monotonic()
        wait = next_interval - now
        buffer = self.linger
        # a racy read is fine: a record buffered after it kicks the thread awake (an empty
        # buffer has no deadline, the next interval is the only one)
        if buffer is not None and buffer.count:
            wait = min(wait, buffer.started + linger - now)
        return max(wait, 0.0005)

    def sync_through(self, seq: int) -> None:
        """Return once every write up to ``seq`` is on disk (group commit)."""
        self._group_commit.wait_for(seq, self._sync_once, self._failed_sync)

    def sync_all(self, *, record_point: bool = False) -> None:
        """Make every write so far durable; ``record_point`` also makes the sync point durable
        (``flush()`` and ``close()``: so that the next open after a power loss can tell
        corruption from unsynced data in all of it)."""
        if record_point:
            self._sync_point.force = True
        self.sync_through(self.write_seq)
        if record_point and self._sync_point.force:
            with self.lock:  # nothing was left to sync: record the point anyway
                if self.active is not None and self.sync_failed is None:
                    self._run_sync(self._take_sync_job(dup=False))

    def _sync_once(self) -> int:
        with self.lock:
            if self.active is None:
                return self.write_seq
            target = self.write_seq
            job = self._take_sync_job(dup=True)
        try:
            self._run_sync(job, locked=False)
        finally:
            os.close(job.active_fd)
        return target

    def _sync_locked(self) -> None:
        """``sync="always"``: make what is written durable *before* the head publishes it
        (caller holds ``self.lock``), so that no reader in any process sees, and no
        subscriber commits, a record a power loss could take back (docs/subscribers.md). A
        thread whose record arrives meanwhile queues it (:meth:`_append_queued`), and the
        next holder writes and syncs the whole queue at once: group commit."""
        active = self.active
        if active is None:
            return
        if self.sync_failed is not None:
            raise self._sync_refusal()
        jobs = self._sync_jobs
        if (active.base, active.size) != self._sync_point.stored or jobs.retired or jobs.dir_dirty:
            self._run_sync(self._take_sync_job(dup=False), locked=True)
        self._group_commit.synced(self.write_seq)

    def _take_sync_job(self, *, dup: bool) -> SyncJob:
        """What the next sync covers, as of now (caller holds ``self.lock``)."""
        active = self.active
        assert active is not None
        fd = os.dup(active.fd) if dup else active.fd
        return self._sync_jobs.take(fd, active.base, active.size)

    def _run_sync(self, job: SyncJob, *, locked: bool = True) -> None:
        """fdatasync the segments, fsync the directory, then store the sync point (and make
        it durable now and then: see ``durability.SyncPoint.store``). ``locked``: the caller
        holds ``self.lock`` (else it is taken for the bookkeeping only)."""
        guard = nullcontext() if locked else self.lock
        try:
            sync_files(self.fs, self.directory, job)
            with guard:
                if not self.closed:
                    self._sync_point.store(job)
        except OSError as error:
            with guard:
                self._stop_after_failed_sync(error)
            raise self._sync_refusal() from error

    def _stop_after_failed_sync(self, error: OSError) -> None:
        """After a failed fsync the kernel may have dropped the dirty pages and a retry would
        report success for data that is gone (PostgreSQL's "fsyncgate"), so the writer stops
        (caller holds ``self.lock``): appends and flushes are refused until the log is
        reopened, and the reopen validates the tail against what is really on disk."""
        self.sync_failed = error
        self.steady = False

    def _failed_sync(self) -> WriteRefusedError | None:
        return None if self.sync_failed is None else self._sync_refusal()

    def _sync_refusal(self) -> WriteRefusedError:
        return WriteRefusedError(
            f"an fsync failed ({self.sync_failed}); records since the last successful sync "
            "may not be durable; appends and flushes are refused until the log is reopened",
            path=self.directory,
        )

    def _fdatasync(self, fd: int) -> None:
        """``fdatasync`` on the append path (a roll); a failure stops the writer as a failed
        sync does (see :meth:`_run_sync`)."""
        try:
            self.fs.fdatasync(fd)
        except OSError as error:
            self._stop_after_failed_sync(error)
            raise
