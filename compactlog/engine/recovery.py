"""Open-time recovery and ``repair``: one loader with numbered passes.

:func:`recover_on_open` runs whenever a writer opens a log, holding the writers' lock:

1. Remove stray ``*.tmp`` files (interrupted small-file writes; the old file is intact)
   whose writer is dead: the pid is in the name (``filenames.temp_name``), and a live
   process's file (a cleaner writing its checkpoint in another process) is left alone.
2. If no cleaner holds ``.cleaner.lock``, take it for passes 2-4: resolve an interrupted
   segment swap (see ``swap.py``) and remove ``*.rw`` files (rewrites never trusted).
   While a cleaner (or retention, or a snapshot) holds it, passes 2-4 are skipped: that
   process is replacing closed segments right now, so a listing of them is not stable, and
   it resolves leftovers itself under the same lock. The next open checks them.
3. Check every closed segment's file header (foreign or newer files are refused), find
   orphan indexes (a segment deleted behind the log's back: :class:`MissingSegmentError`;
   an index newer than every segment and past the sync point is a roll a power loss took
   back, removed), drop segments wholly below the log start offset (an interrupted
   retention pass).
4. Rebuild missing or inconsistent indexes of closed segments.
5. Validate the newest segment's tail. Skipped when the clean-shutdown marker matches the
   head (the head is then a fact). Otherwise the head is only a hint (``.lock`` is never
   fsynced) and :func:`_recover_tail` validates from the index or the segment's start,
   using the *sync point* (head.py) to tell what a power loss may have left half-written
   (past it: cut at the first invalid batch, logged as a WARNING and reported) from
   corruption (before it: :class:`CorruptLogError`).
6. Materialize a precommit buffer left pending by a dead process (flagged in the head or
   not: entries still in the buffer at open belong to a stopped writer).
7. After a crash, keep offsets unique (:func:`_keep_offsets_unique`): the next offset is at
   least the head's end offset and every durable subscriber checkpoint, so records lost
   with unsynced data never have their offsets handed out again.

:func:`repair` (``jlogctl repair``) runs the same passes but fixes instead of refusing, and
goes further: checkpoints below the log start, a stale log start offset, every index
checked in full, corrupt regions moved to quarantine files. It never deletes a valid batch.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..encoding.format import SEGMENT_FILE_HEADER
from ..errors import CorruptLogError, LogLockedError, MissingSegmentError
from ..storage import durable, filenames, segment_chain, swap
from ..storage.fsio import FileSystem
from ..storage.head import (
    SYNC_POINT_AT,
    SYNC_POINT_END,
    Head,
    closed_cleanly,
    decode_sync_point,
    encode_head,
    encode_sync_point,
    read_head,
    read_sync_point,
    register_writer,
    release_writer,
    try_lock_exclusive,
    unlock,
)
from ..storage.lockfile import pid_alive
from ..storage.retention import remove_below_start
from ..storage.segment import (
    HEADER_SIZE,
    Damage,
    batch_base_at,
    check_segment_header,
    first_wrong_entry,
    index_is_consistent,
    list_segments,
    read_index,
    scan_segment,
    segment_path,
    walk,
)
from ..storage.tail import rebuild_index
from . import repair_state

if TYPE_CHECKING:
    from .logview import LogView

logger = logging.getLogger("compactlog.recovery")  # (its name before engine/; docs name it)


def _entries(directory: str) -> list[tuple[str, filenames.ParsedName]]:
    return [(name, filenames.parse_filename(name)) for name in sorted(os.listdir(directory))]


@contextmanager
def _closed_segments_quiet(log: LogView) -> Iterator[bool]:
    """Holds ``.cleaner.lock`` if no cleaner does; yields whether it got it (pass 2)."""
    fd = os.open(
        os.path.join(log.directory, filenames.CLEANER_LOCK),
        os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
        0o644,
    )
    try:
        if not try_lock_exclusive(fd):
            yield False
            return
        try:
            yield True
        finally:
            unlock(fd)
    finally:
        os.close(fd)


def _clear_rewrites(log: LogView, report: list[str]) -> None:
    """Pass 2 (the caller holds the cleaner lock)."""
    report.extend(swap.resolve_interrupted_swap(log.fs, log.directory))
    for name, parsed in _entries(log.directory):
        if parsed.kind is filenames.FileKind.REWRITE:
            log.fs.remove(os.path.join(log.directory, name))
            report.append(f"removed unfinished rewrite {name}")


def _remove_stray_temps(log: LogView, report: list[str]) -> None:
    """Pass 1."""
    for name, parsed in _entries(log.directory):
        if parsed.kind is not filenames.FileKind.TEMP:
            continue
        owner = filenames.temp_owner_pid(name)
        if owner is not None and pid_alive(owner):
            continue  # being written right now (by a cleaner, a subscriber's commit, ...)
        try:
            log.fs.remove(os.path.join(log.directory, name))
        except FileNotFoundError:
            continue  # renamed into place meanwhile
        report.append(f"removed unfinished temporary file {name}")


def recover_on_open(log: LogView) -> list[str]:
    """Passes 1-6 (caller holds the writers' lock). Returns what was fixed."""
    directory = log.directory
    report: list[str] = []
    writer = log.writer
    assert writer is not None
    # 1.
    _remove_stray_temps(log, report)
    # 2. - 4.
    with _closed_segments_quiet(log) as quiet:
        if quiet:
            _clear_rewrites(log, report)
            _check_closed_segments(log, report)
    # 5.
    head = read_head(writer.lock_fd)
    clean = closed_cleanly(directory, head)  # (once: pass 5 may cut the file to the head)
    if clean:
        writer.reopen_active(head, recovering=True)
    else:
        _recover_tail(log, head, report)
    # 6. ``reopen_active`` materialized what the head flags as pending; do not rely on the
    #    flag alone (a repair resets the head): entries still in the buffer belong to a dead
    #    writer, and those already in the log are skipped
    writer.materialize_left_pending()
    found = writer.take_findings()
    if found.torn_bytes:
        report.append(f"truncated a torn tail of {found.torn_bytes} bytes")
    for path, position, length in found.cuts:
        report.append(f"{os.path.basename(path)}: cut {length} bytes at byte {position}")
    for base in found.rebuilt_indexes:
        report.append(f"rebuilt index {filenames.index_name(base)}")
    if found.precommit_recovered:
        report.append(
            f"materialized {found.precommit_recovered} precommit entries left by a stopped writer"
        )
    # 7.
    if not clean:
        _keep_offsets_unique(log, head, report)
    writer.finish_recovery()
    _remove_clean_shutdown(log)
    return report


def _recover_tail(log: LogView, head: Head | None, report: list[str]) -> None:
    """Pass 5 after a crash, which may have been a power loss: the head in ``.lock`` is a
    hint (it is never fsynced), the sync point is the durable truth (head.py).

    a. A segment the sync point names (or one before it) that is gone held synced data: a
       :class:`MissingSegmentError` (``repair`` accepts the loss). A newer segment that the
       head names but that does not exist was created by a roll that a power loss (or a
       death before the file was created) took back: nothing in it was ever synced.
    b. The newest segment is validated from its start, or from the sync point: past it, the
       first invalid batch ends the data even when valid bytes follow, and a missing or
       all-zero file header means an empty segment; each cut is logged and reported.
    """
    writer = log.writer
    assert writer is not None
    directory = log.directory
    point = decode_sync_point(bytes(writer.head_map[:SYNC_POINT_END]))
    bases = list_segments(directory)
    newest = bases[-1] if bases else None
    # a.
    durable.check_newest_present(directory, bases)  # (the readers' error, word for word)
    if head is not None and (newest is None or head.active_base > newest):
        report.append(
            f"segment {filenames.segment_name(head.active_base)} named by the head was never "
            "synced and is gone (a crash during a roll)"
        )
    # b.
    cut_from = 0
    if point is not None and newest is not None:
        cut_from = point.durable_end(newest) or 0  # (None: newest < point.base, refused in a.)
    writer.reopen_active(
        None,
        trust_head=False,
        cut_from=cut_from,
        empty_base=log.meta.log_start_offset,
        recovering=True,
    )


def _keep_offsets_unique(log: LogView, head: Head | None, report: list[str]) -> None:
    """Pass 7 after a crash: never hand out an offset twice.

    Records past the sync point may be gone after a power loss, yet readers may have seen
    them (under ``"interval"`` and ``"os"`` a record is visible before it is synced) and
    subscribers may have committed past them. So the next offset is at least the head's end
    offset (what was last published) and every durable checkpoint; if the data recovered
    ends below that, the writer rolls to an empty segment at that offset and the lost
    offsets stay unused. The new segment is synced with its directory entry at once.
    """
    from ..storage.state_files import list_checkpoints

    writer = log.writer
    assert writer is not None
    published = head.end_offset if head is not None else 0
    target = max([published, *list_checkpoints(log.directory).values()])
    if target <= writer.end_offset:
        return
    lost_from = writer.end_offset
    writer.skip_to(target)
    message = (
        f"offsets {lost_from} to {target - 1} were published or committed but their records "
        f"were not on disk after the crash (unsynced data lost); the next offset is {target}"
    )
    logger.warning("%s: %s", log.directory, message)
    report.append(message)


def _check_closed_segments(log: LogView, report: list[str]) -> None:
    """Passes 3 and 4 (the caller holds the cleaner lock: no swap is under way)."""
    directory = log.directory
    # 3.
    names = _entries(directory)
    bases = sorted(
        p.base_offset
        for _n, p in names
        if p.kind is filenames.FileKind.SEGMENT and p.base_offset is not None
    )
    indexes = {p.base_offset for _n, p in names if p.kind is filenames.FileKind.INDEX}
    point = read_sync_point(directory)
    durable.check_newest_present(directory, bases)  # (before its orphan index is named)
    for orphan in sorted(b for b in indexes if b not in bases and b is not None):
        if (not bases or orphan > bases[-1]) and (point is None or orphan > point.base):
            # a roll's index whose segment a power loss took back: nothing was synced in it
            log.fs.remove(os.path.join(directory, filenames.index_name(orphan)))
            report.append(f"removed index {filenames.index_name(orphan)} of a segment never synced")
            continue
        raise MissingSegmentError(
            f"segment {filenames.segment_name(orphan)} is missing but its index exists: "
            "offsets would be lost; run repair to accept the loss",
            path=directory,
            position=0,
        )
    for base in bases[:-1]:  # (the newest one's header: pass 5, which may rewrite it)
        path = segment_path(directory, base)
        with open(path, "rb") as handle:
            check_segment_header(path, handle.read(HEADER_SIZE))
    log_start = log.meta.log_start_offset
    segment_chain.check_chain(directory, log_start)  # (none missing, none foreign)
    for base in remove_below_start(log.fs, directory, log_start):
        report.append(
            f"removed segment {filenames.segment_name(base)} below the log start {log_start}"
        )
    # 4.
    bases = list_segments(directory)
    for base in bases[:-1]:
        if _rebuild_index_if_needed(log, base):
            report.append(f"rebuilt index {filenames.index_name(base)}")


def _rebuild_index_if_needed(log: LogView, base: int) -> bool:
    """Rebuild a closed segment's index if it is missing or inconsistent (pass 4)."""
    directory = log.directory
    size = os.path.getsize(segment_path(directory, base))
    if index_is_consistent(read_index(directory, base), size):
        return False
    rebuild_index(log.fs, directory, base, log.config.index_interval_bytes)
    return True


# -- the clean-shutdown marker -----------------------------------------------------------


def write_clean_shutdown(log: LogView, head: Head) -> None:
    """Written by ``close()`` after the final fsync: the head as it was then."""
    try:
        log.fs.write_atomic(log.directory, filenames.CLEAN_SHUTDOWN, encode_head(head))
    except OSError:
        pass  # without the marker the next open validates the tail: slower, equally safe


def _remove_clean_shutdown(log: LogView) -> None:
    try:
        log.fs.remove(os.path.join(log.directory, filenames.CLEAN_SHUTDOWN))
    except FileNotFoundError:
        pass


# -- repair ------------------------------------------------------------------------------


@dataclass
class RepairReport:
    """What :func:`repair` fixed (or, with ``dry_run``, would fix)."""

    path: str
    fixes: list[str] = field(default_factory=list)
    dry_run: bool = False

    @property
    def clean(self) -> bool:
        """Whether the repair found nothing to fix."""
        return not self.fixes

    def __str__(self) -> str:
        if not self.fixes:
            return f"{self.path}: nothing to repair"
        return "\n".join(self.fixes)


def repair(
    path: str | os.PathLike[str],
    *,
    dry_run: bool = False,
    open_passes: Callable[[str], list[str]],
    rebuild_meta: bool = False,
    meta_from: str | None = None,
) -> RepairReport:
    """``jlogctl repair``: fix what can be fixed without deleting a valid batch.

    Stop writers first (the writers' lock is taken, so concurrent appends wait; a log an
    ``exclusive=True`` writer holds is refused at once with :class:`LogLockedError` naming
    its pid, as that writer keeps the lock for as long as it runs).
    ``open_passes(directory)`` opens the log for writing, runs the open-time passes and
    returns their report (``compactlog.repair`` passes one: this module is below ``log.py``).
    ``rebuild_meta``: rebuild a missing or unreadable ``meta`` (``repair_state.py``), over
    the settings of ``meta_from`` (a snapshot or backup of the log) when given.
    """
    from ..storage.fsio import DEFAULT_FS
    from ..storage.state_files import read_meta, readable_checkpoints, write_checkpoint, write_meta

    directory = os.path.abspath(os.fspath(path))
    report = RepairReport(directory, dry_run=dry_run)
    if not rebuild_meta or repair_state.meta_problem(directory) is None:
        read_meta(directory)  # (a damaged meta is named, with the flag that rebuilds it)
    fs = DEFAULT_FS

    def fix(message: str, action: object = None) -> None:
        report.fixes.append(message)
        if not dry_run and callable(action):
            action()

    cleaner_fd = os.open(
        os.path.join(directory, filenames.CLEANER_LOCK),
        os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
        0o644,
    )
    if not try_lock_exclusive(cleaner_fd):
        os.close(cleaner_fd)
        raise LogLockedError(
            "a cleaner is working on this log; stop it before repair", path=directory
        )
    try:
        # refused at once while an exclusive writer lives (it holds ``.lock`` for good, so
        # the flock below would wait for as long as it runs), naming its pid
        writers_fd = register_writer(
            directory, os.path.join(directory, filenames.WRITERS_LOCK), exclusive=False
        )
    except BaseException:
        unlock(cleaner_fd)
        os.close(cleaner_fd)
        raise
    lock_fd = os.open(
        os.path.join(directory, filenames.WRITER_LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644
    )
    try:
        import fcntl

        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        if rebuild_meta:
            report.fixes.extend(
                repair_state.rebuild_meta(fs, directory, dry_run=dry_run, source=meta_from)
            )
            if dry_run and repair_state.meta_problem(directory) is not None:
                return report  # (nothing more can be judged without a meta)
        meta = read_meta(directory)
        # an interrupted segment swap is finished or undone first: its .rw files decide which
        if os.path.exists(os.path.join(directory, swap.SWAP_INTENT)):
            if dry_run:
                report.fixes.append("would resolve an interrupted segment swap (cleaner.swap)")
            else:
                report.fixes.extend(swap.resolve_interrupted_swap(fs, directory))
        names = _entries(directory)
        for name, parsed in names:
            if parsed.kind in (filenames.FileKind.TEMP, filenames.FileKind.REWRITE):
                fix(
                    f"removed unfinished file {name}",
                    lambda n=name: fs.remove(os.path.join(directory, n)),
                )
        bases = sorted(
            p.base_offset
            for _n, p in names
            if p.kind is filenames.FileKind.SEGMENT and p.base_offset is not None
        )
        for name, parsed in names:
            if parsed.kind is filenames.FileKind.INDEX and parsed.base_offset not in bases:
                fix(
                    f"segment {filenames.segment_name(parsed.base_offset or 0)} is missing: "
                    "its offsets are lost; "
                    f"removed its orphan index {name}",
                    lambda n=name: fs.remove(os.path.join(directory, n)),
                )
        if meta.uncleanable:
            fix(
                f"cleared the uncleanable mark ({meta.uncleanable})",
                lambda: setattr(meta, "uncleanable", None),
            )
        lost_end = _lost_active_end(read_head(lock_fd), bases, names)
        # the segments the log will hold: with its only one lost, the empty one made below
        kept = bases or ([lost_end] if lost_end is not None else [])
        first = kept[0] if kept else meta.log_start_offset
        if (
            kept
            and meta.log_start_offset != first
            and not (kept[0] <= meta.log_start_offset < (kept[1] if len(kept) > 1 else 1 << 62))
        ):
            fix(
                f"fixed the log start offset in meta: {meta.log_start_offset} -> {first}",
                lambda: setattr(meta, "log_start_offset", first),
            )
        if not dry_run:
            write_meta(fs, directory, meta)
        start = max(meta.log_start_offset, first) if kept else meta.log_start_offset
        report.fixes.extend(repair_state.repair_checkpoints(fs, directory, start, dry_run=dry_run))
        report.fixes.extend(repair_state.repair_cleaner_checkpoint(fs, directory, dry_run=dry_run))
        for subscriber, offset in readable_checkpoints(directory).items():
            if offset < start:
                fix(
                    f"fixing checkpoint of subscriber {subscriber!r}: offset {offset} "
                    f"is below the log start {start}",
                    lambda s=subscriber: write_checkpoint(fs, directory, s, start),
                )
        if lost_end is not None:
            fix(
                f"the active segment is missing: created an empty segment "
                f"{filenames.segment_name(lost_end)} so that lost offsets are never reused",
                lambda: _create_empty_segment(fs, directory, lost_end),
            )
        for base in bases:
            _repair_segment(
                report,
                fs,
                directory,
                base,
                dry_run=dry_run,
                interval=meta.config.index_interval_bytes,
            )
        report.fixes.extend(repair_state.repair_chain(fs, directory, dry_run=dry_run))
        if bases:
            _lower_durable_point(report, fs, directory, lock_fd, bases[-1], dry_run=dry_run)
        if not dry_run:
            for name in (filenames.CLEAN_SHUTDOWN,):
                try:
                    fs.remove(os.path.join(directory, name))
                except FileNotFoundError:
                    pass
            head = read_head(lock_fd)
            if head is not None:
                # make the next writer revalidate the tail (size 0 is never trusted), keeping
                # the precommit-pending flag so that a dead writer's buffer is materialized
                fs.pwrite(lock_fd, encode_head(head._replace(active_size=0)), 0)
        os.close(lock_fd)
        lock_fd = -1
        if not dry_run:
            # the open-time passes: tail validation, precommit left by a dead writer
            report.fixes.extend(open_passes(directory))
    finally:
        if lock_fd >= 0:
            os.close(lock_fd)
        release_writer(writers_fd, exclusive=False)
        unlock(cleaner_fd)
        os.close(cleaner_fd)
    return report


def _lower_durable_point(
    report: RepairReport, fs: FileSystem, directory: str, lock_fd: int, base: int, *, dry_run: bool
) -> None:
    """After the newest segment's damage was quarantined (or its bytes were found missing),
    its durable point (the sync point, ``storage/durable.py``) may lie past its end: move it
    to the end, so that readers and the next writer take what is left as whole, and say so
    (the records below the old point that are gone were damage, not a torn tail)."""
    point = decode_sync_point(os.pread(lock_fd, SYNC_POINT_END, 0))
    size = os.path.getsize(segment_path(directory, base))
    if point is None or point.base != base or size >= point.size:
        return
    name = filenames.segment_name(base)
    report.fixes.append(
        f"{name}: {point.size - size} bytes below its durable point (byte {point.size}) were "
        f"damaged or missing (damage, not a torn tail): the durable point is now its end, "
        f"byte {size}"
    )
    if dry_run:
        return
    fs.pwrite(lock_fd, encode_sync_point(base, size), SYNC_POINT_AT)
    fs.fdatasync(lock_fd)
    # the offsets of the records lost are never handed out again (as after a crash, pass
    # 7, but said as what it is): new records start past the end the head published
    head = read_head(lock_fd)
    with open(segment_path(directory, base), "rb") as handle:
        found = scan_segment(name, handle.read(), HEADER_SIZE).next_offset
    left = base if found is None else found
    if head is not None and head.active_base == base and head.end_offset > left:
        _create_empty_segment(fs, directory, head.end_offset)
        report.fixes.append(
            f"offsets {left} to {head.end_offset - 1} were lost to that damage: created an "
            f"empty segment {filenames.segment_name(head.end_offset)} so that they are "
            "never reused"
        )


def _lost_active_end(
    head: Head | None, bases: list[int], names: list[tuple[str, filenames.ParsedName]]
) -> int | None:
    """Where new offsets must start when the newest segment is gone: the end offset the head
    recorded (or, without a head, the base of the newest orphan index, a lower bound)."""
    last = bases[-1] if bases else -1
    if head is not None and head.active_base not in bases and head.active_base > last:
        return head.end_offset if head.end_offset > last else None
    orphans = [
        p.base_offset
        for _n, p in names
        if p.kind is filenames.FileKind.INDEX and p.base_offset is not None and p.base_offset > last
    ]
    return max(orphans) if orphans and head is None else None


def _create_empty_segment(fs: FileSystem, directory: str, base: int) -> None:
    fd = fs.open(segment_path(directory, base), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        fs.write(fd, SEGMENT_FILE_HEADER)
        fs.fsync(fd)
    finally:
        fs.close(fd)
    fs.fsync_dir(directory)


def _repair_segment(
    report: RepairReport, fs: FileSystem, directory: str, base: int, *, dry_run: bool, interval: int
) -> None:
    path = segment_path(directory, base)
    name = filenames.segment_name(base)
    with open(path, "rb") as handle:
        data = handle.read()
    if len(data) < HEADER_SIZE:
        report.fixes.append(f"{name}: rewrote a torn file header")
        if not dry_run:
            with open(path, "r+b") as handle:
                handle.write(SEGMENT_FILE_HEADER)
                handle.truncate(HEADER_SIZE)
        data = SEGMENT_FILE_HEADER
    rebuilt = repair_state.rebuilt_header(data)
    if rebuilt is not None:  # (the batches behind it are checked below)
        report.fixes.append(f"{name}: rebuilt a damaged file header ({rebuilt[1]})")
        if not dry_run:
            fd = fs.open(path, os.O_WRONLY)
            try:
                fs.pwrite(fd, rebuilt[0], 0)
                fs.fsync(fd)
            finally:
                fs.close(fd)
        data = rebuilt[0] + data[HEADER_SIZE:]
    keep: list[tuple[int, int]] = []  # valid batch ranges
    bad: list[tuple[int, int]] = []  # unreadable ranges
    for pos, item in walk(data, HEADER_SIZE, len(data)):
        if isinstance(item, Damage):
            bad.append((pos, len(data) if item.resume is None else item.resume))
        else:
            keep.append((pos, pos + item.length))
    if bad:
        rewritten = data[:HEADER_SIZE] + b"".join(data[a:b] for a, b in keep)  # (its link)
        for a, b in bad:
            quarantine = filenames.quarantine_name(name, a)
            report.fixes.append(
                f"{name}: moved {b - a} unreadable bytes at byte {a} to {quarantine}"
            )
            if not dry_run:
                fs.write_atomic(directory, quarantine, data[a:b])
        if not dry_run:
            temp = filenames.rewrite_name(name)
            fd = fs.open(os.path.join(directory, temp), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            try:
                fs.write(fd, rewritten)
                fs.fsync(fd)
            finally:
                fs.close(fd)
            fs.rename(os.path.join(directory, temp), path)
            fs.fsync_dir(directory)
        data = rewritten
    entries = read_index(directory, base)
    result = None
    try:
        result = scan_segment(path, data, HEADER_SIZE, index_interval=interval)
    except CorruptLogError:
        result = None
    good = entries is not None and index_is_consistent(entries, len(data))
    if good and entries is not None:
        good = first_wrong_entry(entries, base, batch_base_at(data)) is None
    if not good and result is not None:
        report.fixes.append(f"rebuilt index {filenames.index_name(base)}")
        if not dry_run:
            rebuild_index(fs, directory, base, interval)
