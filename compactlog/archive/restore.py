"""Restore: a local log rebuilt from a manifest, fetched in parallel, resumable.

The restored log opens without repair, holds exactly the manifest's records, and its next
append takes the manifest's end offset. Its ``archive.id`` holds no log identity, only
the manifest it was restored from (its ``parent``), so archiving it again starts a new
generation of the archive (never a silent overwrite of the old one) that continues that
manifest's timeline.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from crc32c import crc32c

from ..errors import ArchiveError, ObjectCorruptError, RestoreTargetError
from . import local
from . import manifest as manifests
from .manifest import Manifest, ObjectRef, SegmentEntry
from .pins import Pin
from .store import Store

MARKER = ".archive-restore.json"  # in the target while a restore is unfinished
PART_SUFFIX = ".part"
FETCH_THREADS = 8


@dataclass(slots=True)
class RestoreResult:
    path: str
    sequence: int
    generation: int
    end_offset: int
    segments: int
    objects: int
    bytes: int
    reused_segments: int
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "sequence": self.sequence,
            "generation": self.generation,
            "end_offset": self.end_offset,
            "segments": self.segments,
            "objects": self.objects,
            "bytes": self.bytes,
            "reused_segments": self.reused_segments,
            "seconds": round(self.seconds, 3),
        }


def fetch_object(store: Store, ref: ObjectRef, *, deep: bool = False) -> bytes:
    """An object's bytes, checked against its manifest entry (size and CRC-32C; ``deep``:
    its SHA-256 too, as ``verify`` does): a missing or damaged object is an error naming
    it, never a short read."""
    data, _etag = store.get(ref.key)
    if len(data) != ref.size:
        raise ObjectCorruptError(
            f"object is {len(data)} bytes, its manifest says {ref.size}", path=ref.key
        )
    if crc32c(data) != ref.crc32c or (deep and hashlib.sha256(data).hexdigest() != ref.sha256):
        raise ObjectCorruptError("object's checksum does not match its manifest", path=ref.key)
    return data


def restore(
    store: Store,
    target: str,
    *,
    as_of_offset: int | None = None,
    as_of_time_ms: int | None = None,
    sequence: int | None = None,
    threads: int = FETCH_THREADS,
    progress: Callable[[int, int], None] | None = None,
) -> RestoreResult:
    """Rebuild the log at ``target`` from the newest manifest (or the one chosen by
    ``as_of_offset`` / ``as_of_time_ms``, see ``manifest.choose``, or manifest
    ``sequence`` itself).

    1. ``target`` must be missing or empty, or hold an interrupted restore (``MARKER``) of
       the same archive: then this one resumes it (segments already complete are kept).
    2. Choose the manifest, pin it (``pins.py``) and read it again: if prune removed it in
       between, choose again. The pin keeps its objects until the restore ends.
    3. Write ``MARKER`` (which archive, which manifest).
    4. Fetch every segment not already complete: its objects in parallel into
       ``<segment>.part``, each checked (size, CRC-32C) as it arrives; once a closed
       segment is whole, write its index from the bytes in hand (so that opening the log
       in step 7 does not read every segment again), fsync the segment in its fetch thread
       (its writeback overlaps the other fetches, as a careful downloader's would), then
       rename it to the segment's name. A death here leaves whole segments and ``.part``
       files; the next run keeps the former only if their size and CRC-32C still match
       the manifest (a power loss before the directory's fsync may have lost a rename) and
       fetches the rest.
    5. One fsync pass over what step 4 did not sync (the indexes, and segments kept from
       an interrupted run), in parallel, then the directory: from here on every byte
       ``meta`` will vouch for is durable.
    6. Write ``cleaner.checkpoint`` and then ``meta`` (each atomically): until ``meta``
       exists the directory is not a log, so nothing opens a half-restored one. Then
       ``archive.id`` naming the manifest restored as the log's ``parent`` (no ``log_id``:
       archived again, the log starts a new generation that continues this timeline). When the
       source had handed out offsets past the archived ones (``handed_out``: records
       acknowledged but not yet durable or archived, lost with that machine), leave a
       head in ``.lock`` naming them, so that they are never handed out again.
    7. Open the log once for writing (recovery finds the closed segments' indexes
       consistent, builds the newest one's and the head, and skips to ``handed_out``) and
       check its end offset; remove ``MARKER``.
    """
    started = time.perf_counter()
    target = os.path.abspath(target)
    # 1.
    resume = _check_target(target, store.url)
    os.makedirs(target, exist_ok=True)
    asked = as_of_offset is not None or as_of_time_ms is not None
    if resume is not None and asked and resume.get("as_of") != [as_of_offset, as_of_time_ms]:
        raise RestoreTargetError(
            f"holds an interrupted restore of manifest {resume['sequence']}; restore the "
            "same point or remove the directory",
            path=target,
        )
    # 2.
    if resume is not None and sequence is not None and resume["sequence"] != sequence:
        raise RestoreTargetError(
            f"holds an interrupted restore of manifest {resume['sequence']}; restore the "
            "same point or remove the directory",
            path=target,
        )
    pin, chosen = _pinned(store, resume, sequence, as_of_offset, as_of_time_ms)
    try:
        # 3.
        if resume is None:
            marker = {
                "url": store.url,
                "sequence": chosen.sequence,
                "as_of": [as_of_offset, as_of_time_ms],
            }
            local.write_small_file(target, MARKER, json.dumps(marker).encode())
        # 4.
        fetched, reused, synced = _fetch_segments(store, target, chosen, threads, progress)
        # 5.
        _fsync_all(target, chosen, threads, synced)
        # 6.
        if chosen.cleaner is not None:
            local.write_small_file(
                target, local.CLEANER_FILE, json.dumps(chosen.cleaner, sort_keys=True).encode()
            )
        local.write_small_file(
            target, local.META_FILE, json.dumps(chosen.meta, indent=1, sort_keys=True).encode()
        )
        if chosen.handed_out > chosen.end_offset and chosen.segments:
            last = chosen.segments[-1]
            local.write_offset_floor(target, last.base, last.size, chosen.handed_out)
        parent = {
            "url": store.url,
            "sequence": chosen.sequence,
            "generation": chosen.generation,
            "log_id": chosen.log_id,
            "end_offset": chosen.end_offset,
        }
        local.write_parent(target, parent)
        # 7.
        _open_once(target, chosen)
        os.unlink(os.path.join(target, MARKER))
        local.fsync_directory(target)
    finally:
        pin.release()
    return RestoreResult(
        target,
        chosen.sequence,
        chosen.generation,
        chosen.end_offset,
        len(chosen.segments),
        sum(len(s.objects) for s in chosen.segments),
        fetched,
        reused,
        time.perf_counter() - started,
    )


@contextmanager
def pinned_manifest(store: Store, *, as_of_offset: int | None = None) -> Iterator[Manifest]:
    """The manifest a restore would read (the newest, or the newest ending at or before
    ``as_of_offset``), pinned (``pins.py``) until the block ends: prune leaves it alone, so
    a restore of its ``sequence`` started inside the block finds it."""
    pin, chosen = _pinned(store, None, None, as_of_offset, None)
    try:
        yield chosen
    finally:
        pin.release()


def _check_target(target: str, url: str) -> dict[str, Any] | None:
    if not os.path.exists(target):
        return None
    if not os.path.isdir(target):
        raise RestoreTargetError("is not a directory", path=target)
    entries = os.listdir(target)
    if not entries:
        return None
    if MARKER not in entries:
        raise RestoreTargetError("is not empty; restore into a new or empty directory", path=target)
    with open(os.path.join(target, MARKER), "rb") as handle:
        marker = json.loads(handle.read())
    if marker.get("url") != url:
        raise RestoreTargetError(
            f"holds an interrupted restore of another archive ({marker.get('url')})",
            path=target,
        )
    return marker


def _pinned(
    store: Store,
    resume: dict[str, Any] | None,
    wanted: int | None,
    as_of_offset: int | None,
    as_of_time_ms: int | None,
) -> tuple[Pin, Manifest]:
    fixed = resume is None and wanted is not None  # (a manifest asked for by number)
    for _attempt in range(5):
        if resume is not None:
            sequence = int(resume["sequence"])
        elif wanted is not None:
            sequence = wanted
        else:
            sequence = manifests.choose(
                store, as_of_offset=as_of_offset, as_of_time_ms=as_of_time_ms
            ).sequence
        pin = Pin(store, sequence)
        try:
            return pin, (manifests.load_existing if fixed else manifests.load)(store, sequence)
        except ArchiveError:
            pin.release()
            if fixed:
                raise  # NoManifestError naming it, or what else went wrong: never another
            if resume is not None:
                raise RestoreTargetError(
                    f"the manifest being restored ({sequence}) is no longer in the archive; "
                    "remove the directory and restore again",
                    path=store.url,
                ) from None
    raise ArchiveError("manifests keep being pruned under the restore", path=store.url)


def _fetch_segments(
    store: Store,
    target: str,
    chosen: Manifest,
    threads: int,
    progress: Callable[[int, int], None] | None,
) -> tuple[int, int, set[str]]:
    """Step 4: returns the bytes fetched, the segments kept from an interrupted run, and
    the names of the segments fsynced here."""
    todo: list[SegmentEntry] = []
    reused = 0
    for entry in chosen.segments:
        path = os.path.join(target, local.segment_file_name(entry.base))
        if _complete(path, entry):
            reused += 1
        else:
            todo.append(entry)
    total = sum(e.size for e in todo)
    done = [0]
    lock = threading.Lock()
    fds: dict[int, int] = {}
    remaining = {e.base: len(e.objects) for e in todo}
    synced: set[str] = set()  # segments fsynced in step 4 (step 5 skips them)
    newest = chosen.segments[-1].base if chosen.segments else -1
    interval = local.index_interval(chosen.meta)
    try:
        for entry in todo:
            part = os.path.join(target, local.segment_file_name(entry.base) + PART_SUFFIX)
            fds[entry.base] = os.open(part, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC)

        def fetch(entry: SegmentEntry, ref: ObjectRef) -> None:
            data = fetch_object(store, ref)
            view = memoryview(data)
            position = ref.start
            while view:
                written = os.pwrite(fds[entry.base], view, position)
                view, position = view[written:], position + written
            with lock:
                remaining[entry.base] -= 1
                complete = remaining[entry.base] == 0
                done[0] += len(data)
                if progress is not None:
                    progress(done[0], total)
            if complete:  # the segment is whole: index it, name it (synced in step 5)
                with lock:
                    fd = fds.pop(entry.base)
                try:
                    if entry.base != newest:  # recovery indexes the newest one itself
                        whole = data  # one object holds the whole segment, or:
                        if len(data) != entry.size:
                            whole = local.read_all(fd, 0, entry.size)
                        local.write_segment_index(target, entry.base, whole, interval)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                name = local.segment_file_name(entry.base)
                os.rename(os.path.join(target, name + PART_SUFFIX), os.path.join(target, name))
                with lock:
                    synced.add(name)

        with ThreadPoolExecutor(max(1, threads), thread_name_prefix="archive-fetch") as pool:
            futures = [pool.submit(fetch, e, ref) for e in todo for ref in e.objects]
            try:
                for future in futures:
                    future.result()
            except BaseException:
                for future in futures:
                    future.cancel()
                raise
    finally:
        for fd in fds.values():
            os.close(fd)
    return total, reused, synced


def _fsync_all(target: str, chosen: Manifest, threads: int, synced: set[str]) -> None:
    """Step 5: every segment and index of the manifest not ``synced`` in step 4 to disk,
    several at a time (the disk gets all the writes at once to order), then the
    directory's renames."""
    names = [local.segment_file_name(e.base) for e in chosen.segments]
    names += [local.index_file_name(e.base) for e in chosen.segments[:-1]]
    names = [name for name in names if name not in synced]

    def sync(name: str) -> None:
        try:
            fd = os.open(os.path.join(target, name), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:  # an index not written (a segment kept from before)
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="archive-sync") as pool:
        list(pool.map(sync, names))
    local.fsync_directory(target)


def _complete(path: str, entry: SegmentEntry) -> bool:
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return False
    return len(data) == entry.size and crc32c(data) == entry.crc32c


def _open_once(target: str, chosen: Manifest) -> None:
    import compactlog

    log = compactlog.open(target, create=False)
    try:
        end = log.end_offset
    finally:
        log.close()
    expected = max(chosen.end_offset, chosen.handed_out) if chosen.segments else end
    if end != expected:
        raise ArchiveError(
            f"restored log ends at offset {end}, manifest {chosen.sequence} says {expected}",
            path=target,
        )


__all__ = ["MARKER", "RestoreResult", "fetch_object", "pinned_manifest", "restore"]
