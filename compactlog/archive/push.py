"""One archiving round: ship what is durable and new, then commit a manifest.

Objects are immutable and named by their content: ``objects/<base>-<start>-<sha256>``
holds bytes ``[start, start + size)`` of segment ``<base>``. A sealed segment is one object
(or the pieces it was shipped in while it grew); a cleaned rewrite of it has other bytes,
so another name, and never overwrites what an older manifest names. The archive never sits
in the write path: it reads files, and holds the cleaner lock only while it opens them.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from crc32c import crc32c

from ..errors import ArchiveError, LeaseLostError
from . import local
from . import manifest as manifests
from .lease import Lease
from .manifest import Manifest, ObjectRef, SegmentEntry
from .store import Store, now_ms

UPLOAD_THREADS = 4
IN_FLIGHT_BYTES = 256 << 20  # bytes read but not yet uploaded, at most (about)


@dataclass(slots=True)
class PushResult:
    """What one round did."""

    manifest: Manifest | None  # the manifest committed (None: nothing new to commit)
    objects: int = 0
    bytes: int = 0
    new_generation: bool = False
    end_offset: int = 0
    handed_out: int = 0
    seconds: float = 0.0
    stopped: bool = False  # a stop request cut the round short (step 5)

    @property
    def lag_records(self) -> int:
        """Offsets handed out locally that the archive does not hold yet."""
        return max(self.handed_out - self.end_offset, 0)

    def to_json(self) -> dict[str, Any]:
        m = self.manifest
        return {
            "committed": m.sequence if m is not None else None,
            "generation": m.generation if m is not None else None,
            "objects": self.objects,
            "bytes": self.bytes,
            "new_generation": self.new_generation,
            "end_offset": self.end_offset,
            "lag_records": self.lag_records,
            "seconds": round(self.seconds, 3),
            "stopped": self.stopped,
        }


def object_key(base: int, start: int, sha256: str) -> str:
    return f"{manifests.OBJECT_PREFIX}{base:020d}-{start:012d}-{sha256[:32]}"


@dataclass
class Archiver:
    """Archives one log into one archive, round after round, holding its lease.

    ``log`` is the log opened read-only (``compactlog.open(path, read_only=True)``).
    """

    log: Any
    store: Store
    lease: Lease = field(init=False)
    log_id: str = ""
    uploaded: set[str] = field(default_factory=set)  # keys this process knows are whole
    resumed: bool = False  # the first round HEADs objects before uploading (resume)
    threads: int = UPLOAD_THREADS
    clock: Callable[[], int] = now_ms

    def __post_init__(self) -> None:
        self.lease = Lease(self.store, log=self.log.directory)

    def start(self) -> None:
        """Take the lease (refused while another archiver holds it) and the log's
        identity."""
        self.lease.acquire()
        self.log_id = local.log_id(self.log, create=True) or ""

    def stop(self) -> None:
        self.lease.release()

    def push(self, stop: Callable[[], bool] | None = None) -> PushResult:
        """One round; ``stop()`` turning true cuts it short (step 5). Commit protocol:

        1. Renew the lease (:class:`LeaseLostError` if another archiver took it).
        2. Read the newest manifest. When it is of another log (``archive.id``), or holds
           offsets the log no longer has, this round starts a new generation and ships
           everything; the older generations stay until retention removes them.
        3. Holding the cleaner lock for milliseconds, take the durable view: list the
           segments, read the sync point and the head, ``meta`` and the cleaner point, and
           open the segments whose bytes this round reads (``local.capture``).
        4. For each segment, in segment order: unchanged since the last manifest (same
           file, same size) is named again as it is; a segment that only grew (the same
           file: the active one, or one sealed since, its archived bytes checked) ships the
           new bytes as one more object; anything else (new, or a cleaned rewrite) ships
           whole. Every byte shipped is checked batch by batch first (``local.check_piece``:
           a torn end waits for the next round, corruption stops the round naming file and
           byte).
        5. Upload the objects in parallel, in segment order; each is complete once its put
           returns. A failed upload fails the round before anything is committed: no
           manifest ever names an object that is not complete. The next round (or process)
           skips objects already uploaded. A stop request (``stop()``) ends the submitting:
           no segment is read and no upload started after it, queued uploads are dropped,
           and only the uploads already running are waited for. The round then names the
           **complete prefix** of the view (``_complete_prefix``): its segments in order up
           to the first whose object is not complete (segments needing no upload count as
           complete), plus that segment's previously archived bytes when it only grew. It
           is the log cut at the prefix's end: a consistent view only if the end is at or
           past the cleaner point (below it a cleaned segment may lack a record whose
           successor lies past the cut, and the checkpoint may name offsets past it), and
           committed only if the end is also at or past the newest manifest's (the archive
           never goes back within a generation). Otherwise nothing is committed; the
           complete objects are found again by the next process's ``HEAD``s. ``meta``, the
           cleaner checkpoint and ``handed_out`` are the view's: offsets the log handed out
           are never reused by a restore.
        6. If nothing changed, stop here. Otherwise renew the lease again if it is half
           gone, and put-if-absent ``manifests/<next sequence>.json``. Another manifest
           there means another archiver committed: :class:`LeaseLostError`, nothing is
           overwritten. A death before this step leaves uploaded objects that no manifest
           names; prune removes them after a grace period.
        """
        started = time.perf_counter()
        # 1.
        self.lease.ensure()
        # 2.
        previous = manifests.latest(self.store)
        same_log = previous is not None and previous.log_id == self.log_id
        known = {s.base: s for s in previous.segments} if same_log and previous else {}
        # 3.
        view = local.capture(self.log, lambda *a: _needs_read(known, *a), log_id=self.log_id)
        try:
            shipped = self._ship(view, known, stop)
        finally:
            view.close()
        new_generation = previous is None or not same_log
        if (
            previous is not None
            and same_log
            and not shipped.stopped
            and shipped.end < previous.end_offset
        ):
            # the log lost offsets the archive holds (repaired, restored from older data):
            # start over in a new generation rather than pretend continuity
            new_generation, known = True, {}
            view = local.capture(self.log, lambda *a: True, log_id=self.log_id)
            try:
                shipped = self._ship(view, known, stop)
            finally:
                view.close()
        entries = _complete_prefix(shipped.planned, known, self.uploaded)
        end = max((e.end_offset for e in entries), default=0)
        cleaner_point = int((view.cleaner or {}).get("first_dirty_offset", 0))
        result = PushResult(
            None,
            shipped.objects,
            shipped.bytes,
            new_generation,
            end,
            max(view.handed_out, end),
            stopped=shipped.stopped,
        )
        if shipped.stopped and not (
            entries
            and end >= cleaner_point
            and (new_generation or previous is None or end >= previous.end_offset)
        ):
            # 5. cut short with no consistent prefix worth committing
            result.end_offset = previous.end_offset if same_log and previous else 0
            result.seconds = time.perf_counter() - started
            return result
        candidate = Manifest(
            sequence=previous.sequence + 1 if previous is not None else 0,
            generation=(
                (previous.generation + 1 if new_generation else previous.generation)
                if previous is not None
                else 0
            ),
            log_id=self.log_id,
            time_ms=self.clock(),
            start_offset=int(view.meta.get("log_start_offset", 0)),
            end_offset=end,
            handed_out=max(view.handed_out, end),
            cleaner_point=min(cleaner_point, end),
            meta=view.meta,
            cleaner=view.cleaner,
            segments=entries,
            archiver={"host": socket.gethostname(), "pid": os.getpid(), "path": self.log.path},
            parent=(
                local.parent_of(self.log, self.store.url)
                if new_generation
                else (previous.parent if previous is not None else None)
            ),
        )
        # 6.
        if previous is not None and not new_generation and _same_state(previous, candidate):
            result.seconds = time.perf_counter() - started
            return result
        self.lease.ensure()
        if not manifests.commit(self.store, candidate):
            raise LeaseLostError(
                f"another archiver committed manifest {candidate.sequence} meanwhile",
                path=self.store.url,
            )
        result.manifest = candidate
        result.seconds = time.perf_counter() - started
        return result

    def _ship(
        self,
        view: local.DurableView,
        known: dict[int, SegmentEntry],
        stop: Callable[[], bool] | None,
    ) -> _Shipped:
        """Steps 4 and 5."""
        stopping = stop or _never
        shipped = _Shipped()
        pending: list[tuple[Future[bool], int]] = []
        submitted: list[tuple[Future[bool], int]] = []
        in_flight = 0
        with ThreadPoolExecutor(self.threads, thread_name_prefix="archive-upload") as pool:
            try:
                for segment in view.segments:
                    if segment.fd >= 0 and stopping():
                        shipped.stopped = True
                        break  # 5. reads nothing more once stopped
                    entry, uploads = self._segment_entry(segment, known.get(segment.base))
                    if entry is None:
                        continue
                    key = uploads[0][0] if uploads else None
                    shipped.planned.append((entry, key))
                    for key, data in uploads:
                        if key in self.uploaded:
                            continue
                        in_flight += len(data)
                        task = pool.submit(self._upload, key, data, stopping)
                        pending.append((task, len(data)))
                        submitted.append((task, len(data)))
                        while in_flight > IN_FLIGHT_BYTES and pending:
                            done, size = pending.pop(0)
                            done.result()
                            in_flight -= size
                if stopping():
                    for done, _size in pending:
                        done.cancel()  # dropped if not started yet; a running one finishes
                for done, size in submitted:
                    if not done.cancelled() and done.result():
                        shipped.objects += 1
                        shipped.bytes += size
            except BaseException:
                for done, _size in pending:
                    done.cancel()
                raise
        shipped.stopped = shipped.stopped or any(
            key is not None and key not in self.uploaded for _entry, key in shipped.planned
        )
        self.resumed = True
        return shipped

    def _upload(self, key: str, data: bytes, stop: Callable[[], bool]) -> bool:
        """Upload one object (``True``), or find it already there on a first round, or
        skip it when the round was stopped before it started (``False``: not uploaded)."""
        if stop():
            return False
        if not self.resumed:
            info = self.store.head(key)
            if info is not None and info.size == len(data):
                self.uploaded.add(key)
                return False
        self.store.put(key, data)
        self.uploaded.add(key)
        return True

    def _segment_entry(
        self, segment: local.DurableSegment, known: SegmentEntry | None
    ) -> tuple[SegmentEntry | None, list[tuple[str, bytes]]]:
        """Step 4 for one segment: its entry in the next manifest and the objects to ship."""
        hint = segment.stat.to_json()
        if segment.fd < 0:  # unchanged (``_needs_read`` said so), or nothing durable yet
            if known is None:
                return None, []
            return replace(known, local=hint, active=segment.active), []
        if known is not None and _same_file(known, segment):
            grows = segment.active
            if not grows:  # sealed since it was shipped: check the shipped bytes are these
                grows = crc32c(segment.read(0, known.size)) == known.crc32c
            if grows:
                data = segment.read(known.size, segment.durable_size)
                whole, next_offset = local.check_piece(segment.path, data, known.size)
                if whole == 0:
                    return replace(known, local=hint, active=segment.active), []
                piece = data[:whole]
                ref = _object(segment.base, known.size, piece)
                entry = SegmentEntry(
                    segment.base,
                    known.size + whole,
                    crc32c(piece, known.crc32c),
                    next_offset if next_offset is not None else known.end_offset,
                    segment.active,
                    hint,
                    (*known.objects, ref),
                )
                return entry, [(ref.key, piece)]
        data = segment.read(0, segment.durable_size)
        whole, next_offset = local.check_piece(segment.path, data, 0)
        if whole < local.SEGMENT_HEADER_SIZE:
            return None, []  # not even a whole file header on disk yet
        piece = data[:whole]
        ref = _object(segment.base, 0, piece)
        entry = SegmentEntry(
            segment.base,
            whole,
            ref.crc32c,
            next_offset if next_offset is not None else segment.base,
            segment.active,
            hint,
            (ref,),
        )
        return entry, [(ref.key, piece)]


@dataclass(slots=True)
class _Shipped:
    """Steps 4 and 5 of a round: every segment planned (its entry in the next manifest, and
    the key of the object it waits for, if any), what was uploaded, and whether a stop
    request left some of it undone."""

    planned: list[tuple[SegmentEntry, str | None]] = field(default_factory=list)
    objects: int = 0
    bytes: int = 0
    stopped: bool = False

    @property
    def end(self) -> int:
        return max((entry.end_offset for entry, _key in self.planned), default=0)


def _never() -> bool:
    return False


def _complete_prefix(
    planned: list[tuple[SegmentEntry, str | None]],
    known: dict[int, SegmentEntry],
    uploaded: set[str],
) -> list[SegmentEntry]:
    """Step 5: the planned entries, in segment order, up to the first whose object is not
    complete; that segment too, as it was archived before, when it only grew (its old
    bytes are a prefix of the file's: the log cut at a batch boundary). All of them when
    the round was not cut short."""
    prefix: list[SegmentEntry] = []
    for entry, key in planned:
        if key is None or key in uploaded:
            prefix.append(entry)
            continue
        before = known.get(entry.base)
        if before is not None and entry.objects[:-1] == before.objects:
            prefix.append(before)
        break
    return prefix


def _object(base: int, start: int, data: bytes) -> ObjectRef:
    digest = hashlib.sha256(data).hexdigest()
    return ObjectRef(object_key(base, start, digest), start, len(data), crc32c(data), digest)


def _same_file(known: SegmentEntry, segment: local.DurableSegment) -> bool:
    """The local file is the one ``known`` was shipped from, grown or not (same inode, not
    shorter). A rewrite by the cleaner is a new inode: ``swap.py`` renames it over."""
    return (
        known.local is not None
        and known.local[0] == segment.stat.ino
        and segment.durable_size >= known.size
    )


def _needs_read(
    known: dict[int, SegmentEntry], base: int, stat: local.FileStat, durable: int, active: bool
) -> bool:
    entry = known.get(base)
    if entry is None:
        return True
    if entry.local == stat.to_json() and entry.size == durable:
        return False  # the same file as shipped, untouched
    # the active segment cannot have been rewritten: same inode and no new durable bytes
    return not (active and _same_inode(entry, stat) and durable == entry.size)


def _same_inode(entry: SegmentEntry, stat: local.FileStat) -> bool:
    return entry.local is not None and entry.local[0] == stat.ino


def _same_state(a: Manifest, b: Manifest) -> bool:
    """Whether two manifests describe the same log state (hints and times aside)."""

    def shape(m: Manifest) -> Any:
        return (
            m.end_offset,
            m.start_offset,
            m.cleaner,
            m.meta,
            [(s.base, s.size, s.crc32c, s.objects) for s in m.segments],
        )

    return shape(a) == shape(b)


def push_once(log_path: str, store: Store) -> PushResult:
    """``compactlog archive push``: take the lease, run one round, release the lease."""
    import compactlog

    log = compactlog.open(log_path, create=False, read_only=True)
    try:
        archiver = Archiver(log, store)
        archiver.start()
        try:
            return archiver.push()
        finally:
            archiver.stop()
    finally:
        log.close()


__all__ = ["ArchiveError", "Archiver", "PushResult", "object_key", "push_once"]
