"""The local cache of archived segments that Spark's archive reads fetch into, bounded.

Layout, under ``$TMPDIR/compactlog-archive-cache/<sha256(url)[:16]>/``:

``segments/<base>-<size>-<crc32c>.log``
    one copy of each archived segment, named by its identity in the manifests (a segment
    unchanged between two manifests has the same base, size and CRC-32C), so successive
    manifests share it;
``<sequence>/<base>.log``
    the directory a read of manifest ``sequence`` opens: hard links to the shared copies.

Bounds (docs/spark.md "Reading an archive"): per archive, the ``KEEP_MANIFESTS`` most
recently read manifests' directories; over every archive, ``CACHE_BYTES`` of shared copies
(``COMPACTLOG_ARCHIVE_CACHE_BYTES`` overrides it). Eviction removes the least recently
read manifest directories first, then every shared copy no directory links to any more.
A directory read within ``GRACE_S`` is never evicted: a task of the same executor may be
about to open it (so the bound can be exceeded by the reads of the last ``GRACE_S``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable

KEEP_MANIFESTS = 4
CACHE_BYTES = 2 << 30
GRACE_S = 300.0
SHARED = "segments"


def cache_bytes() -> int:
    """The size bound over every archive's shared copies."""
    raw = os.environ.get("COMPACTLOG_ARCHIVE_CACHE_BYTES")
    return int(raw) if raw and raw.strip().isdigit() else CACHE_BYTES


def shared_name(base: int, size: int, crc: int) -> str:
    return f"{base:020d}-{size}-{crc:08x}.log"


def link_segment(
    archive_root: str, directory: str, name: str, shared: str, fill: Callable[[str], None]
) -> None:
    """Make ``directory/name`` a link to the shared copy ``shared`` of the segment, calling
    ``fill(path)`` to write that copy first when it is not in the cache (``fill`` writes it
    whole; it appears under its name only then)."""
    store = os.path.join(archive_root, SHARED)
    os.makedirs(store, exist_ok=True)
    source = os.path.join(store, shared)
    if not os.path.exists(source):
        part = f"{source}.{os.getpid()}.part"
        try:
            fill(part)
            os.replace(part, source)
        except BaseException:  # (a failed fetch: eviction never drops a ``.part``)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(part)
            raise
    target = os.path.join(directory, name)
    if os.path.exists(target) and os.path.samefile(source, target):
        return
    link = f"{target}.{os.getpid()}.link"
    try:
        os.link(source, link)
    except OSError:  # a file system without hard links: a copy
        shutil.copyfile(source, link)
    os.replace(link, target)


def touch(directory: str) -> None:
    """Mark a manifest's directory as read now (eviction goes least recently read first)."""
    os.utime(directory)


def evict(cache_root: str, *, keep: str, now: float | None = None) -> int:
    """Apply the bounds to the whole cache under ``cache_root``, never touching ``keep`` (the
    directory just materialized); the bytes of shared copies removed."""
    now = time.time() if now is None else now
    directories: list[tuple[float, str, str]] = []  # (last read, archive root, directory)
    for archive in _paths(cache_root):
        found = []
        for name in _names(archive):
            path = os.path.join(archive, name)
            if name != SHARED and os.path.isdir(path):
                found.append((_mtime(path), archive, path))
        found.sort(reverse=True)
        directories.extend(found[:KEEP_MANIFESTS])
        for _when, _archive, path in found[KEEP_MANIFESTS:]:
            _remove_if_idle(path, keep, now)
    freed = _drop_unlinked(cache_root, now)
    total = _shared_bytes(cache_root)
    limit = cache_bytes()
    for _when, _archive, path in sorted(directories):  # least recently read first
        if total <= limit:
            break
        if _remove_if_idle(path, keep, now):
            dropped = _drop_unlinked(cache_root, now)
            freed += dropped
            total -= dropped
    return freed


def _remove_if_idle(path: str, keep: str, now: float) -> bool:
    if os.path.abspath(path) == os.path.abspath(keep) or now - _mtime(path) < GRACE_S:
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True


def _drop_unlinked(cache_root: str, now: float) -> int:
    """Remove every shared copy no manifest directory links to; the bytes freed. A copy
    filled in the last ``GRACE_S`` stays: another process may be about to link it."""
    freed = 0
    for archive in _paths(cache_root):
        for name in _names(os.path.join(archive, SHARED)):
            path = os.path.join(archive, SHARED, name)
            try:
                info = os.stat(path)
            except FileNotFoundError:
                continue
            fresh = now - info.st_mtime < GRACE_S
            if info.st_nlink <= 1 and not fresh and not name.endswith(".part"):
                os.unlink(path)
                freed += info.st_size
    return freed


def _shared_bytes(cache_root: str) -> int:
    total = 0
    for archive in _paths(cache_root):
        for name in _names(os.path.join(archive, SHARED)):
            try:
                total += os.stat(os.path.join(archive, SHARED, name)).st_size
            except FileNotFoundError:
                continue
    return total


def _names(directory: str) -> list[str]:
    try:
        return sorted(os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _paths(directory: str) -> list[str]:
    return [os.path.join(directory, name) for name in _names(directory)]


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except FileNotFoundError:
        return 0.0


__all__ = ["cache_bytes", "evict", "link_segment", "shared_name", "touch"]
