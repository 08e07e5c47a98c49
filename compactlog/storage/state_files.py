"""Small state files: ``meta``, subscriber checkpoints, the cleaner checkpoint.

Each is a short JSON document replaced atomically (temp, fsync, rename, fsync directory), so
a crash leaves the old or the new version, never a mix. Only this module reads or writes them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..config import LogConfig
from ..encoding.format import FORMAT_VERSION
from ..errors import CorruptLogError, NotALogError
from . import filenames
from .fsio import FileSystem

META_MAGIC = "compactlog"
LOG_ID = "log_id"  # meta's field naming the log (see log_identity.py)


@dataclass
class Meta:
    """Contents of ``meta``: JLog's metastore plus Kafka's log start offset."""

    config: LogConfig
    log_start_offset: int = 0
    uncleanable: str | None = None
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)
    # the log's identity (``log_identity.py``); ``None`` in a log made before it existed
    log_id: str | None = None

    def to_json(self) -> bytes:
        document = {
            "magic": META_MAGIC,
            "format_version": self.format_version,
            "log_start_offset": self.log_start_offset,
            "uncleanable": self.uncleanable,
            "config": self.config.to_dict(),
            **self.extra,
        }
        if self.log_id is not None:
            document[LOG_ID] = self.log_id
        return json.dumps(document, indent=1, sort_keys=True).encode() + b"\n"


def _load_json(path: str, hint: str = "") -> dict[str, Any]:
    """The JSON object in ``path``; ``hint`` ends the error's message (what repairs it)."""
    with open(path, "rb") as handle:
        data = handle.read()
    try:
        document = json.loads(data)
    except ValueError as error:
        raise CorruptLogError(f"not valid JSON ({error}){hint}", path=path, position=0) from None
    if not isinstance(document, dict):
        raise CorruptLogError(f"expected a JSON object{hint}", path=path, position=0)
    return document


def missing_meta_hint(directory: str) -> str:
    """What to do about a directory of segments without ``meta`` ("" when it has none)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return ""
    if not any(filenames.parse_filename(n).kind is filenames.FileKind.SEGMENT for n in names):
        return ""
    return (
        f"; it holds segments: if it is a log whose meta was lost, "
        f"`compactlog repair {directory} --rebuild-meta` rebuilds it"
    )


def _rebuild_hint(directory: str) -> str:
    return f"; `compactlog repair {directory} --rebuild-meta` rebuilds it"


def read_meta(directory: str) -> Meta:
    path = os.path.join(directory, filenames.META)
    if not os.path.exists(path):
        raise NotALogError(
            f"not a compactlog log (no meta file){missing_meta_hint(directory)}", path=directory
        )
    document = _load_json(path, hint=_rebuild_hint(directory))
    if document.get("magic") != META_MAGIC:
        raise NotALogError(f"meta file is not compactlog's{_rebuild_hint(directory)}", path=path)
    version = document.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise NotALogError(
            f"format version {version!r} is newer than this compactlog supports ({FORMAT_VERSION})",
            path=path,
        )
    known = {"magic", "format_version", "log_start_offset", "uncleanable", "config", LOG_ID}
    stored = document.get("config", {})
    defaults = LogConfig().to_dict()
    config = LogConfig.from_mapping({k: v for k, v in stored.items() if k in defaults})
    return Meta(
        config=config,
        log_start_offset=int(document.get("log_start_offset", 0)),
        uncleanable=document.get("uncleanable"),
        format_version=version,
        extra={k: v for k, v in document.items() if k not in known},
        log_id=_log_id(document.get(LOG_ID), path),
    )


def _log_id(value: object, path: str) -> str | None:
    if value is None or (isinstance(value, str) and value):
        return value
    raise CorruptLogError(f"meta's {LOG_ID} is not a non-empty string", path=path, position=0)


def write_meta(fs: FileSystem, directory: str, meta: Meta) -> None:
    fs.write_atomic(directory, filenames.META, meta.to_json())


def add_log_id(fs: FileSystem, directory: str, log_id: str) -> str:
    """Give a log made before log ids existed the id ``log_id``; the id it has if it has one.
    The caller holds the writers' lock (``.lock``), as for every change of ``meta``.

    Only the ``log_id`` field is added: the document is otherwise written back as it was
    read, key for key, so no stored setting changes (a round trip through :class:`Meta`
    would store defaults the log never stored). Crash protocol: one
    ``FileSystem.write_atomic`` (temp, fsync, rename, fsync the directory): a death leaves
    the old ``meta`` (no id: the next writer adds one) or the new one."""
    path = os.path.join(directory, filenames.META)
    read_meta(directory)  # (checks it is a meta this version reads)
    document = _load_json(path)
    present = _log_id(document.get(LOG_ID), path)
    if present is not None:
        return present
    document[LOG_ID] = log_id
    fs.write_atomic(
        directory, filenames.META, json.dumps(document, indent=1, sort_keys=True).encode() + b"\n"
    )
    return log_id


# -- subscriber checkpoints --------------------------------------------------------------


def write_checkpoint(fs: FileSystem, directory: str, subscriber: str, offset: int) -> None:
    document = {"subscriber": subscriber, "offset": offset}
    fs.write_atomic(directory, filenames.checkpoint_name(subscriber), json.dumps(document).encode())


def read_checkpoint_file(directory: str, name: str) -> tuple[str, int]:
    hint = (
        f"; `compactlog repair {directory}` moves it aside and restarts the subscriber at the "
        "log start"
    )
    document = _load_json(os.path.join(directory, name), hint)
    subscriber = document.get("subscriber")
    offset = document.get("offset")
    if not isinstance(subscriber, str) or not isinstance(offset, int) or offset < 0:
        raise CorruptLogError(
            f"checkpoint lacks a subscriber name or offset{hint}",
            path=os.path.join(directory, name),
            position=0,
        )
    return subscriber, offset


def list_checkpoints(directory: str) -> dict[str, int]:
    """Every durable subscriber and its committed offset."""
    result: dict[str, int] = {}
    for name in sorted(os.listdir(directory)):
        if filenames.parse_filename(name).kind is filenames.FileKind.CHECKPOINT:
            subscriber, offset = read_checkpoint_file(directory, name)
            result[subscriber] = offset
    return result


def readable_checkpoints(directory: str) -> dict[str, int]:
    """:func:`list_checkpoints` without the ones that cannot be read (``verify`` and
    ``repair`` report those on their own)."""
    result: dict[str, int] = {}
    for name in sorted(os.listdir(directory)):
        if filenames.parse_filename(name).kind is filenames.FileKind.CHECKPOINT:
            try:
                subscriber, offset = read_checkpoint_file(directory, name)
            except CorruptLogError:
                continue
            result[subscriber] = offset
    return result


# -- cleaner checkpoint ------------------------------------------------------------------


@dataclass
class CleanerState:
    """Kafka's cleaner point plus what tombstone expiry needs.

    ``first_dirty_offset``: everything below is clean. ``tombstone_marks`` holds
    ``[offset_end, first_seen_ms]`` pairs: the cleaner first passed every tombstone below
    ``offset_end`` no later than ``first_seen_ms``. ``tombstone_horizon``: every tombstone
    the cleaner ever removed (``delete_retention_ms`` passed) had an offset below it; it is
    raised before the swap that removes one (``compaction/cleaner.py``, step 4), so a reader
    that resumes from an offset at or past it has missed no delete. ``None``: not known (a
    ``cleaner.checkpoint`` written by a compactlog from before the field): see
    :meth:`horizon`.
    """

    first_dirty_offset: int = 0
    tombstone_marks: list[list[int]] = field(default_factory=list)
    tombstone_horizon: int | None = 0

    def horizon(self) -> int:
        """``tombstone_horizon``, or when it is not known the cleaner point: a pass removes
        only tombstones below the cleaner point it starts from, which never goes back."""
        if self.tombstone_horizon is None:
            return self.first_dirty_offset
        return self.tombstone_horizon

    def to_json(self) -> bytes:
        document: dict[str, Any] = {
            "first_dirty_offset": self.first_dirty_offset,
            "tombstone_marks": self.tombstone_marks,
        }
        if self.tombstone_horizon is not None:
            document["tombstone_horizon"] = self.tombstone_horizon
        return json.dumps(document).encode()


def read_cleaner_state(directory: str) -> CleanerState:
    path = os.path.join(directory, filenames.CLEANER_CHECKPOINT)
    if not os.path.exists(path):
        return CleanerState()
    document = _load_json(
        path, f"; `compactlog repair {directory}` moves it aside (the cleaner starts over)"
    )
    horizon = document.get("tombstone_horizon")
    return CleanerState(
        first_dirty_offset=int(document.get("first_dirty_offset", 0)),
        tombstone_marks=[list(map(int, m)) for m in document.get("tombstone_marks", [])],
        tombstone_horizon=None if horizon is None else int(horizon),
    )


def write_cleaner_state(fs: FileSystem, directory: str, state: CleanerState) -> None:
    fs.write_atomic(directory, filenames.CLEANER_CHECKPOINT, state.to_json())


def replica_of(directory: str) -> dict[str, Any] | None:
    """The state of the replica ``directory`` is (``url``: the archive it follows,
    ``sequence``: the manifest it holds), or ``None`` when it is no replica. A replica is
    kept by ``compactlog archive follow`` alone: no writer, no repair (docs/archive.md)."""
    try:
        with open(os.path.join(directory, filenames.REPLICA_STATE), "rb") as handle:
            document = json.loads(handle.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"url": None, "sequence": None}
    return document if isinstance(document, dict) else {"url": None, "sequence": None}


REPLICA_ADVICE = (
    "a replica is repaired by its archive, not by `compactlog repair`: stop `compactlog "
    "archive follow`, remove the directory and follow again (or `compactlog archive "
    "restore` it)"
)


@contextmanager
def replica_lock(directory: str) -> Iterator[None]:
    """The replica's ``flock`` (``.archive-follow.lock``), exclusive: the follower holds it
    while it applies a manifest, so that no reader holding :func:`replica_quiet` sees a
    half-applied one (a merged rewrite beside the segment it replaces, cleaned rewrites
    under a cleaner point not written yet)."""
    from .lockfile import lock, release

    fd = lock(os.path.join(directory, filenames.REPLICA_LOCK), wait=True, note="archive follow")
    try:
        yield
    finally:
        release(fd)


@contextmanager
def replica_quiet(directory: str) -> Iterator[None]:
    """While held, the follower of the replica ``directory`` applies no manifest (the
    replica lock, shared): a reader that needs one consistent state of the files (a
    table's restore, ``verify``) holds it. Nothing on a log that is no replica, or when
    this process cannot take the lock (a read-only mount): it then reads as without."""
    from .lockfile import lock, release

    fd = -1
    if replica_of(directory) is not None:
        try:
            fd = lock(os.path.join(directory, filenames.REPLICA_LOCK), wait=True, shared=True)
        except OSError:
            fd = -1
    try:
        yield
    finally:
        if fd >= 0:
            release(fd)
