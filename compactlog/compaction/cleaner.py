"""The cleaning algorithm (Kafka's ``Cleaner``): pure, given ``now`` and ``should_abort``.

:func:`clean_log` runs one pass over a log directory: select the dirty section, find the
latest offset of every key of the segments to clean (``latest.py``: in bounded memory,
spilling by digest range, so one pass cleans up to the first uncleanable offset whatever
the number of keys), verify what will be rewritten, rewrite closed segments in groups
through ``storage/swap.py`` (whose docstring is the crash protocol), write the checkpoint.
The caller holds the cleaner lock; writers append and readers read throughout. The steps,
the rules for what a record keeps and how a pass stays fast: docs/compaction.md ("How a
pass works", "Performance"). ``should_abort`` is polled between batches; an abort removes
the group in progress and leaves the checkpoint as it was. Before a swap
that removes an expired tombstone at or above the ``tombstone_horizon`` stored in
``cleaner.checkpoint``, the checkpoint is rewritten with the horizon raised past it (step 4a
in docs/compaction.md): a death between leaves a horizon above what is removed, so a disk
table resuming below it rebuilds needlessly, never wrongly (``table/table_identity.py``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from ..config import LogConfig
from ..encoding.batch_decode import RecordBatch
from ..encoding.format import CODECS
from ..encoding.offset_map import BYTES_PER_ENTRY, key_digests
from ..errors import Aborted, CompactLogError, CorruptLogError
from ..storage import filenames, swap
from ..storage.fsio import FileSystem
from ..storage.segment import (
    HEADER_SIZE,
    SegmentReader,
    TimestampCache,
    read_all,
)
from ..storage.state_files import CleanerState, read_cleaner_state, write_cleaner_state
from .columns import KeptColumns, range_sums
from .dirty import Segment, closed_segments, measure, measure_log
from .failures import GuardedFS, WriteFailed, public_error, read_error, roll_back
from .group import GroupWriter
from .latest import LatestFinder, LatestOffsets
from .progress import Meter, ProgressCallback
from .stats import CleanerStats

MAX_GROUP_OFFSETS = (1 << 32) - 1
WINDOW_RECORDS = 1 << 17  # records hashed and looked up at once
WINDOW_BYTES = 8 << 20  # bytes of batches held at once


class Throttler:
    """Caps read + write bytes per second (Kafka's cleaner throttler): sleeps when ahead.

    Safe to share between threads (one cap for several cleaner workers): the byte count is
    kept under a lock and each caller sleeps, outside it, until the bytes of all callers
    fit the rate. ``slept`` sums every caller's sleep; :meth:`slept_here` is the calling
    thread's own, which a pass reports as its ``throttled_seconds``.
    """

    def __init__(
        self,
        bytes_per_second: int | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.rate = bytes_per_second
        self.clock = clock
        self.sleep = sleep
        self.start = clock()
        self.bytes = 0
        self.slept = 0.0
        self._lock = threading.Lock()
        self._local = threading.local()

    def account(self, nbytes: int) -> None:
        if not self.rate:
            return
        with self._lock:
            self.bytes += nbytes
            ahead = self.bytes / self.rate - (self.clock() - self.start)
        if ahead > 0.001:
            self.sleep(ahead)
            with self._lock:
                self.slept += ahead
            self._local.slept = self.slept_here() + ahead

    def slept_here(self) -> float:
        """Seconds the calling thread has slept in :meth:`account`."""
        return float(getattr(self._local, "slept", 0.0))


def _first_dirty_timestamp(directory: str, segments: list[Segment], first_dirty: int) -> int | None:
    """Timestamp of the first batch holding an offset at or past the cleaner point."""
    for seg in segments:
        if seg.next_base <= first_dirty:
            continue
        with SegmentReader(directory, seg.base, last_segment=False) as reader:
            for _pos, header in reader.headers(HEADER_SIZE):
                if header.next_offset > first_dirty:
                    return header.first_ts
    return None


class _Marks:
    """Tombstone marks as arrays: offsets below ``ends[i]`` were first passed by ``ts[i]``."""

    def __init__(self, marks: list[list[int]], now: int) -> None:
        self.ends = np.array([m[0] for m in marks], dtype=np.int64)
        self.ts = np.array([m[1] for m in marks], dtype=np.int64)
        self.now = now

    def first_seen(self, offsets: np.ndarray) -> np.ndarray:
        """When the cleaner first passed each offset (``now`` when no mark covers it)."""
        if not len(self.ends):
            return np.full(len(offsets), self.now, dtype=np.int64)
        i = np.searchsorted(self.ends, offsets, side="right")
        return np.where(i < len(self.ts), self.ts[np.minimum(i, len(self.ts) - 1)], self.now)


def _batches(directory: str, base: int) -> Iterator[RecordBatch]:
    with SegmentReader(directory, base, last_segment=False) as reader:
        yield from reader.runs(HEADER_SIZE)  # runs of small batches decoded at once


def clean_log(
    directory: str,
    fs: FileSystem,
    config: LogConfig,
    *,
    now: int,
    log_start: int,
    force: bool = False,
    should_abort: Callable[[], bool] | None = None,
    throttler: Throttler | None = None,
    timestamp_cache: TimestampCache | None = None,
    progress: ProgressCallback | None = None,
) -> CleanerStats:
    """One cleaning pass (steps 1-5 of the module docstring). Caller holds the cleaner
    lock. Raises :class:`CorruptLogError` (nothing changed) on a corrupt batch, and
    :class:`~compactlog.errors.CompactionWriteError` (:class:`~compactlog.errors.DiskFullError`
    for ``ENOSPC``) after rolling back when a write fails (``failures.py``); an abort
    returns statistics with ``aborted`` set. ``progress`` gets
    :class:`~.progress.CompactionProgress` events (``progress.py``)."""
    started = time.perf_counter()
    stats = CleanerStats(forced=force, now_ms=now)
    try:
        return _clean(
            directory,
            GuardedFS(fs),
            config,
            stats,
            started,
            now,
            log_start,
            force,
            should_abort,
            throttler,
            timestamp_cache,
            Meter(progress),
        )
    except Aborted:
        stats.aborted = True
        stats.skipped = (
            f"aborted (should_abort) before the pass ended: the cleaner point did not move "
            f"and the dirty ratio stays {stats.dirty_ratio:.3f}; the next pass starts over"
        )
        return _done(stats, started)
    except WriteFailed as failure:
        error = public_error(failure, fs, directory)
        error.stats = _done(stats, started)
        stats.skipped = str(error)
        raise error from failure.error
    except OSError as failure:  # a read (writes all raise WriteFailed): nothing to undo
        error = read_error(failure, directory)
        error.stats = _done(stats, started)
        stats.skipped = str(error)
        raise error from failure


def _clean(
    directory: str,
    fs: FileSystem,
    config: LogConfig,
    stats: CleanerStats,
    started: float,
    now: int,
    log_start: int,
    force: bool,
    should_abort: Callable[[], bool] | None,
    throttler: Throttler | None,
    timestamp_cache: TimestampCache | None,
    meter: Meter,
) -> CleanerStats:
    throttle = throttler or Throttler(config.cleaner_io_bytes_per_second)
    slept_before = throttle.slept_here()
    abort = should_abort or (lambda: False)
    _resolve_leftovers(fs, directory, stats)
    state = read_cleaner_state(directory)
    segments, active_base, active_bytes = closed_segments(directory)
    # -- 1. select (the dirty ratio is dirty.measure's, the one every figure uses) --------
    share = measure(
        directory,
        segments,
        active_base,
        cleaner_point=state.first_dirty_offset,
        log_start=log_start,
        min_compaction_lag_ms=config.min_compaction_lag_ms,
        now=now,
        active_bytes=active_bytes,
        timestamp_cache=timestamp_cache,
    )
    stats.clean_bytes, stats.dirty_bytes = share.clean_bytes, share.dirty_bytes
    stats.dirty_ratio, stats.active_segment_bytes = share.ratio, share.active_bytes
    if not segments:
        stats.skipped = "no closed segment (the active segment is never cleaned)"
        return _done(stats, started)
    first_dirty, uncleanable = share.first_dirty_offset, share.first_uncleanable_offset
    ratio = share.ratio
    stats.first_dirty_offset = first_dirty
    stats.first_uncleanable_offset = uncleanable
    stats.new_first_dirty_offset = first_dirty
    has_dirty = share.has_dirty
    if not force:
        reason = _why_clean(config, state, directory, segments, first_dirty, ratio, has_dirty, now)
        if reason is None:
            stats.skipped = (
                f"dirty ratio {ratio:.3f} below min_cleanable_dirty_ratio "
                f"{config.min_cleanable_dirty_ratio}, nothing past max_compaction_lag_ms "
                "and no tombstone due to expire"
            )
            return _done(stats, started)
        stats.extra["reason"] = reason
    # -- 2. the latest offset of every key of the cleanable range (latest.py) -----------
    map_end = uncleanable if has_dirty else first_dirty
    to_clean = [s for s in segments if s.base < map_end]
    if not to_clean:
        stats.skipped = "nothing to clean below the first uncleanable offset"
        return _done(stats, started)
    stats.map_capacity = max(config.cleaner_buffer_bytes // BYTES_PER_ENTRY, 1)
    latest: LatestOffsets | None = None
    if has_dirty:
        latest = _find_latest(
            directory, fs, config, to_clean, log_start, stats, throttle, abort, meter
        )
    stats.map_seconds = time.perf_counter() - started
    context = _Context(
        config,
        latest,
        _Marks(state.tombstone_marks, now),
        now,
        first_dirty,
        map_end,
        log_start,
        stats,
        throttle,
        abort,
        meter=meter,
    )
    try:
        if latest is None:  # 3. verify (the map's reading verified every batch it read)
            _verify(directory, to_clean, stats, throttle, abort, meter)
        _rewrite(fs, directory, config, state, to_clean, context)  # 4.
    finally:
        if latest is not None:
            latest.close(fs)
    stats.throttled_seconds = throttle.slept_here() - slept_before
    # -- 5. checkpoint -------------------------------------------------------------------
    retention_ms = config.delete_retention_ms
    kept_marks = [m for m in state.tombstone_marks if m[1] + retention_ms > now]
    if context.head_tombstones:
        kept_marks.append([map_end, now])
    horizon = max(state.horizon(), context.removed_below)
    write_cleaner_state(fs, directory, CleanerState(map_end, kept_marks, horizon))
    stats.new_first_dirty_offset = map_end
    stats.cleaned = True
    _measure_after(directory, config, log_start, now, timestamp_cache, stats)
    return _done(stats, started)


def _find_latest(
    directory: str,
    fs: FileSystem,
    config: LogConfig,
    to_clean: list[Segment],
    log_start: int,
    stats: CleanerStats,
    throttle: Throttler,
    abort: Callable[[], bool],
    meter: Meter,
) -> LatestOffsets:
    """Step 2: every keyed record of the segments to clean, read once, its key hashed
    once, into :class:`~.latest.LatestFinder` (which spills past the map's capacity);
    reading checks every batch's CRC, so step 3 has nothing left to verify."""
    start, end = to_clean[0].base, to_clean[-1].next_base
    finder = LatestFinder(
        fs, directory, start, end, config.cleaner_buffer_bytes, abort, throttle.account
    )
    try:
        meter.start("map", sum(s.size for s in to_clean))
        for seg in to_clean:
            windows = _windows(directory, seg.base, stats, throttle, abort, log_start, meter)
            for window in windows:
                cols = _WindowKeys(window)
                offsets = cols.offsets
                mask = (offsets >= log_start) & (cols.key_lengths >= 0)
                hi, lo = cols.digests()
                if not mask.all():
                    hi, lo, offsets = hi[mask], lo[mask], offsets[mask]
                del cols
                window.clear()  # let the read buffers go before a merge
                stats.map_records += len(offsets)
                finder.put(hi, lo, offsets)
        meter.finish()
        latest = finder.finish()
    except BaseException:
        finder.discard()
        raise
    stats.map_entries = finder.peak_keys
    stats.keys = finder.keys
    stats.partitions = finder.partitions
    stats.spill_bytes_written = finder.spill_bytes_written
    stats.spill_bytes_read = finder.spill_bytes_read
    return latest


def _verify(
    directory: str,
    to_clean: list[Segment],
    stats: CleanerStats,
    throttle: Throttler,
    abort: Callable[[], bool],
    meter: Meter,
) -> None:
    """Step 3: check the CRC of every batch before any file changes."""
    meter.start("verify", sum(s.size for s in to_clean))
    for seg in to_clean:
        with SegmentReader(directory, seg.base, last_segment=False) as reader:
            for _pos, header in reader.headers(HEADER_SIZE):
                stats.verify_bytes_read += header.length
                throttle.account(header.length)
                meter.add(header.length)
            if abort():
                raise Aborted
    meter.finish()


def _rewrite(
    fs: FileSystem,
    directory: str,
    config: LogConfig,
    state: CleanerState,
    to_clean: list[Segment],
    context: _Context,
) -> None:
    """Step 4: filter the segments into groups, each swapped in (``swap.py``)."""
    stats, meter = context.stats, context.meter
    clean_start = time.perf_counter()
    meter.start("rewrite", sum(s.size for s in to_clean))
    stats.segments_before = len(to_clean)
    group: GroupWriter | None = None
    releaser = _Releaser()
    try:
        for seg in to_clean:
            if group is not None and (
                (group.size > HEADER_SIZE and group.size + seg.size > config.segment_bytes)
                or seg.next_base - group.first > MAX_GROUP_OFFSETS
            ):
                _raise_horizon(fs, directory, state, context)  # 4a.
                _install(fs, directory, group, stats, releaser)
                group = None
            if group is None:
                group = GroupWriter(fs, directory, seg.base, config.index_interval_bytes)
                group.before_write = releaser.wait
            group.segments.append(seg)
            _clean_segment(directory, seg, group, context)
        if group is not None:
            _raise_horizon(fs, directory, state, context)  # 4a.
            _install(fs, directory, group, stats, releaser)
            group = None
    except WriteFailed as failure:
        if group is not None:
            roll_back(fs, directory, group, failure)
        raise
    except BaseException:
        if group is not None and not group.installing:
            group.discard()
        raise
    finally:
        releaser.wait()
    meter.finish()
    stats.clean_seconds = time.perf_counter() - clean_start


def _measure_after(
    directory: str,
    config: LogConfig,
    log_start: int,
    now: int,
    timestamp_cache: TimestampCache | None,
    stats: CleanerStats,
) -> None:
    """The dirty ratio after the pass, and what is left uncleaned and why."""
    share = measure_log(  # the checkpoint just written holds the new cleaner point
        directory,
        min_compaction_lag_ms=config.min_compaction_lag_ms,
        log_start=log_start,
        now=now,
        timestamp_cache=timestamp_cache,
    )
    stats.dirty_ratio_after = share.ratio
    stats.lagging_bytes = share.lagging_bytes
    stats.dirty_bytes_after = share.dirty_bytes


# Small state files only a cleaner-lock holder writes: their temporary files are an earlier
# (dead) cleaner's, since we hold that lock now.
_CLEANER_OWNED_TEMP_PREFIXES = (
    swap.SWAP_INTENT + ".",
    filenames.CLEANER_CHECKPOINT + ".",
    filenames.SPILL + ".",  # latest.py's spill files
)


def _raise_horizon(fs: FileSystem, directory: str, state: CleanerState, ctx: _Context) -> None:
    """Step 4a: store a tombstone horizon past every tombstone removed so far, before the
    group that removes them is swapped in (``state`` then holds what is stored)."""
    if ctx.removed_below <= state.horizon():
        return
    state.tombstone_horizon = ctx.removed_below
    write_cleaner_state(fs, directory, state)


def _resolve_leftovers(fs: FileSystem, directory: str, stats: CleanerStats) -> None:
    """Finish or undo a swap an earlier pass left (it died or failed mid-protocol), and
    remove unfinished rewrites and the temporary files of the cleaner's own state files: the
    same as recovery's pass 2, under our cleaner lock. A service that opens logs read-only
    (no recovery) relies on this to clean up after a ``kill -9``."""
    messages = swap.resolve_interrupted_swap(fs, directory)
    for name in sorted(os.listdir(directory)):
        if name.endswith(filenames.TEMP_SUFFIX) and name.startswith(_CLEANER_OWNED_TEMP_PREFIXES):
            fs.remove(os.path.join(directory, name))
            messages.append(f"removed unfinished state file {name}")
            continue
        if not name.endswith(filenames.REWRITE_SUFFIX):
            continue  # cheap first: the directory holds two names per segment
        if filenames.parse_filename(name).kind is filenames.FileKind.REWRITE:
            fs.remove(os.path.join(directory, name))
            messages.append(f"removed unfinished rewrite {name}")
    if messages:
        stats.extra["recovered"] = messages


def _done(stats: CleanerStats, started: float) -> CleanerStats:
    stats.elapsed_seconds = time.perf_counter() - started
    return stats


def _why_clean(
    config: LogConfig,
    state: CleanerState,
    directory: str,
    segments: list[Segment],
    first_dirty: int,
    ratio: float,
    has_dirty: bool,
    now: int,
) -> str | None:
    """Why an unforced pass is due (``None``: it is not)."""
    if has_dirty and ratio >= config.min_cleanable_dirty_ratio:
        return f"dirty ratio {ratio:.3f} >= {config.min_cleanable_dirty_ratio}"
    if has_dirty and config.max_compaction_lag_ms is not None:
        first_ts = _first_dirty_timestamp(directory, segments, first_dirty)
        if first_ts is not None and now - first_ts > config.max_compaction_lag_ms:
            return f"first dirty record is older than max_compaction_lag_ms ({now - first_ts} ms)"
    if any(m[1] + config.delete_retention_ms <= now for m in state.tombstone_marks):
        return "tombstones passed delete_retention_ms"
    return None


def _windows(
    directory: str,
    base: int,
    stats: CleanerStats,
    throttle: Throttler,
    abort: Callable[[], bool],
    first: int,
    meter: Meter,
) -> Iterator[list[RecordBatch]]:
    """The batches of a segment holding offsets from ``first`` on, in windows of about
    :data:`WINDOW_RECORDS` records or :data:`WINDOW_BYTES` bytes (hashing works on a window
    at once). Polls ``should_abort`` between batches."""
    window: list[RecordBatch] = []
    records = nbytes = 0
    limit = WINDOW_RECORDS
    for batch in _batches(directory, base):
        stats.map_bytes_read += batch.size_bytes
        throttle.account(batch.size_bytes)
        meter.add(batch.size_bytes)
        if batch.next_offset <= first:
            continue
        if abort():
            raise Aborted
        window.append(batch)
        records += len(batch)
        nbytes += batch.size_bytes
        if records >= limit or nbytes >= WINDOW_BYTES:
            yield window
            window = []
            records = nbytes = 0
    if window:
        yield window


class _WindowKeys:
    """What deciding a window of batches reads: its offsets, key and value lengths joined,
    and the keys' digests on demand (of a prefix after an abort). Not
    ``batch_decode.Columns``: joining the values blob and the timestamps here would copy
    what the decision never reads."""

    def __init__(self, window: list[RecordBatch]) -> None:
        self.window = window
        if len(window) == 1:
            batch = window[0]
            self.offsets = batch.offsets
            self.key_lengths = batch.key_lengths
            self.value_lengths = batch.value_lengths
        else:
            self.offsets = np.concatenate([b.offsets for b in window])
            self.key_lengths = np.concatenate([b.key_lengths for b in window])
            self.value_lengths = np.concatenate([b.value_lengths for b in window])
        counts = np.fromiter((len(b) for b in window), dtype=np.int64, count=len(window))
        self.ends = np.cumsum(counts)
        self.starts = self.ends - counts

    def digests(self, count: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Key digests of the first ``count`` records (all by default)."""
        window = self.window
        lengths = self.key_lengths
        if count is not None and count < len(lengths):
            lengths = lengths[:count]
            window = window[: int(np.searchsorted(self.starts, count, side="left"))]
        if len(window) == 1:
            blob: bytes | memoryview = window[0].keys_blob
        else:
            blob = b"".join([b.keys_blob for b in window])
        return key_digests(blob, lengths)


@dataclass
class _Context:
    config: LogConfig
    latest: LatestOffsets | None  # None: no dirty section, no record is superseded
    marks: _Marks
    now: int
    first_dirty: int
    map_end: int
    log_start: int
    stats: CleanerStats
    throttle: Throttler
    abort: Callable[[], bool]
    head_tombstones: int = 0
    removed_below: int = 0  # every expired tombstone removed so far is below this offset
    meter: Meter = field(default_factory=lambda: Meter(None))  # rewrite progress

    def __post_init__(self) -> None:
        self.codec = CODECS[self.config.compression]
        self.level = self.config.compression_level
        self.retention = self.config.delete_retention_ms


def _clean_segment(directory: str, seg: Segment, group: GroupWriter, ctx: _Context) -> None:
    """Filter one segment into the group's rewrite, a window of batches at a time.

    Consecutive small batches (``small_runs.SMALL_BATCH_RECORDS`` records or fewer, such as
    single appends) are read as runs of at most ``cleaner_merge_batch_bytes`` and each
    run's surviving records written as one batch (``_clean_window``): a cleaned log reads
    at batch speed whatever its writers did. Any other batch that loses nothing is copied
    byte for byte."""
    window: list[RecordBatch] = []
    records = nbytes = 0
    merge = ctx.config.cleaner_merge_batch_bytes
    with SegmentReader(directory, seg.base, last_segment=False) as reader:
        batches = (
            reader.runs(HEADER_SIZE, max_bytes=merge) if merge else reader.batches(HEADER_SIZE)
        )
        for batch in batches:
            if ctx.abort():
                raise Aborted
            size = batch.size_bytes
            ctx.stats.bytes_read += size
            ctx.throttle.account(size)
            ctx.meter.add(size)
            window.append(batch)
            records += len(batch)
            nbytes += size
            if records >= WINDOW_RECORDS or nbytes >= WINDOW_BYTES:
                _clean_window(reader, window, group, ctx)
                window = []
                records = nbytes = 0
        if window:
            _clean_window(reader, window, group, ctx)


def _clean_window(
    reader: SegmentReader, window: list[RecordBatch], group: GroupWriter, ctx: _Context
) -> None:
    """Decide the fate of every record of a window at once, then copy, re-encode or drop
    each batch."""
    stats = ctx.stats
    cols = _WindowKeys(window)
    offsets = cols.offsets
    drop = _superseded(cols, ctx)
    tombstone = cols.value_lengths < 0
    n_tombstones = int(tombstone.sum())
    if n_tombstones:
        passed = tombstone & (offsets < ctx.first_dirty)
        if passed.any():
            expired = passed & (ctx.marks.first_seen(offsets) + ctx.retention <= ctx.now)
            if expired.any():
                last = int(offsets[expired][-1])  # (offsets ascend)
                ctx.removed_below = max(ctx.removed_below, last + 1)
            drop |= expired
        first_pass = tombstone & ~drop & (offsets >= ctx.first_dirty)
        ctx.head_tombstones += int((first_pass & (offsets < ctx.map_end)).sum())
    if len(offsets) and int(offsets[0]) < ctx.log_start:
        drop |= offsets < ctx.log_start
    count = len(offsets)
    removed = int(drop.sum())
    stats.records_read += count
    stats.records_removed += removed
    stats.records_retained += count - removed
    if n_tombstones:
        dead = int((tombstone & drop).sum())
        stats.tombstones_removed += dead
        stats.tombstones_retained += n_tombstones - dead
    if removed == 0:
        per_batch = np.zeros(len(window), dtype=np.int64)
    else:
        per_batch = range_sums(drop, cols.starts, cols.ends - cols.starts)
    starts = cols.starts.tolist()
    kept: KeptColumns | None = None
    for i, (batch, lost) in enumerate(zip(window, per_batch.tolist(), strict=True)):
        if lost == 0 and batch.stored_batches == 1:
            size = group.add(
                batch.base_offset, read_all(reader.fd, batch.position, batch.size_bytes)
            )
            stats.batches_copied += 1
        elif lost == len(batch):
            stats.batches_dropped += batch.stored_batches
            group.changed = True
            continue
        else:
            if kept is None:
                kept = KeptColumns(
                    window,
                    ~drop,
                    offsets,
                    cols.key_lengths,
                    cols.value_lengths,
                    starts,
                    cols.ends.tolist(),
                )
            # a run of small batches (see _clean_segment) becomes one batch of its
            # surviving records, offsets, timestamps and headers kept
            size = group.add(batch.base_offset, *kept.encode(i, ctx.codec, ctx.level))
            if batch.stored_batches > 1:
                stats.batches_merged += batch.stored_batches
            else:
                stats.batches_rewritten += 1
            group.changed = True
        stats.bytes_written += size
        ctx.throttle.account(size)


def _superseded(cols: _WindowKeys, ctx: _Context) -> np.ndarray:
    """Which records of a window have a later record of their key in the cleanable range:
    the keyed records whose bit in ``ctx.latest`` is clear (every record of the segments
    to clean lies in its range). Keyless records are never superseded."""
    if ctx.latest is None:
        return np.zeros(len(cols.offsets), dtype=bool)
    drop = ~ctx.latest.contains(cols.offsets)
    if not bool((cols.key_lengths >= 0).all()):
        drop &= cols.key_lengths >= 0
    return drop


def _install(
    fs: FileSystem,
    directory: str,
    group: GroupWriter,
    stats: CleanerStats,
    releaser: _Releaser,
) -> None:
    """Finish a group: swap it in, or drop the rewrite when it changes nothing (a small
    one was never written: see ``GroupWriter.created``)."""
    if len(group.segments) == 1 and not group.changed:
        group.discard()
        stats.groups_unchanged += 1
    else:
        group.finish()
        group.installing = True
        held = releaser.hold(directory, [s.base for s in group.segments])
        try:
            swap.replace_segments(fs, directory, group.first, [s.base for s in group.segments[1:]])
        finally:
            releaser.release(held)
        stats.groups_swapped += 1
    stats.segments_after += 1


class _Releaser:
    """Frees replaced segments' disk space off the cleaner's critical path.

    Freeing a large file's blocks (the rename over it, the remove) can take far longer than
    the CPU it uses (``discard`` mounts: ~13 ms for 32 MiB). The cleaner holds a descriptor
    on every segment of a group while :func:`~compactlog.storage.swap.replace_segments` runs, so
    the rename and removes only drop names (the protocol and its fsyncs are unchanged), and
    a helper thread closes those descriptors, which frees the blocks. The next group's
    rewrite waits for the closes before it writes any data, so disk use never exceeds what
    freeing in line would use (the old group's blocks are gone before the new ``.rw``
    grows), and a pass waits for them before it returns.
    """

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None

    @staticmethod
    def hold(directory: str, bases: list[int]) -> list[SegmentReader]:
        held = []
        for base in bases:
            try:
                held.append(SegmentReader(directory, base, last_segment=False))
            except (OSError, CompactLogError):
                pass  # nothing to hold: the swap frees it in line (or reports the problem)
        return held

    def release(self, held: list[SegmentReader]) -> None:
        self.wait()
        if held:
            self.thread = threading.Thread(
                target=_close_all, args=(held,), name="compactlog-release", daemon=True
            )
            self.thread.start()

    def wait(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None


def _close_all(held: list[SegmentReader]) -> None:
    for reader in held:
        try:
            reader.close()
        except OSError:
            pass  # a close that fails leaves nothing to undo: the names are already gone


__all__ = ["Aborted", "CleanerStats", "CorruptLogError", "Throttler", "clean_log"]
