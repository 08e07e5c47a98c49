"""Small state files: ``meta``, subscriber checkpoints, the cleaner checkpoint.

Each is a short JSON document replaced atomically (temp, fsync, rename, fsync directory), so
a crash leaves the old or the new version, never a mix. Only this module reads or writes them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from ..config import LogConfig
from ..encoding.format import FORMAT_VERSION
from ..errors import CorruptLogError, NotALogError
from . import filenames
from .fsio import FileSystem

META_MAGIC = "compactlog"


@dataclass
class Meta:
    """Contents of ``meta``: JLog's metastore plus Kafka's log start offset."""

    config: LogConfig
    log_start_offset: int = 0
    uncleanable: str | None = None
    format_version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        document = {
            "magic": META_MAGIC,
            "format_version": self.format_version,
            "log_start_offset": self.log_start_offset,
            "uncleanable": self.uncleanable,
            "config": self.config.to_dict(),
            **self.extra,
        }
        return json.dumps(document, indent=1, sort_keys=True).encode() + b"\n"


def _load_json(path: str) -> dict[str, Any]:
    with open(path, "rb") as handle:
        data = handle.read()
    try:
        document = json.loads(data)
    except ValueError as error:
        raise CorruptLogError(f"not valid JSON ({error})", path=path, position=0) from None
    if not isinstance(document, dict):
        raise CorruptLogError("expected a JSON object", path=path, position=0)
    return document


def read_meta(directory: str) -> Meta:
    path = os.path.join(directory, filenames.META)
    if not os.path.exists(path):
        raise NotALogError("not a compactlog log (no meta file)", path=directory)
    document = _load_json(path)
    if document.get("magic") != META_MAGIC:
        raise NotALogError("meta file is not compactlog's", path=path)
    version = document.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise NotALogError(
            f"format version {version!r} is newer than this compactlog supports ({FORMAT_VERSION})",
            path=path,
        )
    known = {"magic", "format_version", "log_start_offset", "uncleanable", "config"}
    stored = document.get("config", {})
    defaults = LogConfig().to_dict()
    config = LogConfig.from_mapping({k: v for k, v in stored.items() if k in defaults})
    return Meta(
        config=config,
        log_start_offset=int(document.get("log_start_offset", 0)),
        uncleanable=document.get("uncleanable"),
        format_version=version,
        extra={k: v for k, v in document.items() if k not in known},
    )


def write_meta(fs: FileSystem, directory: str, meta: Meta) -> None:
    fs.write_atomic(directory, filenames.META, meta.to_json())


# -- subscriber checkpoints --------------------------------------------------------------


def write_checkpoint(fs: FileSystem, directory: str, subscriber: str, offset: int) -> None:
    document = {"subscriber": subscriber, "offset": offset}
    fs.write_atomic(directory, filenames.checkpoint_name(subscriber), json.dumps(document).encode())


def read_checkpoint_file(directory: str, name: str) -> tuple[str, int]:
    document = _load_json(os.path.join(directory, name))
    subscriber = document.get("subscriber")
    offset = document.get("offset")
    if not isinstance(subscriber, str) or not isinstance(offset, int) or offset < 0:
        raise CorruptLogError(
            "checkpoint lacks a subscriber name or offset",
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


# -- cleaner checkpoint ------------------------------------------------------------------


@dataclass
class CleanerState:
    """Kafka's cleaner point plus what tombstone expiry needs.

    ``first_dirty_offset``: everything below is clean. ``tombstone_marks`` holds
    ``[offset_end, first_seen_ms]`` pairs: the cleaner first passed every tombstone below
    ``offset_end`` no later than ``first_seen_ms``.
    """

    first_dirty_offset: int = 0
    tombstone_marks: list[list[int]] = field(default_factory=list)

    def to_json(self) -> bytes:
        return json.dumps(
            {"first_dirty_offset": self.first_dirty_offset, "tombstone_marks": self.tombstone_marks}
        ).encode()


def read_cleaner_state(directory: str) -> CleanerState:
    path = os.path.join(directory, filenames.CLEANER_CHECKPOINT)
    if not os.path.exists(path):
        return CleanerState()
    document = _load_json(path)
    return CleanerState(
        first_dirty_offset=int(document.get("first_dirty_offset", 0)),
        tombstone_marks=[list(map(int, m)) for m in document.get("tombstone_marks", [])],
    )


def write_cleaner_state(fs: FileSystem, directory: str, state: CleanerState) -> None:
    fs.write_atomic(directory, filenames.CLEANER_CHECKPOINT, state.to_json())
