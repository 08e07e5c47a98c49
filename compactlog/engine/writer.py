"""Appending: the writers' lock, the head state, segment rolls, the index.

One :class:`SegmentWriter` per open log (not read-only), shared by threads through
``self.lock`` and by processes through ``flock`` on ``.lock`` and its head (``head.py``).
Crash protocols: ``_write_locked`` and ``_roll``. Its linger, precommit and sync parts are
in ``linger.py``, ``precommit.py`` and ``storage/durability.py``; docs/architecture.md.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from fcntl import LOCK_EX, LOCK_UN, flock
from os import pwrite
from time import monotonic
from typing import Any, NamedTuple

from ..config import LogConfig
from ..encoding.batch_encode import EncodedBatch, encode_single
from ..encoding.format import BATCH_HEADER, INDEX_FILE_HEADER, SEGMENT_FILE_HEADER
from ..errors import LogClosedError, WriteRefusedError
from ..storage import filenames
from ..storage.active import ActiveSegment
from ..storage.durability import GroupCommit, SyncJobs, SyncPoint, WriterSyncs
from ..storage.fsio import FileSystem
from ..storage.head import (
    BOOT,
    BOOT_AT,
    BOOT_END,
    DOORBELL,
    FLAG_PRECOMMIT_PENDING,
    PUBLISHED_SIZE,
    WRITING_MARK,
    Head,
    encode_head,
    lock_exclusive,
    map_lock_file,
    publish_end_into,
    read_head,
    unlock,
)
from ..storage.publish import PublishedHead
from ..storage.segment import HEADER_SIZE, index_path, segment_path
from ..storage.tail import open_newest_tail
from ..storage.tailmap import AVAILABLE as TAIL_MAP_AVAILABLE
from ..storage.tailmap import RETRYABLE, TailWindow
from .linger import LingerAppends, LingerBuffer
from .precommit import PrecommitAppends, PrecommitBuffer

SPACE_CHECK_SECONDS = 0.5
SPACE_CHECK_BYTES = 4 << 20
IOV_MAX = 1024  # buffers per pwritev (Linux's limit)


class FastPathHooks(NamedTuple):
    """What the plain append path (``single.py``) binds once, as local names, from its
    writer (:meth:`SegmentWriter.fast_path_hooks`); the steps it does not inline.

    Besides these, the path reads and writes the writer's public per-append state:
    ``active``, ``end_offset``, ``write_seq``, ``flock_held``, ``closed``, ``sync_failed``
    and ``steady`` (attributes, read on every call), ``lock``, ``lock_fd`` and
    ``head_map``.
    """

    append_queued: Callable[[list[Any]], int]  # the lock was busy: queue for a group write
    prepare_append: Callable[[], bool]  # not steady: checks, flock, catch up; took the flock?
    catch_up: Callable[[], None]  # another process wrote or died: reopen the active segment
    checkpoint: Callable[[int, int], ActiveSegment]  # past plain_stop/plain_deadline
    refusal: Callable[[OSError], WriteRefusedError]
    ring_doorbell: Callable[[], None]
    published: bytearray  # the head as last published, packed in place (publish.py)
    published_fields: memoryview  # its fields the head's CRC covers


class Findings(NamedTuple):
    """What reopening the active segment found (``SegmentWriter.take_findings``)."""

    torn_bytes: int  # cut off the newest segment, in all
    cuts: list[tuple[str, int, int]]  # (file, byte, bytes) of each cut
    rebuilt_indexes: list[int]  # bases
    precommit_recovered: int  # entries a dead writer left, materialized


class SegmentWriter(LingerAppends, PrecommitAppends, WriterSyncs):
    def __init__(
        self,
        directory: str,
        fs: FileSystem,
        config: LogConfig,
        clock: Callable[[], int],
        log_start: Callable[[], int],
        *,
        exclusive: bool = False,
    ) -> None:
        self.directory = directory
        self.fs = fs
        self.config = config
        self.clock = clock
        self._log_start = log_start
        self.lock = threading.Lock()
        self.lock_fd = fs.open(
            os.path.join(directory, filenames.WRITER_LOCK), os.O_RDWR | os.O_CREAT
        )
        try:
            self.head_map = map_lock_file(os.path.join(directory, filenames.WRITER_LOCK))
        except BaseException:
            os.close(self.lock_fd)
            raise
        # the head as this process last published it (publish.py)
        self._head = PublishedHead(fs, self.lock_fd, self.head_map)
        # the plain FileSystem: the append path calls os.pwrite itself (a subclass that
        # injects faults gets every call, as before)
        self.plain_fs = type(fs) is FileSystem
        # the open's exclusive=True: the flock is taken once here and kept until close, so
        # no other process can write and the cached head is always right (see head.py)
        self.sole_writer = exclusive
        # an exclusive writer stores plain records into a mapped, reserved window of the
        # active segment instead of a pwrite each (tailmap.py); False once the file system
        # refused to reserve room for good (or a test wants the pwrite path)
        self.map_tail = exclusive and TAIL_MAP_AVAILABLE
        self._sync_always = config.sync == "always"
        self._segment_bytes = config.segment_bytes
        self._segment_ms = config.segment_ms if config.segment_ms is not None else 1 << 62
        self._index_interval = config.index_interval_bytes
        self.active: ActiveSegment | None = None
        self.end_offset = 0
        self.closed = False
        self.cut_tails: list[tuple[str, int, int]] = []  # (file, byte, bytes) cut by recovery
        self.rebuilt_indexes: list[int] = []
        self.precommit_recovered = 0  # entries of a dead writer materialized by this one
        self.flock_held = False
        self._flock_depth = 0
        # until open-time recovery has run (recovery.recover_on_open), taking the lock does
        # not catch up with the head: after a crash the head is a hint, and recovery decides
        self.awaiting_recovery = True
        # True while append_record may skip _prepare_append and the tests it makes for other
        # writers: an exclusive writer holding its flock for good, open, with no buffer, the
        # plain FileSystem and no failed fsync (set by _flocked once the flock is taken;
        # cleared by close, a failed fsync and a precommit buffer)
        self.steady = False
        # durability (durability.py)
        self.write_seq = 0
        self._group_commit = GroupCommit()
        self._sync_jobs = SyncJobs()
        self._sync_point = SyncPoint(fs, self.lock_fd, self.head_map)
        # self-protection
        self.sync_failed: OSError | None = None
        self._next_space_check = float("-inf")  # monotonic time of the next free-space check
        self._bytes_since_check = 0
        # precommit
        self.precommit: PrecommitBuffer | None = None
        self._holding_for_precommit = False
        if config.precommit_bytes > 0 or os.path.exists(
            os.path.join(directory, filenames.PRECOMMIT)
        ):
            self.precommit = PrecommitBuffer(
                os.path.join(directory, filenames.PRECOMMIT), config.precommit_bytes
            )
        # concurrent single appends: a thread that finds the writer busy queues its record,
        # and whoever takes the lock next writes every queued record with one pwritev
        self._queue: list[list[Any]] = []
        self._queue_lock = threading.Lock()
        # linger (linger.py): single appends held in memory, written as one batch
        self.linger: LingerBuffer | None = LingerBuffer() if config.linger_ms > 0 else None
        self._holding_for_linger = False
        # Log.append may hand a plain record straight to append_record (no buffer to ask)
        self.plain_single = self.linger is None and self.precommit is None
        self._stop = threading.Event()
        # set by close(), and by the first record put into an empty linger buffer: the
        # interval thread sleeps on it, so that it does not wake every linger_ms while the
        # buffer is empty
        self._kick = threading.Event()
        self._background: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------
    def close(self, on_final_head: Callable[[Head], None] | None = None) -> Head | None:
        """Materialize, fsync, release everything. Returns the final head (for the clean
        shutdown marker) or ``None`` if the state is unknown. ``on_final_head`` is called
        with it while the writers' lock is still held, so that no other process can open
        the log (and remove the marker as stale) in between."""
        if self.closed:
            return None
        self._stop.set()
        self._kick.set()
        if self._background is not None:
            self._background.join()
        head = None
        try:
            self.materialize()
            self.sync_all(record_point=True)
            with self.lock, self._flocked():
                if self.active is not None:  # (None: recovery failed at open)
                    self.active.cut_reserved()
                    head = self._current_head()
                    try:  # the clean-shutdown marker vouches for the index too: recovery
                        self.fs.fdatasync(self.active.index_fd)  # then trusts it as it is
                    except OSError:
                        on_final_head = None  # no marker: the next open checks every entry
                    if on_final_head is not None:
                        on_final_head(head)
        finally:
            with self.lock:
                self.closed = True
                self.steady = False
                if self.precommit is not None:
                    self.precommit.close()
                self._sync_jobs.retired.clear()
                if self.active is not None:
                    self.active.close()
                    self.active = None
                self.head_map.close()
                os.close(self.lock_fd)  # releases the flock (kept by exclusive=True)
        return head

    # -- locking -----------------------------------------------------------------------
    @contextmanager
    def _flocked(self) -> Any:
        """The inter-process lock plus an up-to-date view of the head (caller holds
        ``self.lock``). Nests; the outermost exit releases the ``flock`` unless the
        precommit buffer still needs it."""
        if not self.flock_held:
            lock_exclusive(self.lock_fd)
            self.flock_held = True
            try:
                self._sync_head()
            except BaseException:
                self.flock_held = False
                unlock(self.lock_fd)
                raise
            self.steady = (
                self.sole_writer
                and self.plain_single
                and self.plain_fs
                and not self.closed
                and self.sync_failed is None
            )
        self._flock_depth += 1
        try:
            yield
        finally:
            self._flock_depth -= 1
            if self._flock_depth == 0 and self.flock_held and not self._keeps_flock():
                self.flock_held = False
                unlock(self.lock_fd)

    def _keeps_flock(self) -> bool:
        """Whether the flock stays held between operations: for the log's lifetime with
        ``exclusive=True``, and while a precommit or linger buffer hands out offsets."""
        return self.sole_writer or self._holding_for_precommit or self._holding_for_linger

    def _check_open(self) -> None:
        if self.closed:
            raise LogClosedError("log is closed", path=self.directory)
        if self.sync_failed is not None:
            raise self._sync_refusal()

    def _current_head(self) -> Head:
        assert self.active is not None
        flags = FLAG_PRECOMMIT_PENDING if self._holding_for_precommit else 0
        return Head(flags, self.active.base, self.end_offset, self.active.size)

    def _publish_head(self, *, sync_first: bool = True) -> None:
        """Write the head and clear the writing mark (caller holds both locks).

        A store into the mmap of ``.lock`` (``publish.PublishedHead``). Under
        ``sync="always"`` what it publishes is made durable first (:meth:`_sync_locked`),
        unless ``sync_first`` is false: a writer catching up with what another process's
        writer published (which that writer synced first if its policy asked for it).
        """
        active = self.active
        assert active is not None
        if self._sync_always and sync_first:
            self._sync_locked()
        self._head.publish(
            FLAG_PRECOMMIT_PENDING if self._holding_for_precommit else 0,
            active.base,
            self.end_offset,
            active.size,
        )

    def _sync_head(self) -> None:
        """Make this process's view match the log (caller holds both locks).

        No system call when nothing changed: the head and the writing mark are read from the
        mmap and compared with what this process last published (see ``head.py``)."""
        if self._head.is_current() and self.active is not None:
            return
        if self.active is None and self.awaiting_recovery:
            return
        self._catch_up()

    def _catch_up(self) -> None:
        """Another process wrote (or died): reopen the active segment as the head says
        (caller holds both locks)."""
        self.reopen_active(read_head(self.lock_fd))

    # -- reopen: learn what other processes (or a crash) did -----------------------------
    def reopen_active(
        self,
        head: Head | None,
        *,
        trust_head: bool = True,
        cut_from: int | None = None,
        empty_base: int = 0,
        recovering: bool = False,
    ) -> None:
        """Make the newest segment, as ``tail.open_newest_tail`` finds it (its torn tail cut,
        its index checked), the active one (caller holds both locks); publish the head, and
        materialize a precommit buffer that a dead process left pending.

        ``trust_head``, ``cut_from`` and ``empty_base`` are those of ``open_newest_tail``
        (open-time recovery after a crash passes them, ``recovery.py`` pass 5).
        ``recovering``: open-time recovery, whose publication of what a dead writer left is
        synced first under ``sync="always"`` like any other.
        """
        tail = open_newest_tail(
            self.directory,
            self.fs,
            head,
            log_start=self._log_start(),
            index_interval=self.config.index_interval_bytes,
            sync_new_file=self._fdatasync,
            trust_head=trust_head,
            cut_from=cut_from,
            empty_base=empty_base,
        )
        self.cut_tails.extend(tail.cuts)
        if tail.rebuilt_index:
            self.rebuilt_indexes.append(tail.base)
        if self.active is not None:
            self._retire(self.active)
        active = ActiveSegment(
            self.fs, tail.base, tail.fd, tail.size, tail.index_fd, tail.index_size
        )
        active.first_ts = tail.first_ts
        active.last_index_pos = tail.last_index_pos
        self.active = active
        self.end_offset = tail.next_offset
        self._publish_head(sync_first=recovering)
        if head is not None and head.precommit_pending and not self._holding_for_precommit:
            self.precommit_recovered += self._materialize_locked()

    def _retire(self, active: ActiveSegment, *, synced: bool = False) -> None:
        """Stop appending to a segment; the next sync fsyncs it unless it is ``synced``
        already (a roll syncs the segment it leaves, see :meth:`_roll`)."""
        active.close()
        if not synced:
            self._sync_jobs.retired.append(active.base)

    # -- rolling -----------------------------------------------------------------------
    def _should_roll(self, incoming: int, incoming_ts: int) -> bool:
        """Roll at ``segment_bytes``, or once the incoming batch is ``segment_ms`` younger
        than the segment's first batch (Kafka compares record timestamps, not the wall
        clock, so replaying old data does not roll a segment per batch)."""
        active = self.active
        assert active is not None
        if active.size <= HEADER_SIZE:
            return False
        if active.size + incoming > self.config.segment_bytes:
            return True
        segment_ms = self.config.segment_ms
        return (
            segment_ms is not None
            and active.first_ts is not None
            and incoming_ts - active.first_ts >= segment_ms
        )

    def _roll(self) -> None:
        """Start a new segment at the end offset (caller holds both locks). Crash protocol:

        0. Cut the room an exclusive writer reserved past the data (``tailmap.py``) off the
           old segment, and ``fdatasync`` it (under every sync policy: one per segment):
           death or a power loss before the sync leaves that segment active in the head,
           with the zeros past its data that the next writer truncates, or its unsynced
           tail, which the next writer validates. After it, the segment is whole on disk, so
           no power loss can ever leave a *closed* segment with a torn or half-written tail.
        1. Publish a head naming the new base with size 0 (and the precommit-pending flag,
           if set): death here leaves no file; the next writer creates it.
        2. Create ``<base>.log`` with its file header (and its index): a torn header with no
           data is rewritten by the next writer; after a power loss the file may be missing,
           empty or all zeros, all of which the next writer takes for an empty newest
           segment. The next sync fsyncs the directory (before any record in the segment is
           acknowledged) and makes the sync point naming the new segment durable.
        """
        assert self.active is not None
        base = self.end_offset
        old = self.active
        old.cut_reserved()  # 0.
        self._fdatasync(old.fd)
        # 1. publish the new head first, keeping the flag that
        #    tells the next writer to materialize our precommit entries if we die
        flags = FLAG_PRECOMMIT_PENDING if self._holding_for_precommit else 0
        self.fs.pwrite(self.lock_fd, encode_head(Head(flags, base, base, 0)), 0)
        # 2. create the segment and its index
        fd = self.fs.open(segment_path(self.directory, base), os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        self.fs.write(fd, SEGMENT_FILE_HEADER)
        index_fd = self.fs.open(
            index_path(self.directory, base), os.O_RDWR | os.O_CREAT | os.O_TRUNC
        )
        self.fs.write(index_fd, INDEX_FILE_HEADER)
        self._retire(old, synced=True)
        self.active = ActiveSegment(self.fs, base, fd, HEADER_SIZE, index_fd, HEADER_SIZE)
        self._sync_jobs.dir_dirty = True
        self._publish_head()

    def finish_recovery(self) -> None:
        """End open-time recovery: from now on taking the lock catches up with the head, and
        readers trust the head this boot stores (the boot id in ``.lock``, head.py)."""
        self.awaiting_recovery = False
        self.head_map[BOOT_AT:BOOT_END] = BOOT.id or bytes(BOOT_END - BOOT_AT)

    def skip_to(self, offset: int) -> None:
        """Roll to an empty segment whose base is ``offset`` (past the end offset), synced
        with its directory entry before this returns (caller holds both locks): recovery
        leaves offsets that lost records unused this way (``recovery._keep_offsets_unique``)."""
        assert offset > self.end_offset
        self.end_offset = offset
        self._roll()
        self._sync_locked()

    # -- appending ---------------------------------------------------------------------
    def fast_path_hooks(self) -> FastPathHooks:
        """The steps of an append that the plain path (``single.py``) calls (see
        :class:`FastPathHooks`)."""
        return FastPathHooks(
            self._append_queued,
            self._prepare_append,
            self._catch_up,
            self._plain_checkpoint,
            self._refusal,
            self._head.ring,
            self._head.bytes,
            self._head.fields,
        )

    def append_encoded(self, batches: Sequence[EncodedBatch]) -> tuple[int, int]:
        """Write encoded batches back to back; returns (first offset, write sequence)."""
        total = sum(b.size for b in batches)
        with self.lock:
            self._check_open()
            try:
                with self._flocked():
                    if self.linger is not None and self.linger.count:
                        self._flush_linger_locked()
                    if self.precommit is not None and self.precommit.count:
                        self._materialize_locked()
                    self._check_space(total)
                    first = self.end_offset
                    for batch in batches:
                        self._write_locked(batch)
                    self.write_seq += 1
                    seq = self.write_seq
                    self._publish_head()
            except OSError as error:  # a roll, the head or a refresh failed to write
                raise self._refusal(error) from error
        if self.config.sync == "always":
            self.sync_through(seq)
        return first, seq

    def append_record(
        self, key: bytes | None, value: bytes | None, timestamp: int, headers: bytes
    ) -> int:
        """Append one checked, uncompressed record as a one-record batch; returns its offset.

        The general single-record path: records with headers, an explicit timestamp, a
        ``None`` key or value, over ``single.PLAIN_MAX_BYTES``, or on a test's file system.
        A plain record takes the log's installed function instead (``single.py``), which
        follows the same protocol in one frame. Here: one ``flock`` pair (none with
        ``exclusive=True``), the head compared in the mmap, the batch encoded with its
        offset and written with one ``pwrite``, the head stored into the mmap (see
        :meth:`_publish_head`). A thread that finds another one writing queues its record
        instead (:meth:`_append_queued`), so that concurrent appends go to the file
        together in one ``pwritev``.

        Crash protocol: that of :meth:`_write_locked`, for one record:

        1. set the writing mark, then ``pwrite`` the batch at the end of the active segment
           (death here: the next writer sees the mark, validates the tail and cuts what is
           not a whole batch);
        2. maybe append an index entry (a cache, checked and rebuilt);
        3. store the new head, which clears the mark (death before it: the next writer sees
           the mark and keeps the whole batch it finds past the old head).
        """
        lock = self.lock
        if not lock.acquire(False):  # (positional: parsing a keyword costs a little)
            return self._append_queued([key, value, timestamp, headers, None])
        locked_here = False
        steady = self.steady
        try:
            if not steady:  # a shared writer, a buffer, a closed log, a failed fsync
                locked_here = self._prepare_append()
            offset = self.end_offset
            data = encode_single(key, value, timestamp, headers, offset)
            size = len(data)
            self._bytes_since_check = since = self._bytes_since_check + size
            if since >= SPACE_CHECK_BYTES or monotonic() >= self._next_space_check:
                self._check_space(size)
            active = self.active
            assert active is not None
            position = active.size
            if (
                position + size > self._segment_bytes
                or (active.first_ts is not None and timestamp - active.first_ts >= self._segment_ms)
            ) and self._should_roll(size, timestamp):
                self._roll()
                active = self.active
                position = active.size
            head_map = self.head_map
            # 1. (an exclusive writer, steady or not, sets no mark: no live writer could see it)
            if not steady and not self.sole_writer:
                head_map[WRITING_MARK] = 1
            try:
                if not ((steady or self.plain_fs) and pwrite(active.fd, data, position) == size):
                    self.fs.pwritev(active.fd, [data], position)  # a short write, or a test's fs
            except OSError as error:
                active.undo_partial_write(position)
                raise self._refusal(error) from error
            active.size = position + size
            self.end_offset = offset + 1
            if active.first_ts is None:
                active.first_ts = timestamp
            if position - active.last_index_pos >= self._index_interval:  # 2.
                active.add_index_entry(offset, position)
            self.write_seq = seq = self.write_seq + 1
            if self._sync_always:
                self._sync_locked()  # (durable before it is published: see _publish_head)
            # 3. the head, packed in place and stored (_publish_head, inlined): only the end
            #    offset and the size moved (a roll or a refresh published the rest)
            head = self._head
            published = head.bytes
            publish_end_into(published, head.fields, offset + 1, position + size)
            head_map[0:PUBLISHED_SIZE] = published
            if head_map[DOORBELL]:
                head.ring()
        except OSError as error:  # a roll, the head or a refresh failed to write
            raise self._refusal(error) from error
        finally:
            if locked_here and not (self._holding_for_precommit or self._holding_for_linger):
                self.flock_held = False
                flock(self.lock_fd, LOCK_UN)
            lock.release()
        if self._sync_always:
            self.sync_through(seq)
        return offset

    def _prepare_append(self) -> bool:
        """What :meth:`append_record` does first unless the writer is steady (caller holds
        ``self.lock``): refuse a closed log or one whose fsync failed, take the ``flock``
        and catch up with other processes, write pending precommit entries. Returns whether
        it took the ``flock`` (then the append lets it go)."""
        if self.closed or self.sync_failed is not None:
            self._check_open()
        locked_here = False
        if not self.flock_held:  # (exclusive=True, or a buffer, keeps it held)
            flock(self.lock_fd, LOCK_EX)
            self.flock_held = locked_here = True
            if not self._head.is_current() or self.active is None:
                try:
                    self._catch_up()  # another process wrote (or died)
                except BaseException:  # (a missing segment, say: other writers go on)
                    self.flock_held = False
                    flock(self.lock_fd, LOCK_UN)
                    raise
        if self.precommit is not None and self.precommit.count:
            self._materialize_locked()
        return locked_here

    def _plain_checkpoint(self, incoming: int, timestamp: int) -> ActiveSegment:
        """What the plain append path (``single.py``) does when a record crosses the active
        segment's checkpoint (caller holds both locks): the free-space check and the roll
        that :meth:`append_record` considers for every record, then the next checkpoint.

        The next one is where either could next be due: the segment's size limit or the
        space check's byte budget (``SPACE_CHECK_BYTES``), and ``segment_ms`` after the
        segment's first record or the space check's next time (``SPACE_CHECK_SECONDS``),
        in wall-clock ms as records are stamped. The bytes the plain path wrote since the
        last checkpoint count toward the space check's budget here (a batch written in
        between counts twice: the check comes early, never late). Returns the segment to
        write to, whose ``first_ts`` is set to ``timestamp`` if it has no record yet.
        """
        active = self.active
        assert active is not None
        self._bytes_since_check += max(active.size - active.plain_from, 0)
        self._check_space(incoming)
        if self._should_roll(incoming, timestamp):
            self._roll()
            active = self.active
            assert active is not None
        if active.first_ts is None:
            active.first_ts = timestamp  # (undo_partial_write clears it if the write fails)
        position = active.plain_from = active.size
        window = active.window
        if window is not None and position + incoming > window.end:
            active.drop_window()  # (a store past a window's end is not possible)
            window = None
        if window is None and self.map_tail and self.steady:
            window = self._map_window(active, position + incoming)
        budget = SPACE_CHECK_BYTES - self._bytes_since_check
        stop = min(self._segment_bytes, position + budget) if budget > 0 else 0
        active.plain_stop = stop if window is None else min(stop, window.end)
        wait = self._next_space_check - time.monotonic()  # -inf after a refusal
        space_due = timestamp + int(wait * 1000) if wait > 0 else -1
        active.plain_deadline = min(active.first_ts + self._segment_ms, space_due)
        return active

    def _append_queued(self, slot: list[Any]) -> int:
        """Queue ``[key, value, timestamp, headers, result]`` for whoever holds the lock next.

        The first thread to get the lock writes the whole queue as consecutive one-record
        batches with one ``pwritev`` (group write) and stores each record's offset (or the
        error) in its slot; the threads whose records it wrote just read their result.
        """
        with self._queue_lock:
            self._queue.append(slot)
        with self.lock:
            if slot[4] is None:
                with self._queue_lock:
                    queue, self._queue = self._queue, []
                self._write_queue_locked(queue)
        result = slot[4]
        if isinstance(result, BaseException):
            raise result
        assert isinstance(result, tuple)
        offset, seq = result
        if self.config.sync == "always":
            self.sync_through(seq)
        return offset

    def _write_queue_locked(self, queue: list[list[Any]]) -> None:
        try:
            self._check_open()
            with self._flocked():
                if self.precommit is not None and self.precommit.count:
                    self._materialize_locked()
                self._check_space(sum(BATCH_HEADER.size + 12 + len(s[3]) for s in queue))
                run: list[bytes] = []
                run_bytes = 0
                results: list[int] = []
                for key, value, timestamp, headers, _ in queue:
                    size = BATCH_HEADER.size + 8 + len(key or b"") + len(value or b"")
                    if run and (
                        len(run) >= IOV_MAX or self._should_roll(run_bytes + size, timestamp)
                    ):
                        next_offset = self.end_offset + len(run)
                        self._write_bytes_locked(run, run_bytes, timestamp, next_offset)
                        run, run_bytes = [], 0
                    offset = self.end_offset + len(run)
                    data = encode_single(key, value, timestamp, headers, offset)
                    run.append(data)
                    run_bytes += len(data)
                    results.append(offset)
                self._write_bytes_locked(run, run_bytes, timestamp, self.end_offset + len(run))
                self.write_seq += 1
                seq = self.write_seq
                self._publish_head()
        except BaseException as error:
            failure: BaseException = error
            if isinstance(error, OSError):
                failure = self._refusal(error)
            for slot in queue:
                slot[4] = failure
            return
        for slot, offset in zip(queue, results, strict=True):
            slot[4] = (offset, seq)

    def _write_bytes_locked(
        self, parts: list[bytes], size: int, max_ts: int, next_offset: int
    ) -> None:
        """Write whole encoded batches (``parts``, ``size`` bytes in all, holding offsets up
        to ``next_offset``) at the end of the active segment: the single-record counterpart of
        :meth:`_write_locked`, under the same crash protocol."""
        if self._should_roll(size, max_ts):
            self._roll()
        active = self.active
        assert active is not None
        position = active.size
        if not self.sole_writer:  # (no other live writer can see an exclusive one's mark)
            self.head_map[WRITING_MARK] = 1
        try:
            self.fs.pwritev(active.fd, parts, position)
        except OSError as error:
            active.undo_partial_write(position)
            raise self._refusal(error) from error
        active.size = position + size
        base_offset = self.end_offset
        self.end_offset = next_offset
        if active.first_ts is None:
            active.first_ts = max_ts
        if position - active.last_index_pos >= self.config.index_interval_bytes:
            active.add_index_entry(base_offset, position)
        self._bytes_since_check += size

    def _write_locked(self, batch: EncodedBatch) -> None:
        """Write one batch at the end of the active segment (caller holds both locks; the
        caller publishes the head). Crash protocol:

        1. ``writev`` header and body at the end of the active segment. Death here leaves a
           torn tail: the next writer finds the segment longer than the head says, validates
           the bytes past it and truncates what is not a whole batch (``tail.py``).
        2. Maybe append an index entry. A torn or missing entry is harmless: indexes are
           checked and rebuilt.
        3. Publish the new head in ``.lock`` (the caller). Death before it: the next writer
           sees the size mismatch and validates the tail, keeping the whole batch.
        """
        if self._should_roll(batch.size, batch.max_ts):
            self._roll()
        active = self.active
        assert active is not None
        position = active.size
        base_offset = self.end_offset
        header = batch.header(base_offset)
        self.head_map[WRITING_MARK] = 1
        try:
            self.fs.pwritev(active.fd, [header, batch.body], position)
        except OSError as error:
            active.undo_partial_write(position)
            raise self._refusal(error) from error
        active.size = position + batch.size
        self.end_offset = base_offset + batch.last_delta + 1
        if active.first_ts is None:
            active.first_ts = batch.max_ts
        if position - active.last_index_pos >= self.config.index_interval_bytes:
            active.add_index_entry(base_offset, position)
        self._bytes_since_check += batch.size

    # -- the mapped tail of an exclusive writer (tailmap.py) -----------------------------
    def _map_window(self, active: ActiveSegment, need_end: int) -> TailWindow | None:
        """Reserve and map the room from the active segment's end to at least ``need_end``
        (caller holds both locks). Returns the window, or ``None`` where the file system
        refused: the plain path then writes with ``pwrite``, for good if the refusal is not
        one that may pass (a full disk, whose refusal comes from the ``pwrite`` itself)."""
        try:
            return active.map_window(need_end, self._segment_bytes)
        except OSError as error:
            if error.errno not in RETRYABLE:
                self.map_tail = False
            return None

    def _refusal(self, error: OSError) -> WriteRefusedError:
        self._next_space_check = float("-inf")
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            return WriteRefusedError(
                "no space left on the device; appends refused, reads go on", path=self.directory
            )
        return WriteRefusedError(
            f"write failed ({error}); appends refused, reads go on", path=self.directory
        )

    def _check_space(self, incoming: int) -> None:
        now = time.monotonic()
        if now < self._next_space_check and self._bytes_since_check < SPACE_CHECK_BYTES:
            return
        floor = self.config.min_free_bytes
        free = self.fs.free_bytes(self.directory) if floor else incoming
        if free - incoming < floor:
            self._next_space_check = float("-inf")
            raise WriteRefusedError(
                f"only {free} bytes free, below min_free_bytes={self.config.min_free_bytes}; "
                "appends refused until space is freed, reads go on",
                path=self.directory,
            )
        self._next_space_check = now + SPACE_CHECK_SECONDS
        self._bytes_since_check = 0

    @property
    def torn_bytes_dropped(self) -> int:
        """Bytes cut off the newest segment by reopening, since the last findings."""
        return sum(length for _path, _position, length in self.cut_tails)

    def take_findings(self) -> Findings:
        """What reopening found since the last call (for open-time recovery's report); the
        counts start again from zero."""
        found = Findings(
            self.torn_bytes_dropped,
            self.cut_tails,
            self.rebuilt_indexes,
            self.precommit_recovered,
        )
        self.cut_tails = []
        self.rebuilt_indexes = []
        self.precommit_recovered = 0
        return found

    # -- maintenance hooks used by retention, the cleaner and recovery ------------------
    @contextmanager
    def pause_appends(self) -> Any:
        """Both locks (the thread lock, and the ``flock`` with the head caught up) with the
        linger buffer written: for operations that must not interleave with appends
        (open-time recovery, a config change, a maintenance operation)."""
        with self.lock:
            self._check_open()
            with self._flocked():
                if self.linger is not None and self.linger.count:
                    self._flush_linger_locked()
                yield
