"""Retention in the archive: remove manifests past the restore window, and objects that no
remaining manifest names, never one a running restore or follower still reads.

A manifest is **retained** while it is the newest, or while its successor was committed
less than ``retention`` ago (it was the log's state at some moment of the window: a restore
``--as-of-time`` anywhere in the window needs it). ``retention=0`` keeps only the newest.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from ..errors import ArchiveError
from . import manifest as manifests
from .manifest import Manifest
from .pins import live_pins
from .store import Store, now_ms

ORPHAN_GRACE_MS = 120_000  # objects no manifest ever named: kept this long (uploads in flight)


@dataclass(slots=True)
class PruneResult:
    manifests_deleted: list[int] = field(default_factory=list)
    objects_deleted: int = 0
    bytes_deleted: int = 0
    kept_for_readers: list[int] = field(default_factory=list)
    retained: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "manifests_deleted": len(self.manifests_deleted),
            "objects_deleted": self.objects_deleted,
            "bytes_deleted": self.bytes_deleted,
            "kept_for_readers": self.kept_for_readers,
            "retained": self.retained,
        }


def prune(
    store: Store,
    retention_ms: int,
    *,
    now: int | None = None,
    orphan_grace_ms: int = ORPHAN_GRACE_MS,
    cache: dict[int, Manifest] | None = None,
) -> PruneResult:
    """Apply retention. Run it while holding the archive's lease (the archiver does, between
    rounds; ``compactlog archive prune`` takes it), so no round of ours is in flight.

    1. Read every manifest (``cache``: the ones this process read before, manifests never
       change). One that cannot be read stops the prune before anything is deleted.
    2. Decide which are retained (module docstring).
    3. Read the reader pins; a pinned manifest is retained too.
    4. Delete the manifests not retained, oldest first.
    5. Read the pins again: a reader that pinned a manifest after step 3 found it still
       there only if step 4 had not deleted it yet, so it is among these pins; the objects
       of every manifest pinned now are kept as well (``pins.py``).
    6. Delete every object that no kept manifest names: at once if an older manifest named
       it; after ``orphan_grace_ms`` if none ever did (an upload whose round has not
       committed yet, or never will).
    """
    now = now_ms() if now is None else now
    cache = {} if cache is None else cache
    result = PruneResult()
    # 1.
    found = manifests.sequences(store)
    if not found:
        return result
    loaded: dict[int, Manifest] = {}
    for sequence in found:
        if sequence not in cache:
            try:
                cache[sequence] = manifests.load(store, sequence)
            except ArchiveError as error:
                raise ArchiveError(
                    f"cannot read manifest {sequence}, nothing pruned: {error}", path=store.url
                ) from None
        loaded[sequence] = cache[sequence]
    # 2.
    retained = {found[-1]}
    for earlier, later in itertools.pairwise(found):
        if loaded[later].time_ms > now - retention_ms:
            retained.add(earlier)
    # 3.
    pinned = set(live_pins(store).values())
    retained |= pinned & set(found)
    # 4.
    for sequence in found:
        if sequence not in retained:
            store.delete(manifests.manifest_key(sequence))
            result.manifests_deleted.append(sequence)
            cache.pop(sequence, None)
    # 5.
    pinned_now = set(live_pins(store).values())
    keep_manifests = retained | (pinned_now & set(found))
    result.kept_for_readers = sorted((pinned | pinned_now) & set(found) - {found[-1]})
    result.retained = sorted(retained)
    keep: set[str] = set()
    for sequence in keep_manifests:
        keep |= loaded[sequence].object_keys()
    ever_named: set[str] = set()
    for manifest in loaded.values():
        ever_named |= manifest.object_keys()
    # 6.
    for info in store.list(manifests.OBJECT_PREFIX):
        if info.key in keep:
            continue
        if info.key not in ever_named and info.modified_ms > now - orphan_grace_ms:
            continue
        store.delete(info.key)
        result.objects_deleted += 1
        result.bytes_deleted += info.size
    return result


__all__ = ["ORPHAN_GRACE_MS", "PruneResult", "prune"]
