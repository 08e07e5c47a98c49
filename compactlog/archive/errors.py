"""The archive's errors: every one a :class:`~compactlog.errors.CompactLogError`, so that the
CLI reports it as one line, and each names the object, the lease holder or the URL at fault."""

from __future__ import annotations

from ..errors import CompactLogError


class ArchiveError(CompactLogError):
    """Base of the archive's errors (``path`` is the archive URL or the object's key)."""


class StoreError(ArchiveError):
    """The object store failed a request even after its retries (network, 5xx, timeout,
    credentials): nothing was committed; the next round tries again."""


class ObjectMissingError(ArchiveError):
    """An object a manifest names is not in the store."""


class ObjectCorruptError(ArchiveError):
    """An object's bytes do not match the size and checksum its manifest records."""


class LeaseHeldError(ArchiveError):
    """Another archiver holds the archive's lease (the message names host, pid, since)."""


class LeaseLostError(ArchiveError):
    """This archiver's lease was taken over (it expired): it must stop committing."""


class NoManifestError(ArchiveError):
    """The archive holds no manifest (or none at or before the requested point)."""


class RestoreTargetError(ArchiveError):
    """A restore target that is not empty and not an earlier, interrupted restore of the
    same manifest."""


__all__ = [
    "ArchiveError",
    "LeaseHeldError",
    "LeaseLostError",
    "NoManifestError",
    "ObjectCorruptError",
    "ObjectMissingError",
    "RestoreTargetError",
    "StoreError",
]
