"""A read-only local replica kept current from the archive (Litestream's read replicas).

The replica is a log directory that no writer opens: ``compactlog.open(path,
read_only=True)``, a ``Table``, a subscriber or ``compactlog dump`` read it on another
machine. It has no ``.lock`` (so readers read each segment to the end of its valid data),
and it changes only the ways a live log does: segments grow by whole batches, a rewritten
segment is renamed over the old one before the segments it replaces are removed (the
cleaner's swap order), small files are replaced atomically. A reader that meets a batch
still being written sees a torn tail and stops there, as it would on the source.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import ArchiveError, NoManifestError, ObjectMissingError, StoreError
from ..storage.filenames import FileKind, parse_filename
from ..storage.state_files import REPLICA_ADVICE, replica_of
from . import local
from . import manifest as manifests
from .manifest import Manifest, ObjectRef, SegmentEntry
from .pins import Pin
from .restore import PART_SUFFIX, _complete, fetch_object, restore
from .retry import Backoff, sleep_until
from .store import Store, now_ms

STATE = local.REPLICA_STATE  # which manifest the replica holds
WRITER_FILES = (".lock", "clean_shutdown", ".writers.lock")


# an object no manifest names: a local segment entry built with it is never "unchanged"
_UNKNOWN = ObjectRef("(the replica's own bytes)", 0, 0, 0, "")


@dataclass(slots=True)
class FollowStatus:
    """After a check: the manifest the replica holds and its lag.

    ``lag_ms`` is 0 when the last check found the replica holding the archive's newest
    manifest; otherwise the time since the last check that did (since the follower started,
    when none did yet). It measures the replica against the archive, not the archive
    against the source log (``archive run`` reports that lag)."""

    sequence: int
    end_offset: int
    lag_ms: int
    changed: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "sequence": self.sequence,
            "end_offset": self.end_offset,
            "lag_ms": self.lag_ms,
            "changed": self.changed,
        }


class Follower:
    """Keeps ``target`` equal to the archive's newest manifest, one :meth:`step` at a time."""

    def __init__(self, store: Store, target: str) -> None:
        self.store = store
        self.target = os.path.abspath(target)
        self.applied: Manifest | None = None
        self.current_ms = now_ms()  # when a check last found the replica current

    def status(self, changed: bool = False) -> FollowStatus:
        """The replica's manifest and lag (see :class:`FollowStatus`), without a check."""
        applied = self.applied
        return FollowStatus(
            applied.sequence if applied is not None else -1,
            applied.end_offset if applied is not None else 0,
            max(now_ms() - self.current_ms, 0),
            changed,
        )

    def _state(self) -> int | None:
        """The manifest the replica holds (``None``: not a replica yet); an unreadable state
        file or another archive's replica is refused, naming what to do."""
        document = replica_of(self.target)
        if document is None:
            return None
        sequence = document.get("sequence")
        if document.get("url") is None or not isinstance(sequence, int):
            raise ArchiveError(f"{STATE} is damaged; {REPLICA_ADVICE}", path=self.target)
        if document["url"] != self.store.url:
            raise ArchiveError(
                f"is a replica of another archive ({document['url']})", path=self.target
            )
        return sequence

    def step(self) -> FollowStatus:
        """Bring the replica to the newest manifest (a restore the first time)."""
        if self.applied is None:
            sequence = self._state()
            if sequence is None:
                result = restore(self.store, self.target)
                sequence = result.sequence
                for name in WRITER_FILES:
                    try:
                        os.unlink(os.path.join(self.target, name))
                    except FileNotFoundError:
                        pass
                self._save(sequence)
            try:
                self.applied = manifests.load(self.store, sequence)
            except ObjectMissingError:  # pruned while no follower ran: held is unknown
                return self._rebase(sequence)
        newest = manifests.sequences(self.store)
        changed = False
        if newest and newest[-1] > self.applied.sequence:
            with Pin(self.store, newest[-1]) as pin:
                try:
                    target = manifests.load(self.store, pin.sequence)
                except ArchiveError:
                    target = None  # pruned under us: the next step takes the newer one
                if target is not None:
                    with local.replica_lock(self.target):
                        self._apply(self.applied, target)
                        self._save(target.sequence)
                    self.applied = target
                    changed = True
        if not newest or newest[-1] <= self.applied.sequence:
            self.current_ms = now_ms()
        return self.status(changed)

    def _rebase(self, held: int) -> FollowStatus:
        """The replica holds manifest ``held``, which retention has removed: bring it to
        the newest manifest. What the replica holds is read from its own files: a segment
        whose size and CRC-32C match the newest manifest's entry is kept, every other one
        is fetched to ``.part`` and renamed over (the order of ``_apply``)."""
        newest = manifests.sequences(self.store)
        if not newest:
            raise NoManifestError("the archive holds no manifest", path=self.store.url)
        with Pin(self.store, newest[-1]) as pin:
            target = manifests.load(self.store, pin.sequence)
            wanted = {s.base: s for s in target.segments}
            segments = []
            for name in sorted(os.listdir(self.target)):
                parsed = parse_filename(name)
                if parsed.kind is not FileKind.SEGMENT or parsed.base_offset is None:
                    continue
                entry = wanted.get(parsed.base_offset)
                path = os.path.join(self.target, name)
                if entry is not None and _complete(path, entry):
                    segments.append(entry)
                else:
                    size = os.path.getsize(path)
                    segments.append(
                        SegmentEntry(parsed.base_offset, size, 0, 0, False, None, (_UNKNOWN,))
                    )
            holding = dataclasses.replace(target, sequence=held, segments=segments)
            with local.replica_lock(self.target):
                self._apply(holding, target)
                self._save(target.sequence)
            self.applied = target
        return self.step()

    def _save(self, sequence: int) -> None:
        body = json.dumps({"url": self.store.url, "sequence": sequence}).encode()
        local.write_small_file(self.target, STATE, body)

    def _apply(self, old: Manifest, new: Manifest) -> None:
        """Make the replica's segments those of ``new``, in base order, so that a reader
        listing the directory at any moment finds every segment before the newest whole
        (a reader, like a subscriber without a head, takes a segment that is not the newest
        as complete and moves on to the next base):

        1. Per base, ascending, over the manifest's segments and the segment files present:
           a segment ``new`` names that only grew gets its new objects written in place; a
           new or rewritten one is fetched to ``.part`` and renamed over (its stale index
           removed first); a segment file ``new`` does not name is removed *here*, after the
           rewrite before it that took over its offsets (the cleaner's merge) and before
           any newer segment is created. A replica's copy of a segment merged away may be
           a prefix of it (it was the newest, still growing, when last applied): left in
           place beside a newer segment, it would tell a reader its offsets end where the
           copy ends, and the reader would skip the rest, which only the merged rewrite
           holds. Files no manifest named (left by a follower killed half-way) go too.
        2. fsync the directory, then ``cleaner.checkpoint``, then ``meta``.

        Each step is idempotent, so a follower killed half-way redoes it."""
        before = {s.base: s for s in old.segments}
        wanted = {s.base: s for s in new.segments}
        for base in sorted(set(wanted) | set(local.list_segments(self.target))):
            entry = wanted.get(base)
            if entry is None:
                _remove(os.path.join(self.target, local.segment_file_name(base)))
                _remove(os.path.join(self.target, local.index_file_name(base)))
                continue
            previous = before.get(base)
            if previous is not None and previous.objects == entry.objects:
                continue
            path = os.path.join(self.target, local.segment_file_name(base))
            if (
                previous is not None
                and entry.objects[: len(previous.objects)] == previous.objects
                and os.path.exists(path)
            ):
                self._write(path, entry, entry.objects[len(previous.objects) :], os.O_WRONLY)
            else:
                part = path + PART_SUFFIX
                self._write(part, entry, entry.objects, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                _remove(os.path.join(self.target, local.index_file_name(base)))
                os.rename(part, path)
        local.fsync_directory(self.target)
        if new.cleaner is not None:
            local.write_small_file(
                self.target, local.CLEANER_FILE, json.dumps(new.cleaner, sort_keys=True).encode()
            )
        local.write_small_file(
            self.target, local.META_FILE, json.dumps(new.meta, indent=1, sort_keys=True).encode()
        )

    def _write(self, path: str, entry: SegmentEntry, refs: Any, flags: int) -> None:
        fd = os.open(path, flags | os.O_CLOEXEC, 0o644)
        try:
            for ref in refs:
                data = memoryview(fetch_object(self.store, ref))
                position = ref.start
                while data:
                    written = os.pwrite(fd, data, position)
                    data, position = data[written:], position + written
            os.ftruncate(fd, entry.size)
            os.fsync(fd)
        finally:
            os.close(fd)


def follow(
    store: Store,
    target: str,
    *,
    interval_s: float = 1.0,
    should_stop: Callable[[], bool] = lambda: False,
    report: Callable[[FollowStatus], None] | None = None,
    failed: Callable[[ArchiveError, float, FollowStatus], None] | None = None,
) -> FollowStatus:
    """Run :meth:`Follower.step` every ``interval_s`` until ``should_stop()``: every check
    that fails on the store (``StoreError``, an object pruned under it, no manifest yet) is
    reported to ``failed`` and retried after a backoff (``retry.Backoff``); it never ends
    the loop. The first check always runs, and reports its status or its failure."""
    follower = Follower(store, target)
    backoff = Backoff(interval_s)
    first = True
    while True:
        started = time.monotonic()
        try:
            status = follower.step()
        except (StoreError, ObjectMissingError, NoManifestError) as error:
            delay = backoff.failed()
            if failed is not None:
                failed(error, delay, follower.status())
        else:
            backoff.succeeded()
            if report is not None and (status.changed or first):
                report(status)
            first = False
        if should_stop():
            return follower.status()
        sleep_until(started + (backoff.delay_s or interval_s), should_stop)
        if should_stop():
            return follower.status()


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


__all__ = ["FollowStatus", "Follower", "follow"]
