"""Key compaction (Kafka's log cleaner) for one log: ``Log.compact()`` calls :func:`compact_log`.

The algorithm is in :mod:`.cleaner` (pure: explicit ``now``, ``should_abort``), the
cleaner's columnar batch rewriting in :mod:`.columns`, the statistics in :mod:`.stats`; the
offset map and key digests are :mod:`compactlog.encoding.offset_map` (the latest-state reader and
Spark use them too). This module adds what a pass needs around the algorithm: the
cleaner lock, the uncleanable mark in ``meta``, and retention at the end of every pass.
See ``docs/compaction.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..config import check_change
from ..errors import CompactionError, CompactionWriteError, CorruptLogError, DiskFullError
from .cleaner import Throttler, clean_log
from .progress import CompactionProgress, ProgressCallback
from .stats import CleanerStats

if TYPE_CHECKING:
    from ..engine.logview import LogView

__all__ = [
    "CleanerStats",
    "CompactionError",
    "CompactionProgress",
    "CompactionWriteError",
    "DiskFullError",
    "ProgressCallback",
    "Throttler",
    "compact_log",
]


def compact_log(
    log: LogView,
    *,
    force: bool = False,
    now_ms: int | None = None,
    should_abort: Callable[[], bool] | None = None,
    throttler: Throttler | None = None,
    progress: ProgressCallback | None = None,
    settings: Mapping[str, Any] | None = None,
) -> CleanerStats:
    """One cleaning pass if due (``force``: whatever the dirty ratio), then retention.

    Takes ``.cleaner.lock`` without waiting: a second cleaner gets
    :class:`~compactlog.errors.LogLockedError`. A corrupt batch aborts the pass before any
    file changes; the reason is stored as ``meta.uncleanable`` (cleared by ``repair``) and
    returned in ``stats.uncleanable``, and later passes skip the log until then.

    A write that fails (a full disk, a permission, an I/O error) rolls the pass back and
    raises :class:`~compactlog.errors.CompactionWriteError` (:class:`DiskFullError` for
    ``ENOSPC``): the log is *not* marked uncleanable, since the cause is outside the log
    and a later pass succeeds once it is gone; retention does not run after it.
    ``progress`` is called with :class:`CompactionProgress` events (``progress.py``).
    ``throttler`` may be shared by passes on several threads.

    ``settings`` apply to this pass only, on top of the stored config, and are never stored
    (the cleaner service's overrides): ``config.check_change`` refuses what ``compactlog
    config set`` refuses, as :class:`~compactlog.errors.UnsafeChangeError`.
    """
    now = log.clock() if now_ms is None else now_ms
    with log.cleaner_lock(wait=False):
        meta = log.reload_meta()
        config = (
            check_change(meta.config, settings, path=log.directory) if settings else meta.config
        )
        if not config.compacted:
            stats = CleanerStats(forced=force, now_ms=now)
            stats.skipped = f"cleanup_policy={config.cleanup_policy!r} does not compact"
        elif meta.uncleanable:
            stats = CleanerStats(forced=force, now_ms=now)
            stats.uncleanable = meta.uncleanable
            stats.skipped = f"log is marked uncleanable ({meta.uncleanable}); run repair"
        else:
            try:
                stats = clean_log(
                    log.directory,
                    log.fs,
                    config,
                    now=now,
                    log_start=meta.log_start_offset,
                    force=force,
                    should_abort=should_abort,
                    throttler=throttler,
                    timestamp_cache=log._timestamp_cache,
                    progress=progress,
                )
            except CorruptLogError as error:
                reason = f"corrupt batch found while cleaning: {error}"
                log.update_meta(uncleanable=reason)
                stats = CleanerStats(forced=force, now_ms=now)
                stats.uncleanable = reason
                stats.skipped = reason
        if config.deletes_by_retention or config.deletes_when_consumed:
            stats.retention = log._enforce_retention_locked(now, config)
    return stats
