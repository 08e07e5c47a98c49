"""The library's exception tree.

Every error the library raises on purpose is a :class:`CompactLogError`. Subclasses carry the
path (and, for corruption, the byte position) so that an operator can act on the message
alone. ``OSError`` is converted at the public boundary only; inside, it propagates.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable


def closest(name: str, known: Iterable[str]) -> str | None:
    """The name of ``known`` that ``name`` most likely misspells (case-insensitive)."""
    choices = {k.lower(): k for k in known}
    close = difflib.get_close_matches(name.lower(), list(choices), n=1, cutoff=0.6)
    return choices[close[0]] if close else None


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """``"; did you mean segment_bytes?"`` for a misspelled ``name``, else ``""``: the one
    suggestion of every "unknown setting/option/key" message."""
    match = closest(name, known)
    return f"; did you mean {match}?" if match else ""


class CompactLogError(Exception):
    """Base of every error compactlog raises on purpose."""

    def __init__(self, message: str, *, path: str | os.PathLike[str] | None = None) -> None:
        self.path = os.fspath(path) if path is not None else None
        super().__init__(f"{self.path}: {message}" if self.path else message)


class ConfigError(CompactLogError, ValueError):
    """An unknown configuration name or an impossible value."""


class UnsafeChangeError(ConfigError):
    """A change to a log's stored settings that could lose or strand data, or that a live
    writer would not see (``config.check_change`` says which and why)."""


class InexactReadError(ConfigError):
    """A state asked for as of an offset below the cleaner point: compaction may have
    removed records of that state (``Log.latest(as_of=)``, Spark's ``asOfOffset``)."""


class InvalidArgumentError(CompactLogError, TypeError):
    """An argument of the wrong type (``read(start="0")``); the message names the argument."""


class InvalidRecordError(InvalidArgumentError):
    """A record of the wrong type or shape (str key, int value, None key when compacting)."""


class DecodeError(CompactLogError, ValueError):
    """A stored key or value that its format (declared or given at open) cannot decode.

    ``offset`` is the record's offset, ``part`` ``"key"`` or ``"value"``, ``format`` the
    format's name (``"custom"`` for a callable). ``raw=True`` reads the bytes anyway.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | os.PathLike[str] | None,
        offset: int,
        part: str,
        format: str,
    ) -> None:
        self.offset = offset
        self.part = part
        self.format = format
        super().__init__(message, path=path)


class RecordTooLargeError(CompactLogError, ValueError):
    """A record larger than ``max_record_bytes``."""


class NotALogError(CompactLogError):
    """The directory (or a file in it) is not a compactlog log, or is of a newer format."""


class CorruptLogError(CompactLogError):
    """Bytes that fail validation somewhere other than a torn tail.

    ``position`` is the byte offset in ``path`` where the bad data starts.
    """

    def __init__(self, message: str, *, path: str | os.PathLike[str], position: int) -> None:
        self.position = position
        super().__init__(f"at byte {position}: {message}", path=path)


class MissingSegmentError(CorruptLogError):
    """A segment file that the log needs is gone (offsets would have a hole)."""


class LogCheckError(CorruptLogError):
    """``Log.check()`` / ``invariants.check()`` found invariants violated: ``problems`` lists
    them (each names its file and position, ``compactlog verify``'s problems); the error's
    own path and position are the first one's."""

    def __init__(self, directory: str, lines: list[str], problems: list[object]) -> None:
        self.problems = problems
        first = problems[0] if problems else None
        where = getattr(first, "file", "") or ""
        super().__init__(
            f"{len(lines)} invariant(s) violated:\n  " + "\n  ".join(lines),
            path=os.path.join(directory, where) if where else directory,
            position=getattr(first, "position", None) or 0,
        )


class LogClosedError(CompactLogError):
    """An operation on a closed log or subscriber."""


class ReadOnlyLogError(CompactLogError):
    """A write on a log opened with ``read_only=True``."""


class LogLockedError(CompactLogError):
    """A lock that another process holds (a second cleaner, an exclusive operation)."""


class WriteRefusedError(CompactLogError):
    """Self-protection: appends refused because the disk is (nearly) full or a write failed.

    The log stays readable and nothing stored is damaged; appends resume once the cause is
    gone (free space back above ``min_free_bytes``).
    """


class SubscriberError(CompactLogError, ValueError):
    """An invalid subscriber name or an unknown subscriber."""


class SubscriberBusyError(LogLockedError):
    """A durable subscriber name that another consumer holds (one consumer per name, as a
    Kafka partition has one consumer per group).

    ``pid`` is the holder's process id (``None`` if it could not be read); it may be this
    process, when another :class:`~compactlog.Subscriber` object (another thread) holds the
    name. The hold is an ``flock`` that dies with its process, so a crashed consumer never
    blocks its successor.
    """

    def __init__(
        self,
        message: str,
        *,
        subscriber: str,
        pid: int | None,
        path: str | os.PathLike[str] | None = None,
    ) -> None:
        self.subscriber = subscriber
        self.pid = pid
        super().__init__(message, path=path)


class CompactionError(CompactLogError):
    """A compaction pass stopped on an operating-system error (``errno`` says which).

    The pass rolled back first: no ``.rw`` rewrite is left and no swap is half done (or, if
    undoing one failed too, its intent file is left for the next pass or open to resolve).
    The log stays readable and writable, the cleaner point is where it was, and the log is
    not marked uncleanable (the cause is outside the log: a later pass succeeds once it is
    gone). ``stats`` is the failed pass's :class:`~compactlog.compaction.CleanerStats`.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | os.PathLike[str] | None,
        errno: int | None = None,
        operation: str = "",
    ) -> None:
        self.errno = errno
        self.operation = operation
        self.stats: object = None
        super().__init__(message, path=path)


class CompactionWriteError(CompactionError):
    """A compaction pass could not write (``EACCES``, ``EIO``, ``EROFS``...): on a ``.rw``
    rewrite, its fsync, the swap's intent, renames and removes, or the cleaner checkpoint."""


class DiskFullError(CompactionWriteError):
    """A compaction pass ran out of space (``ENOSPC``, ``EDQUOT``).

    ``needed_bytes``: the input bytes of the group being rewritten (its rewrite needs at
    most about that much beside the segments it replaces); ``written_bytes``: what the
    rewrite held when the write failed; ``free_bytes``: free space seen just after.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | os.PathLike[str] | None,
        errno: int | None = None,
        operation: str = "",
        needed_bytes: int = 0,
        written_bytes: int = 0,
        free_bytes: int | None = None,
    ) -> None:
        self.needed_bytes = needed_bytes
        self.written_bytes = written_bytes
        self.free_bytes = free_bytes
        super().__init__(message, path=path, errno=errno, operation=operation)


# -- open, snapshots, tables, Arrow ------------------------------------------------------


class SettingIgnoredWarning(UserWarning):
    """A stored setting given to ``open`` with another value than the log stores: the
    stored one stays (``update_config=True`` or ``compactlog config set`` changes it)."""


class SnapshotError(CompactLogError):
    """A snapshot could not be taken, or a directory is not a valid snapshot."""


class TableError(CompactLogError):
    """A change callback raised, or the follower stopped; ``__cause__`` is the error."""


class TableStateCorruptError(TableError):
    """A disk table's state directory (LMDB) is damaged: the error names it. The state is a
    cache of the log: the table rebuilds it when it opens (``table_disk.py``)."""


class ForeignTableStateError(TableError):
    """A disk table's state directory holds the state of another log (its log id differs),
    and the table was told to refuse rather than rebuild it (``foreign_state="error"``)."""


class TableFullError(CompactLogError, MemoryError):
    """The in-memory table would exceed ``max_bytes``."""


class ValueDecodeError(CompactLogError):
    """A value could not be decoded as the requested ``valueFormat``."""


# -- Spark -------------------------------------------------------------------------------


class DdlError(ConfigError):
    """A schema the Arrow engine cannot read (the message names the place)."""


class WriteRefusedByModeError(ConfigError):
    """``mode("overwrite")`` on a log: a log is append-only."""


class StagedFileError(CompactLogError):
    """A staged file that does not hold what its task reported (damaged or truncated):
    the commit refuses the job before appending anything."""


class SparkUnavailableError(CompactLogError):
    """Spark cannot start here (pyspark not installed, or no ``java``)."""


# -- the archive (compactlog/archive/, docs/archive.md) -----------------------------------
# Each names the object, the lease holder or the archive URL at fault, so that the CLI's one
# line is enough to act on.


class ArchiveError(CompactLogError):
    """Base of the archive's errors (``path`` is the archive URL or the object's key)."""


class StoreError(ArchiveError):
    """The object store failed a request even after its retries (network, 5xx, timeout,
    credentials): nothing was committed; the next round tries again."""


class ObjectMissingError(ArchiveError):
    """An object a manifest names is not in the store."""


class ObjectCorruptError(ArchiveError):
    """An object's bytes do not match the size and checksum its manifest records."""


class LeaseHeldError(ArchiveError):
    """Another archiver holds the archive's lease (the message names host, pid, since)."""


class LeaseLostError(ArchiveError):
    """This archiver's lease was taken over (it expired): it must stop committing."""


class NoManifestError(ArchiveError):
    """The archive holds no manifest (or none at or before the requested point)."""


class RestoreTargetError(ArchiveError):
    """A restore target that is not empty and not an earlier, interrupted restore of the
    same manifest."""


# -- internal signals: caught inside the library, never raised to a caller ------------------


class WriteFailed(Exception):
    """A write of a compaction pass failed (``compaction/failures.py``); ``error`` is the
    ``OSError``."""

    def __init__(self, operation: str, path: str | None, error: OSError) -> None:
        self.operation = operation
        self.path = path
        self.error = error
        self.needed_bytes = 0  # the group's input bytes, when a group was being written
        self.written_bytes = 0
        self.group = ""  # "segments A..B", when a group was being written
        self.rollback: list[str] = []
        super().__init__(f"{operation} {path}: {error}")


class LockHeld(Exception):
    """Another process holds a lock file (``storage/lockfile.py``); ``holder`` is its stamp
    (empty if none yet). Each caller turns it into its own error naming what is locked."""

    def __init__(self, path: str, holder: str) -> None:
        super().__init__(f"{path} is locked by {holder or 'another process'}")
        self.path = path
        self.holder = holder


class Aborted(Exception):
    """A compaction pass's ``should_abort`` returned true (``compaction/cleaner.py``)."""
