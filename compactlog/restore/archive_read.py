"""Reading an archive in object storage (``load("s3://bucket/prefix")``): no shared disk.

Planning (on the driver's planning worker) chooses the manifest (the newest, or by
``asOfOffset`` / ``asOfTimestamp``, as ``compactlog archive restore`` does), pins it for
``snapshotRetentionMinutes`` so that prune leaves its objects alone while the query runs
(``compactlog/archive/pins.py``), fetches the dirty section's segments to build the
latest-per-key map, and cuts partitions along the manifest's segments. Each task fetches
the segments its offsets need from the store itself, into a cache directory local to its
executor (``$TMPDIR/compactlog-archive-cache``, bounded: ``archive_cache.py``), and reads
them with the library's own reader. Credentials come from each process's environment
(``AWS_*``, ...): the plan carries the URL and the manifest, never a secret.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from ..archive.store import SCHEMES
from ..errors import ConfigError
from .ranges import PARTITION_BYTES, Partition

CACHE_NAME = "compactlog-archive-cache"
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def is_archive_url(path: str) -> bool:
    """``True`` for an archive URL (``s3://bucket/prefix``, ..., ``file://`` when it holds an
    archive's manifests), ``False`` for a plain path (a log, a snapshot, a directory of logs).

    A URL that names no archive is refused here, naming the schemes, rather than read as a
    path that does not exist: an unknown scheme (``ftp://``), or a ``file://`` URL with no
    ``manifests/`` in it (a log directory is given as a plain path)."""
    if not _URL.match(path):
        return False
    parsed = urlparse(path)
    scheme = parsed.scheme.lower()
    if scheme not in SCHEMES:
        raise ConfigError(
            f"{path}: unsupported URL scheme {scheme!r}; an archive URL is one of "
            f"{', '.join(s + '://' for s in SCHEMES)} (docs/archive.md), a log a plain path"
        )
    if scheme == "file" and not os.path.isdir(os.path.join(parsed.path, "manifests")):
        raise ConfigError(
            f"{path}: no archive there (no manifests/ directory); a log directory is given "
            "as a plain path, not a file:// URL"
        )
    return True


def declared_value_format(url: str) -> str | None:
    """The ``value_format`` the archived log declares (its newest manifest's ``meta``), or
    ``None`` for an empty archive (reading it fails later, naming that)."""
    from ..archive import manifest as manifests
    from ..archive import open_store

    newest = manifests.latest(open_store(url))
    return None if newest is None else config_value_format(newest.meta)


def config_value_format(meta: dict[str, Any]) -> str | None:
    """``value_format`` from a log's ``meta`` document (as a manifest carries it)."""
    config = meta.get("config") if isinstance(meta, dict) else None
    value = config.get("value_format") if isinstance(config, dict) else None
    return value if isinstance(value, str) else None


@dataclass(frozen=True, slots=True)
class ArchiveSegment:
    base: int
    size: int
    crc32c: int
    objects: tuple[Any, ...]  # manifest.ObjectRef


@dataclass(frozen=True, slots=True)
class ArchiveRead:
    """What every task needs to fetch its segments: picklable, no credentials."""

    url: str
    sequence: int
    segments: tuple[ArchiveSegment, ...]
    meta: dict[str, Any]


def choose(options: Any) -> tuple[ArchiveRead, Any]:
    """The manifest to read, pinned; ``(ArchiveRead, manifest)``."""
    from ..archive import manifest as manifests
    from ..archive import open_store
    from ..archive.pins import Pin

    store = open_store(options.path)
    given = [options.as_of, options.as_of_time_ms, options.archive_sequence]
    if sum(value is not None for value in given) > 1:
        raise ConfigError("give one of asOfOffset, asOfTimestamp and archiveSequence")
    if options.archive_sequence is not None:
        chosen = manifests.load_existing(store, options.archive_sequence)
    else:
        chosen = manifests.choose(
            store, as_of_offset=options.as_of, as_of_time_ms=options.as_of_time_ms
        )
    pin = Pin(store, chosen.sequence, ttl_ms=options.snapshot_retention_minutes * 60_000)
    pin.detach()  # lasts its time to live: the query's tasks run after planning returns
    chosen = manifests.load(store, chosen.sequence)  # still there after the pin: safe
    read = ArchiveRead(
        options.path,
        chosen.sequence,
        tuple(ArchiveSegment(s.base, s.size, s.crc32c, s.objects) for s in chosen.segments),
        chosen.meta,
    )
    return read, chosen


def partitions(read: ArchiveRead, start: int, end: int, wanted: int | None) -> list[Partition]:
    """Offset ranges along the manifest's segments, about ``PARTITION_BYTES`` each (or
    ``wanted`` of them)."""
    segments = [s for s in read.segments if s.size > 16]
    bounds = [s.base for s in segments] + [end]
    total = sum(s.size for s in segments) or 1
    target = total / wanted if wanted else PARTITION_BYTES
    result: list[Partition] = []
    group_start, group_bytes = start, 0.0
    for i, segment in enumerate(segments):
        group_bytes += segment.size
        last = i == len(segments) - 1
        if group_bytes >= target or last:
            stop = min(max(bounds[i + 1], start), end)
            if stop > group_start:
                result.append(Partition(len(result), group_start, stop))
                group_start = stop
            group_bytes = 0.0
    if group_start < end:
        result.append(Partition(len(result), group_start, end))
    return result or [Partition(0, start, end)]


def materialize(read: ArchiveRead, start: int, end: int) -> str:
    """A local directory holding every segment that ``[start, end)`` needs: links into the
    executor's bounded cache (``archive_cache.py``), where each segment is fetched once,
    checked, and written whole before it appears under its name, and shared by every
    manifest that names it unchanged."""
    from ..archive import local, open_store
    from ..archive.restore import fetch_object
    from . import archive_cache

    cache_root = os.path.join(tempfile.gettempdir(), CACHE_NAME)
    archive_root = os.path.join(cache_root, hashlib.sha256(read.url.encode()).hexdigest()[:16])
    directory = os.path.join(archive_root, str(read.sequence))
    os.makedirs(directory, exist_ok=True)
    archive_cache.touch(directory)
    store = None
    bases = [s.base for s in read.segments]
    for i, segment in enumerate(read.segments):
        next_base = bases[i + 1] if i + 1 < len(bases) else None
        if (next_base is not None and next_base <= start) or segment.base >= end:
            continue

        def fill(part: str, segment: ArchiveSegment = segment) -> None:
            nonlocal store
            store = store or open_store(read.url)
            with open(part, "wb") as handle:
                for ref in segment.objects:
                    handle.seek(ref.start)
                    handle.write(fetch_object(store, ref))

        archive_cache.link_segment(
            archive_root,
            directory,
            local.segment_file_name(segment.base),
            archive_cache.shared_name(segment.base, segment.size, segment.crc32c),
            fill,
        )
    archive_cache.evict(cache_root, keep=directory)
    return directory


__all__ = [
    "ArchiveRead",
    "choose",
    "config_value_format",
    "declared_value_format",
    "is_archive_url",
    "materialize",
    "partitions",
]
