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
from time import monotonic
from typing import NamedTuple

from .fsio import FileSystem
from .head import SYNC_POINT_AT, SYNC_POINT_END, encode_sync_point
from .segment import segment_path

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
