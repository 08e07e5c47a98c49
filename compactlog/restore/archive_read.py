"""Reading an archive in object storage (``load("s3://bucket/prefix")``): no shared disk.

Planning (on the driver's planning worker) chooses the manifest (the newest, or by
``asOfOffset`` / ``asOfTimestamp``, as ``compactlog archive restore`` does), pins it for
``snapshotRetentionMinutes`` so that prune leaves its objects alone while the query runs
(``compactlog/archive/pins.py``), fetches the dirty section's segments to build the
latest-per-key map, and cuts partitions along the manifest's segments. Each task fetches
the segments its offsets need from the store itself, into a cache directory local to its
executor (``$TMPDIR/compactlog-archive-cache``), and reads them with the library's own
reader. Credentials come from each process's environment (``AWS_*``, ...): the plan
carries the URL and the manifest, never a secret.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from ..errors import ConfigError
from .ranges import PARTITION_BYTES, Partition

ARCHIVE_SCHEMES = ("s3", "s3a", "gs", "az", "abfs", "abfss", "memory")
CACHE_NAME = "compactlog-archive-cache"


def is_archive_url(path: str) -> bool:
    """An object-store URL (``file://`` too, when it holds an archive's manifests)."""
    parsed = urlparse(path)
    scheme = parsed.scheme.lower()
    if scheme in ARCHIVE_SCHEMES:
        return True
    return scheme == "file" and os.path.isdir(os.path.join(parsed.path, "manifests"))


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
    if options.as_of is not None and options.as_of_time_ms is not None:
        raise ConfigError("give asOfOffset or asOfTimestamp, not both")
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
    """A local directory holding every segment that ``[start, end)`` needs (fetched once
    per executor and manifest, checked, written whole before it appears under its name)."""
    from ..archive import local, open_store
    from ..archive.restore import fetch_object

    digest = hashlib.sha256(read.url.encode()).hexdigest()[:16]
    directory = os.path.join(tempfile.gettempdir(), CACHE_NAME, digest, str(read.sequence))
    os.makedirs(directory, exist_ok=True)
    store = None
    bases = [s.base for s in read.segments]
    for i, segment in enumerate(read.segments):
        next_base = bases[i + 1] if i + 1 < len(bases) else None
        if (next_base is not None and next_base <= start) or segment.base >= end:
            continue
        path = os.path.join(directory, local.segment_file_name(segment.base))
        if os.path.exists(path) and os.path.getsize(path) == segment.size:
            continue
        store = store or open_store(read.url)
        part = f"{path}.{os.getpid()}.part"
        with open(part, "wb") as handle:
            for ref in segment.objects:
                handle.seek(ref.start)
                handle.write(fetch_object(store, ref))
        os.replace(part, path)
    return directory


__all__ = ["ArchiveRead", "choose", "is_archive_url", "materialize", "partitions"]
