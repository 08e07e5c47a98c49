"""Every file name in a log directory, and the one parser of them.

Recovery, retention, the cleaner, the CLI and the Spark adapter all classify directory
entries with :func:`parse_filename` and build names with the constants and functions here;
nothing else in the project spells these names out.

======================  ===========================================================
``<20 digits>.log``     segment; the digits are the segment's base offset
``<20 digits>.idx``     sparse offset index of that segment (a rebuildable cache)
``<name>.rw``           a rewrite in progress: never trusted, removed on open
``meta``                format version, config, log start offset (atomic JSON)
``cp.<hex(name)>``      checkpoint of one durable subscriber
``cp.h.<sha256 hex>``   checkpoint of a subscriber whose hex name would exceed 255 bytes
``.cp.<...>.lock``      held (``flock``) by the one consumer of that durable subscriber
``cleaner.checkpoint``  the cleaner point (first dirty offset) and tombstone clock
``cleaner.swap``        intent of a segment swap in progress (``swap.py``)
``pre_commit``          JLog-style precommit buffer (mmap'ed)
``.lock``               writers' advisory lock, also holding the shared head state
``.cleaner.lock``       held by the one process cleaning the log
``clean_shutdown``      present only between a clean close and the next open
``<name>.<pid>.<n>.tmp`` a small-file write in progress: removed on open
``cleaner.spill.*.tmp`` a compaction pass's spill files (temporary names of ``SPILL``
                        and ``SPILL_BITS``; ``compaction/latest.py``): never trusted
``snapshot.json``       manifest of a snapshot (a read-only copy of a log; ``snapshot.py``)
``.archive-follow.json`` a replica's state: the archive it follows, the manifest it holds
``.archive-follow.lock`` held (``flock``) by a replica's follower while it applies a manifest
======================  ===========================================================
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass
from enum import Enum

OFFSET_DIGITS = 20
SEGMENT_SUFFIX = ".log"
INDEX_SUFFIX = ".idx"
REWRITE_SUFFIX = ".rw"
TEMP_SUFFIX = ".tmp"
META = "meta"
CLEANER_CHECKPOINT = "cleaner.checkpoint"
SWAP_INTENT = "cleaner.swap"
REPLICA_STATE = ".archive-follow.json"  # present only in a replica (archive/follow.py)
REPLICA_LOCK = ".archive-follow.lock"
SNAPSHOT_MANIFEST = "snapshot.json"
SPILL = "cleaner.spill"  # temp_name(SPILL): compaction/latest.py's spill files
SPILL_BITS = SPILL + ".bits"
PRECOMMIT = "pre_commit"
WRITER_LOCK = ".lock"
WRITERS_LOCK = ".writers.lock"  # shared by every writable open, exclusive for exclusive=True
CLEANER_LOCK = ".cleaner.lock"
CLEAN_SHUTDOWN = "clean_shutdown"
QUARANTINE_SUFFIX = ".quarantine"
CHECKPOINT_PREFIX = "cp."
HASHED_CHECKPOINT_PREFIX = "cp.h."
SUBSCRIBER_LOCK_PREFIX = ".cp."
LOCK_SUFFIX = ".lock"
MAX_FILENAME_BYTES = 255


class FileKind(Enum):
    SEGMENT = "segment"
    INDEX = "index"
    REWRITE = "rewrite"
    TEMP = "temp"
    META = "meta"
    CHECKPOINT = "checkpoint"
    CLEANER_CHECKPOINT = "cleaner_checkpoint"
    PRECOMMIT = "precommit"
    LOCK = "lock"
    CLEAN_SHUTDOWN = "clean_shutdown"
    QUARANTINE = "quarantine"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class ParsedName:
    kind: FileKind
    base_offset: int | None = None  # segments, indexes and their rewrites


_FIXED = {
    META: FileKind.META,
    CLEANER_CHECKPOINT: FileKind.CLEANER_CHECKPOINT,
    PRECOMMIT: FileKind.PRECOMMIT,
    WRITER_LOCK: FileKind.LOCK,
    WRITERS_LOCK: FileKind.LOCK,
    CLEANER_LOCK: FileKind.LOCK,
    CLEAN_SHUTDOWN: FileKind.CLEAN_SHUTDOWN,
}


def _offset_stem(stem: str) -> int | None:
    if len(stem) == OFFSET_DIGITS and stem.isdigit() and stem.isascii():
        return int(stem)
    return None


def parse_filename(name: str) -> ParsedName:
    """Classify one directory entry of a log."""
    if name in _FIXED:
        return ParsedName(_FIXED[name])
    if name.endswith(TEMP_SUFFIX):
        return ParsedName(FileKind.TEMP)
    if name.startswith(SUBSCRIBER_LOCK_PREFIX) and name.endswith(LOCK_SUFFIX):
        return ParsedName(FileKind.LOCK)
    if name.endswith(QUARANTINE_SUFFIX):
        return ParsedName(FileKind.QUARANTINE)
    if name.endswith(REWRITE_SUFFIX):
        return ParsedName(FileKind.REWRITE, _offset_stem(name.split(".", 1)[0]))
    if name.startswith(CHECKPOINT_PREFIX):
        return ParsedName(FileKind.CHECKPOINT)
    stem, dot, suffix = name.rpartition(".")
    if dot:
        base = _offset_stem(stem)
        if base is not None and "." + suffix == SEGMENT_SUFFIX:
            return ParsedName(FileKind.SEGMENT, base)
        if base is not None and "." + suffix == INDEX_SUFFIX:
            return ParsedName(FileKind.INDEX, base)
    return ParsedName(FileKind.UNKNOWN)


def offset_stem(base_offset: int) -> str:
    return str(base_offset).zfill(OFFSET_DIGITS)


def segment_name(base_offset: int) -> str:
    return offset_stem(base_offset) + SEGMENT_SUFFIX


def index_name(base_offset: int) -> str:
    return offset_stem(base_offset) + INDEX_SUFFIX


def rewrite_name(name: str) -> str:
    """The ``.rw`` twin of a segment or index file name."""
    return name + REWRITE_SUFFIX


def quarantine_name(name: str, position: int) -> str:
    return f"{name}.{position}{QUARANTINE_SUFFIX}"


def checkpoint_name(subscriber: str) -> str:
    """``cp.<hex of the UTF-8 name>`` (JLog), or ``cp.h.<sha256>`` when that is too long.

    Hex never contains a dot, so the two forms cannot collide.
    """
    encoded = subscriber.encode("utf-8")
    name = CHECKPOINT_PREFIX + encoded.hex()
    if len(name) <= MAX_FILENAME_BYTES:
        return name
    return HASHED_CHECKPOINT_PREFIX + _digest(encoded)


def subscriber_lock_name(subscriber: str) -> str:
    """``.cp.<hex of the UTF-8 name>.lock``, or ``.cp.h.<sha256>.lock`` when that is too long.

    Hidden (a leading dot) and never starting with ``cp.``, so it is not taken for a
    checkpoint; the same name always maps to the same file in every process.
    """
    name = f".{checkpoint_name(subscriber)}{LOCK_SUFFIX}"
    if len(name) <= MAX_FILENAME_BYTES:
        return name
    return f".{HASHED_CHECKPOINT_PREFIX}{_digest(subscriber.encode('utf-8'))}{LOCK_SUFFIX}"


_temp_counter = itertools.count()


def temp_owner_pid(name: str) -> int | None:
    """The pid that :func:`temp_name` put into a temporary file's name, ``None`` for a name
    not of that shape (an older version's, or a foreign file)."""
    if not name.endswith(TEMP_SUFFIX):
        return None
    parts = name[: -len(TEMP_SUFFIX)].rsplit(".", 2)
    if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
        return None
    return int(parts[1])


def temp_name(name: str) -> str:
    """A temporary name for replacing ``name``, unique to this process and call, so two
    processes replacing the same file never write into each other's temporary file.

    A name that would grow past 255 bytes is replaced by a digest; the suffix still marks
    the file as temporary."""
    token = f".{os.getpid()}.{next(_temp_counter)}{TEMP_SUFFIX}"
    if len((name + token).encode("utf-8")) > MAX_FILENAME_BYTES:
        name = _digest(name.encode("utf-8"))[:32]
    return name + token


def _digest(data: bytes) -> str:
    """The SHA-256 hex digest that stands in for a name too long for the file system
    (``hashlib`` is imported here: the CLI imports this module and starts fast)."""
    import hashlib

    return hashlib.sha256(data).hexdigest()
