"""The public :class:`Log`: one directory of segments, opened by :func:`open_log`.

This module composes the pieces; it owns no file format. Appends go through ``appends.py``
(a part of :class:`Log`) to ``engine.writer.SegmentWriter``, reads through
``engine.reader.iter_batches``, open-time recovery through ``engine.recovery``, retention
through ``storage.retention``.
"""

from __future__ import annotations

import functools
import itertools
import operator
import os
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .appends import LogAppends
from .config import PER_PROCESS, WRITER_CACHED, LogConfig, check_change
from .encoding.batch_decode import Record, RecordBatch
from .encoding.serde import (
    RAW,
    Deserializer,
    Serde,
    Serializer,
    check_stored,
    serde_for,
    serializing_append,
)
from .engine import recovery
from .engine.reader import iter_batches
from .engine.single import build_plain_append
from .engine.writer import SegmentWriter
from .errors import (
    ConfigError,
    InvalidArgumentError,
    LogClosedError,
    NotALogError,
    ReadOnlyLogError,
    SettingIgnoredWarning,
)
from .storage import filenames, retention
from .storage.cleaner_lock import CleanerLock
from .storage.fsio import DEFAULT_FS, FileSystem, make_directories
from .storage.head import (
    lock_exclusive,
    other_writers,
    read_log_head,
    register_writer,
    release_writer,
)
from .storage.log_identity import new_log_id
from .storage.logdirs import absolute_directory, wait_for_log
from .storage.segment import TimestampCache, list_segments, segment_data_size
from .storage.state_files import Meta, add_log_id, list_checkpoints, read_meta, write_meta

if TYPE_CHECKING:  # imported where used: they pull in modules an open need not load
    from .compaction.stats import CleanerStats
    from .engine.snapshot import Snapshot
    from .engine.subscriber import Subscriber


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class Log(LogAppends):
    """An open log. Thread-safe; share one per process, or open it in many processes.

    ``exclusive=True`` makes this open the log's only writer for its lifetime (Kafka's one
    leader per partition): the writers' lock is taken once, so a single append is one
    ``pwrite`` of the record and one of the head. Any other writable open, in any process,
    is refused with :class:`LogLockedError` naming this process's pid (and an exclusive open
    is refused while another writer has the log open). Readers, subscribers and read-only
    tools are unaffected; the lock goes with the process if it is killed.

    Keys and values are converted by the formats the log declares (``key_format``,
    ``value_format``) or by ``key_serializer``/``value_serializer`` and
    ``key_deserializer``/``value_deserializer`` given here (callables or built-in format
    names; see :mod:`compactlog.encoding.serde`); ``raw=True`` ignores both (bytes in, bytes out).

    Settings (``**config``) come in two groups (``config.PER_PROCESS``; the user guide,
    sections 3 and 8). *Stored* settings are the log's own: applied when this open creates the
    log; on an existing log one that differs from the stored value is ignored with a
    :class:`SettingIgnoredWarning` naming both values, unless ``update_config=True``, which
    stores them through the checks of ``compactlog config set`` (``config.check_change``:
    :class:`~compactlog.errors.UnsafeChangeError` when refused). *Per-process* settings
    (``sync``, ``sync_interval_ms``, ``linger_ms``, ``batch_records``) say how this open
    writes: on an existing log they apply to this open only, are never stored (unless
    ``update_config=True``) and never warned about; an open that creates the log stores them
    as the defaults of opens that pass none.

    ``wait`` (with ``read_only=True`` or ``create=False``): when no log is there yet, wait
    for one to be created, up to ``wait`` seconds (``True``: for ever), looking for its
    ``meta`` file at growing intervals of at most 0.25 s; past the deadline
    :class:`~compactlog.errors.NotALogError` says how long it waited.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        create: bool = True,
        read_only: bool = False,
        exclusive: bool = False,
        clock: Callable[[], int] | None = None,
        update_config: bool = False,
        wait: float | bool = False,
        key_serializer: Serializer | str | None = None,
        value_serializer: Serializer | str | None = None,
        key_deserializer: Deserializer | str | None = None,
        value_deserializer: Deserializer | str | None = None,
        raw: bool = False,
        _fs: FileSystem | None = None,
        **config: Any,
    ) -> None:
        self.directory = absolute_directory(path)
        self._raw = raw
        self._conversions = {
            "key_serializer": key_serializer,
            "value_serializer": value_serializer,
            "key_deserializer": key_deserializer,
            "value_deserializer": value_deserializer,
        }
        self.serde: Serde = RAW
        self.read_only = read_only
        if exclusive and read_only:
            raise ConfigError("exclusive=True is for writers; a read_only open takes no lock")
        if update_config and read_only:
            raise ConfigError(
                "update_config=True changes stored settings; a read_only open cannot",
                path=self.directory,
            )
        if wait is not False:
            wait_for_log(self.directory, wait, create=create, read_only=read_only)
        self.exclusive = exclusive
        self._update_config = update_config
        self._live_writers = ""  # who else writes, when update_config must know (see below)
        # per-process settings for this open only (all of them are stored by update_config)
        self._process = {} if update_config else {n: config[n] for n in config if n in PER_PROCESS}
        self._writers_fd = -1
        self.clock: Callable[[], int] = clock or wall_clock_ms
        self._wall_clock = clock is None  # append() then reads time_ns() itself
        self.fs = _fs or DEFAULT_FS
        self._closed = False
        self._meta_lock = threading.Lock()
        self._subscribers: weakref.WeakSet[Any] = weakref.WeakSet()  # closed by close()
        self._timestamp_cache: TimestampCache = {}
        self.recovery_report: list[str] = []
        self.writer: SegmentWriter | None = None
        self._plain_installed = False  # whether append is the plain path's (single.py)
        self._own_append = False  # whether this object has an append of its own
        try:
            self.meta = self._load_or_create(create, config)
            if not read_only:
                self.writer = SegmentWriter(
                    self.directory,
                    self.fs,
                    self.config,
                    self.clock,
                    lambda: self.meta.log_start_offset,
                    exclusive=exclusive,
                )
                try:
                    with self.writer.pause_appends():
                        self.recovery_report = recovery.recover_on_open(self)
                except BaseException:
                    self.writer.close()
                    raise
                self.writer.start_background()
                self._choose_append_path()
        except BaseException:
            self._release_writers_lock()
            raise

    def _release_writers_lock(self) -> None:
        if self._writers_fd >= 0:
            release_writer(self._writers_fd, exclusive=self.exclusive)
            self._writers_fd = -1

    # -- opening -----------------------------------------------------------------------
    def _load_or_create(self, create: bool, config: Mapping[str, Any]) -> Meta:
        """Read ``meta``, creating the log with ``config`` or (``update_config``) storing
        ``config`` in it.

        Writers do this holding the writers' lock, so that processes opening one log at
        once neither lose each other's config changes nor create it twice.
        """
        if os.path.lexists(self.directory) and not os.path.isdir(self.directory):
            raise NotALogError("not a directory, so not a compactlog log", path=self.directory)
        if not os.path.exists(os.path.join(self.directory, filenames.META)):
            # an open that may create the log checks its settings before it makes the
            # directory or a lock file: a ConfigError changes nothing
            try:
                LogConfig.from_mapping(config)
            except ConfigError as error:
                raise ConfigError(str(error), path=self.directory) from None
        if not os.path.isdir(self.directory):
            if not create or self.read_only:
                raise NotALogError("no such log directory", path=self.directory)
            make_directories(self.fs, self.directory)
        if self.read_only:
            return self._load_or_create_locked(create, config)
        self._refuse_foreign_directory()  # before a lock file is put into it
        # (asked before this open registers, as it then counts as a writer itself)
        others = (
            self._update_config
            and any(name in WRITER_CACHED for name in config)
            and other_writers(os.path.join(self.directory, filenames.WRITERS_LOCK))
        )
        self._live_writers = "another process has the log open for writing" if others else ""
        # refused at once (never blocked) when an exclusive writer holds the log
        self._writers_fd = register_writer(
            self.directory,
            os.path.join(self.directory, filenames.WRITERS_LOCK),
            exclusive=self.exclusive,
        )
        fd = os.open(
            os.path.join(self.directory, filenames.WRITER_LOCK),
            os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
            0o644,
        )
        try:
            lock_exclusive(fd)
            return self._load_or_create_locked(create, config)
        finally:
            os.close(fd)  # releases the lock; the writer takes it on its own descriptor

    def _refuse_foreign_directory(self) -> None:
        if os.path.exists(os.path.join(self.directory, filenames.META)):
            return
        # a temporary file is a meta being written by a process creating the log right now
        # (or one that died doing so): not a sign of a foreign directory
        entries = [
            n
            for n in os.listdir(self.directory)
            if not n.startswith(".")
            and filenames.parse_filename(n).kind is not filenames.FileKind.TEMP
        ]
        if entries:
            raise NotALogError(
                f"directory is not empty and has no meta file ({len(entries)} entries, "
                f"e.g. {sorted(entries)[0]!r}): not a compactlog log",
                path=self.directory,
            )

    def _load_or_create_locked(self, create: bool, config: Mapping[str, Any]) -> Meta:
        meta_path = os.path.join(self.directory, filenames.META)
        if not os.path.exists(meta_path):
            self._refuse_foreign_directory()
            if not create or self.read_only:
                raise NotALogError("not a compactlog log (no meta file)", path=self.directory)
            # per-process settings too: they become the defaults of opens that pass none
            meta = Meta(config=LogConfig.from_mapping(config), log_id=new_log_id())
            write_meta(self.fs, self.directory, meta)
            return meta
        meta = read_meta(self.directory)
        if meta.log_id is None and not self.read_only:  # (a log made before ids: give it one)
            meta.log_id = add_log_id(self.fs, self.directory, new_log_id())
        if self._update_config:
            return self._store_config_locked(config, self._live_writers, "stop the writer first")
        wanted = meta.config.merged(config)  # unknown names and bad values are still errors
        meta.config.merged(self._process)  # what this open works with must be valid as a whole
        stored = [n for n in config if n not in self._process]
        ignored = [n for n in stored if getattr(wanted, n) != getattr(meta.config, n)]
        for name in ignored:
            warnings.warn(
                f"{self.directory}: {name}={config[name]!r} ignored: the log stores "
                f"{name}={getattr(meta.config, name)!r} (settings given to open() apply when "
                "it creates the log; update_config=True or `compactlog config set` changes "
                "them)",
                SettingIgnoredWarning,
                stacklevel=_caller_stacklevel(),
            )
        return meta

    @property
    def meta(self) -> Meta:
        """The log's ``meta`` (config, log start offset) as this open last read or wrote it."""
        return self._meta

    @meta.setter
    def meta(self, meta: Meta) -> None:
        self._meta = meta
        # the stored config with this open's per-process settings (checked once, at open)
        self._config = replace(meta.config, **self._process) if self._process else meta.config
        if not self._raw:
            config = meta.config
            self.serde = serde_for(
                self.directory, config.key_format, config.value_format, **self._conversions
            )
        self._choose_append_path()  # the config may have changed what append() may skip

    def _choose_append_path(self) -> None:
        """Install, once per config rather than once per record, this log's own ``append``
        for plain records (``single.build_plain_append``: bytes key and value, no headers,
        the wall clock, one frame from the call to the ``pwrite``) where nothing between the
        two would touch the record: a writer with no buffer (``SegmentWriter.plain_single``)
        on the plain file system, no compression, the default clock and no fsync per append
        (``sync="always"`` publishes a record only once it is synced: the general path).
        Otherwise, and once closed, ``append`` is :meth:`Log.append` itself. A log whose keys
        or values are serialized gets an ``append`` that serializes, then calls either."""
        config = self._meta.config
        writer = self.writer
        general = Log.append.__get__(self)
        append = general
        if (
            writer is not None
            and writer.plain_single
            and writer.plain_fs
            and writer.config.sync != "always"  # (it publishes after the fsync: the general path)
            and config.compression == "none"
            and self._wall_clock
            and not self._closed
        ):
            plain = build_plain_append(writer, config.max_record_bytes, general)
            append = functools.update_wrapper(plain, general)
        if self.serde.serializes and not self._closed:
            append = functools.update_wrapper(serializing_append(append, self.serde), general)
        if append is general:
            self._remove_plain_append()
        else:
            self.append = append  # type: ignore[method-assign]
            self._own_append = True
            self._plain_installed = not self.serde.serializes

    def _remove_plain_append(self) -> None:
        # (by attribute, never through self.__dict__: asking for the dict of an instance
        # makes CPython keep its attributes in a real dict from then on, and every attribute
        # load of Log.append's general path measurably slower: 0.1 us per precommit append)
        self._plain_installed = False
        if self._own_append:
            self._own_append = False
            del self.append

    @property
    def plain_append_installed(self) -> bool:
        """Whether plain records take the one-frame path (``single.py``); for tests and
        benchmarks that must know which path they measure."""
        return self._plain_installed

    @property
    def config(self) -> LogConfig:
        """The settings this open works with: the stored ones (``meta.config``) and this
        open's per-process settings."""
        return self._config

    @property
    def path(self) -> str:
        """The log's directory, absolute (as every error about this log names it)."""
        return self.directory

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosedError("log is closed", path=self.directory)

    def _writable(self) -> SegmentWriter:
        self._check_open()
        if self.writer is None:
            raise ReadOnlyLogError("log was opened read_only", path=self.directory)
        return self.writer

    def store_config(
        self,
        changes: Mapping[str, Any],
        *,
        live_writers: str = "",
        remedy: str = "stop the writer first",
    ) -> LogConfig:
        """Store ``changes`` to the log's settings through ``config.check_change`` (the
        rules of ``compactlog config set``, which calls this), under the writers' lock;
        returns the stored config. An open log cannot see other writers itself (it is one):
        ``live_writers`` names those the caller found, for the refusal of a setting writers
        read only at open; ``remedy`` ends that refusal. This open's own writer keeps the
        settings it opened with: reopen to write with the new ones."""
        writer = self._writable()
        with writer.pause_appends():
            return self._store_config_locked(changes, live_writers, remedy).config

    def _store_config_locked(
        self, changes: Mapping[str, Any], live_writers: str, remedy: str
    ) -> Meta:
        """Read ``meta``, check ``changes`` against it, write it if they change it (caller
        holds the writers' lock)."""
        meta = read_meta(self.directory)
        head = read_log_head(self.directory)
        changed = check_change(
            meta.config,
            changes,
            precommit_pending=bool(head and head.precommit_pending),
            live_writers=live_writers,
            remedy=remedy,
            path=self.directory,
        )
        check_stored(
            self.directory,
            lambda: iter_batches(self.directory, meta.log_start_offset, None),
            meta.config,
            changed,
        )
        if changed != meta.config:
            meta.config = changed
            write_meta(self.fs, self.directory, meta)
        return meta

    def update_meta(self, **changes: Any) -> None:
        """Persist changes to ``meta`` (log start offset, uncleanable reason, config)."""
        with self._meta_lock:
            current = read_meta(self.directory)
            for name, value in changes.items():
                setattr(current, name, value)
            write_meta(self.fs, self.directory, current)
            self.meta = current

    def reload_meta(self) -> Meta:
        """Read ``meta`` again (another process may have changed settings) and return it."""
        self.meta = read_meta(self.directory)
        return self.meta

    # -- offsets -----------------------------------------------------------------------
    @property
    def end_offset(self) -> int:
        """The next offset to be assigned (as the last writer of any process left it)."""
        self._check_open()
        head = read_log_head(self.directory)
        if head is not None:
            return head.end_offset
        if self.writer is not None:
            return self.writer.end_offset
        return self._recovered_end()

    def _recovered_end(self) -> int:
        """The end offset when no live writer stands behind a head (there is none yet, or
        only one from before a power loss or reboot): where the next writer's recovery will
        start new offsets, past the valid data of the newest segment, the last head's end
        offset and every durable subscriber checkpoint (``recovery`` passes 5 and 7)."""
        stale = read_log_head(self.directory, any_boot=True)
        if stale is not None and recovery.closed_cleanly(self.directory, stale):
            return stale.end_offset  # (closed, then rebooted: the head is a fact, no scan)
        bases = list_segments(self.directory)
        last = max(self.start_offset, bases[-1] if bases else 0)
        if bases:
            for batch in iter_batches(self.directory, bases[-1], None):
                last = max(last, batch.next_offset)
        return max(
            [last, stale.end_offset if stale else 0, *list_checkpoints(self.directory).values()]
        )

    @property
    def start_offset(self) -> int:
        """The first offset that may still be present (Kafka's log start offset)."""
        self._check_open()
        bases = list_segments(self.directory)
        start = self.meta.log_start_offset
        return max(start, bases[0]) if bases else start

    def _first_base(self) -> int:
        bases = list_segments(self.directory)
        return bases[0] if bases else 0

    # -- reading -----------------------------------------------------------------------
    def read_batches(
        self, start: int | None = None, end: int | None = None
    ) -> Iterator[RecordBatch]:
        """Columnar batches holding offsets ``[start, end)``; no per-record objects.

        ``end`` defaults to the end offset when the call is made.
        """
        self._check_open()
        start = _check_offset("start", start, self.directory)
        end = _check_offset("end", end, self.directory)
        first = self.start_offset if start is None else max(start, self.start_offset)
        stop = self.end_offset if end is None else end
        return iter_batches(self.directory, first, stop)

    def read(
        self, start: int | None = None, end: int | None = None, *, raw: bool = False
    ) -> Iterator[Record]:
        """Records with offsets in ``[start, end)`` in offset order, keys and values
        deserialized (``raw=True``: as stored, bytes)."""
        convert = RecordBatch.records if raw else self.serde.records
        return itertools.chain.from_iterable(map(convert, self.read_batches(start, end)))

    def read_arrow(
        self, start: int | None = None, end: int | None = None, *, value_type: Any = None
    ) -> Any:
        """Records with offsets in ``[start, end)`` as one ``pyarrow.Table`` (columns
        ``key``, ``value`` (null: a tombstone), ``offset``, ``timestamp``, ``headers``),
        built from the columnar batches with no per-record object. Keys and values have
        the types of the declared formats (``binary`` for bytes and with ``raw=True``,
        ``string`` for str and json); ``value_type``, a ``pyarrow.struct``, parses a json
        log's values into it (:mod:`compactlog.arrow.tables`)."""
        from .arrow.tables import arrow_table

        return arrow_table(self.read_batches(start, end), *self._arrow_formats(), value_type)

    def _arrow_formats(self) -> tuple[str, str]:
        if self._raw:
            return "bytes", "bytes"
        return self._meta.config.key_format, self._meta.config.value_format

    def get_segments(self) -> list[int]:
        """The base offsets of the log's segment files, oldest first, as the directory
        lists them now (the last is the active segment)."""
        return list_segments(self.directory)

    # -- retention ---------------------------------------------------------------------
    def enforce_retention(self, *, now_ms: int | None = None) -> retention.RetentionResult:
        """Apply ``delete``/``consumed`` retention now: remove whole closed segments."""
        self._writable()
        now = self.clock() if now_ms is None else now_ms
        with self.cleaner_lock(wait=True):
            self.reload_meta()  # retention settings may have changed since this log opened
            return self._enforce_retention_locked(now)

    def _enforce_retention_locked(
        self, now: int, config: LogConfig | None = None
    ) -> retention.RetentionResult:
        """:meth:`enforce_retention` for a caller already holding the cleaner lock
        (``compact()`` runs it at the end of every pass, with the pass's ``config``)."""
        writer = self._writable()
        with writer.pause_appends():
            infos = retention.closed_segments(self.directory, self._timestamp_cache)
            active_base = list_segments(self.directory)[-1]
            total = sum(i.size for i in infos) + segment_data_size(
                self.directory, active_base, read_log_head(self.directory)
            )
            doomed, reason = retention.select_for_deletion(
                config or self.config, infos, total, now, self.subscribers()
            )
            removed = retention.delete_segments(
                self.fs,
                self.directory,
                doomed,
                lambda start: self.update_meta(log_start_offset=start),
            )
        return retention.RetentionResult(
            [d.base for d in doomed], removed, self.start_offset, reason
        )

    def cleaner_lock(self, *, wait: bool = False, brief: bool = False) -> CleanerLock:
        """``.cleaner.lock`` (:class:`CleanerLock`); ``brief``: this holder keeps it for
        milliseconds, so a cleaning pass that meets it waits instead of failing."""
        return CleanerLock(self.directory, wait=wait, brief=brief)

    # -- subscribers (durable checkpoints) ----------------------------------------------
    def subscribers(self) -> dict[str, int]:
        """``{name: committed offset}`` of every durable subscriber."""
        self._check_open()
        return list_checkpoints(self.directory)

    def subscribe(self, name: str, *, start: int | None = None, raw: bool = False) -> Subscriber:
        """A subscriber: durable (checkpointed) or, for names starting with ``~``, transient.

        A durable name has one consumer at a time in all processes and threads: while one
        is open, this raises :class:`SubscriberBusyError` naming the holder's pid.
        :meth:`close` closes every subscriber made here. Its ``poll`` deserializes keys and
        values as :meth:`read` does (``raw=True``: bytes).
        """
        from .engine.subscriber import Subscriber

        self._check_open()
        subscriber = Subscriber(self, name, start=start, serde=RAW if raw else self.serde)
        self._subscribers.add(subscriber)
        if self._closed:  # close() ran in another thread meanwhile and missed this one
            subscriber.close()
            raise LogClosedError("log is closed", path=self.directory)
        return subscriber

    def remove_subscriber(self, name: str, *, force: bool = False) -> None:
        """Forget a durable subscriber and its checkpoint. Refuses with
        :class:`SubscriberBusyError` while a consumer holds the name, unless ``force``."""
        from .engine.subscriber import remove_subscriber

        self._check_open()
        remove_subscriber(self, name, force=force)

    def check(self, *, deep: bool = False) -> None:
        """Assert the log's invariants (``compactlog.engine.invariants``: segment order, batches,
        index entries, the head within the newest segment, checkpoints and the cleaner point
        within bounds); raises :class:`~compactlog.errors.LogCheckError` listing every one
        violated. Cheap by default (batch headers); ``deep=True`` checks every CRC too. A
        writable log holds its writer's lock meanwhile (this process's appends wait) and
        checks the head as a fact: with writers in other processes, call it while they are
        quiet."""
        from .engine.invariants import check

        self._check_open()
        writer = self.writer
        if writer is None:
            check(self.directory, deep=deep)
            return
        with writer.lock:
            check(self.directory, deep=deep, head_is_fact=True)

    # -- compaction and the latest state -------------------------------------------------
    def compact(
        self,
        force: bool = False,
        *,
        now_ms: int | None = None,
        progress: Callable[[Any], None] | None = None,
    ) -> CleanerStats:
        """One cleaning pass if due (``force``: regardless of the dirty ratio), then
        retention. Returns the pass's statistics. ``progress`` is called with
        ``compactlog.compaction.CompactionProgress`` events (bytes done and planned, per
        phase); a failed write raises ``CompactionWriteError`` (``DiskFullError``) after
        rolling back (``docs/compaction.md``)."""
        from .compaction import compact_log

        self._writable()
        return compact_log(self, force=force, now_ms=now_ms, progress=progress)

    def latest(
        self, as_of: int | None = None, *, allow_inexact: bool = False, raw: bool = False
    ) -> Iterator[Record]:
        """The latest non-tombstone record of every key among offsets below ``as_of``, keys
        and values deserialized (``raw=True``: bytes). ``as_of`` below the cleaner point
        raises ``InexactReadError`` (naming the lowest exact offset) unless
        ``allow_inexact`` (``compactlog.engine.latest.check_exact``)."""
        from .engine.latest import latest_batches

        self._check_open()
        convert = RecordBatch.records if raw else self.serde.records
        batches = latest_batches(self, as_of, allow_inexact=allow_inexact)
        return itertools.chain.from_iterable(map(convert, batches))

    def latest_batches(
        self, as_of: int | None = None, *, allow_inexact: bool = False
    ) -> Iterator[RecordBatch]:
        """The same as :meth:`latest`, as columnar batches (no per-record objects)."""
        from .engine.latest import latest_batches

        self._check_open()
        return latest_batches(self, as_of, allow_inexact=allow_inexact)

    def table(self, **options: Any) -> Any:
        """The latest state as a live mapping that follows this log's appends (from any
        process): a :class:`compactlog.table.table.Table`; see it for ``options``."""
        from .table.table import Table

        self._check_open()
        return Table(self.directory, **options)

    def latest_arrow(
        self, as_of: int | None = None, *, allow_inexact: bool = False, value_type: Any = None
    ) -> Any:
        """The same as :meth:`latest`, as one ``pyarrow.Table`` (the columns and types of
        :meth:`read_arrow`); ``table.to_pandas()`` and ``polars.from_arrow(table)`` take it."""
        from .arrow.tables import arrow_table

        batches = self.latest_batches(as_of, allow_inexact=allow_inexact)
        return arrow_table(batches, *self._arrow_formats(), value_type)

    # -- snapshots ---------------------------------------------------------------------
    def snapshot(self, dest: str | os.PathLike[str]) -> Snapshot:
        """A consistent point-in-time copy of this log at ``dest`` (hard links for closed
        segments), as of the end offset now; writers and the cleaner keep working. Returns
        a :class:`~compactlog.engine.snapshot.Snapshot`; the copy opens with ``read_only=True``."""
        from .engine.snapshot import take_snapshot

        self._check_open()
        return take_snapshot(self, dest)

    # -- closing -----------------------------------------------------------------------
    def close(self) -> None:
        """Close the subscribers made by :meth:`subscribe` (their descriptors and names are
        released; using one afterwards raises :class:`LogClosedError`), then the writer."""
        if self._closed:
            return
        self._remove_plain_append()
        try:
            for subscriber in list(self._subscribers):
                subscriber.close()
            if self.writer is not None:
                self.writer.close(lambda head: recovery.write_clean_shutdown(self, head))
        finally:
            self._closed = True
            self._remove_plain_append()  # (again: a thread may have reloaded meta)
            self._release_writers_lock()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called; appends, reads and the offset properties of a
        closed log raise :class:`~compactlog.errors.LogClosedError`."""
        return self._closed

    def __enter__(self) -> Log:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("read-only" if self.read_only else "open")
        return f"<compactlog.Log {self.directory!r} {state}>"


def _caller_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the first caller outside this module
    (``compactlog.open`` and ``Log`` reach the warning through different depths)."""
    frame = sys._getframe(1)
    level = 1
    while frame.f_back is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
        level += 1
    return level


def _check_offset(name: str, value: Any, path: str) -> int | None:
    """A ``start``/``end`` argument: an int offset or None (never a str or a bool)."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    if not isinstance(value, bool) and hasattr(type(value), "__index__"):
        return operator.index(value)  # a numpy integer
    raise InvalidArgumentError(
        f"{name} must be an int offset or None, not {type(value).__name__} {value!r}", path=path
    )


def open_log(
    path: str | os.PathLike[str],
    *,
    create: bool = True,
    read_only: bool = False,
    exclusive: bool = False,
    clock: Callable[[], int] | None = None,
    update_config: bool = False,
    wait: float | bool = False,
    **config: Any,
) -> Log:
    """Open the log at ``path`` (a directory), creating it if needed; close it with
    ``close()`` or use it in a ``with`` block. The user guide's section 3 says more.

    Arguments:

    - ``path``: the log's directory, a ``str`` or ``os.PathLike`` of ``str``. With
      ``create=True`` a missing or empty directory becomes a new log; a directory with
      entries but no ``meta`` file is refused (:class:`~compactlog.errors.NotALogError`).
    - ``create=False``: the log must exist.
    - ``read_only=True``: no writer, no recovery, no lock; appends raise
      :class:`~compactlog.errors.ReadOnlyLogError`.
    - ``exclusive=True``: this open is the log's only writer while it is open (its single
      appends make no system call); every other writable open, in any process, is refused
      with :class:`~compactlog.errors.LogLockedError` naming this process's pid.
    - ``clock``: a callable returning now in milliseconds (timestamps, rolls, retention).
    - ``update_config=True``: store the settings given, through the checks of
      ``compactlog config set`` (:class:`~compactlog.errors.UnsafeChangeError` if refused).
    - ``wait`` (with ``read_only=True`` or ``create=False``): wait up to that many seconds
      (``True``: for ever) for another process to create the log.
    - ``key_serializer``, ``value_serializer``, ``key_deserializer``,
      ``value_deserializer``, ``raw``: how keys and values convert for this open.
    - ``**config``: settings (``segment_bytes``, ``cleanup_policy``, ``retention_ms``,
      ``sync``, ... every field of :class:`~compactlog.config.LogConfig`). *Stored*
      settings apply when this open creates the log; on an existing log one that differs
      from the stored value is ignored with a
      :class:`~compactlog.errors.SettingIgnoredWarning`. *Per-process* settings (``sync``,
      ``sync_interval_ms``, ``linger_ms``, ``batch_records``) apply to this open.

    Raises :class:`~compactlog.errors.ConfigError` for an unknown setting or an impossible
    value (before anything is created), :class:`~compactlog.errors.InvalidArgumentError`
    for a ``path`` of the wrong type, :class:`~compactlog.errors.NotALogError`,
    :class:`~compactlog.errors.LogLockedError` (an exclusive writer holds the log, or this
    open is exclusive and another writer has it open),
    :class:`~compactlog.errors.CorruptLogError` for damage recovery cannot repair (run
    ``compactlog repair``). Every message about the log starts with its path.
    """
    return Log(
        path,
        create=create,
        read_only=read_only,
        exclusive=exclusive,
        clock=clock,
        update_config=update_config,
        wait=wait,
        **config,
    )


open_log.__name__ = open_log.__qualname__ = "open"  # what help(compactlog.open) shows
