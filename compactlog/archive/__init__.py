"""A continuous, compacted archive of a log in object storage (docs/archive.md).

Modules: ``store`` (the object-store interface and its obstore implementation), ``local``
(the one door into the library: the durable view of a log), ``manifest`` (committed views),
``lease`` (one archiver per archive), ``push`` (one archiving round), ``pins`` and ``prune``
(retention that never removes what a running reader needs), ``restore``, ``follow`` (a
read-only replica), ``verify`` and ``run`` (the foreground service loop).
"""

from __future__ import annotations

from ..errors import (
    ArchiveError,
    LeaseHeldError,
    LeaseLostError,
    NoManifestError,
    ObjectCorruptError,
    ObjectMissingError,
    RestoreTargetError,
    StoreError,
)
from .store import FaultyStore, ObjectStore, Store, open_store

__all__ = [
    "ArchiveError",
    "FaultyStore",
    "LeaseHeldError",
    "LeaseLostError",
    "NoManifestError",
    "ObjectCorruptError",
    "ObjectMissingError",
    "ObjectStore",
    "RestoreTargetError",
    "Store",
    "StoreError",
    "open_store",
]
