"""One cleaning pass over one log, as the service runs it: open, ``compact_log``, classify.

How the service opens a log. ``compact_log`` needs the directory, ``meta`` and the
cleaner lock; it never touches the writers' lock or the active segment. So a log whose
policy only compacts is opened **read-only**: no writers' lock is taken, no open-time
recovery runs (it would remove other processes' in-flight ``.tmp`` files and validate the
active tail under the writers' lock), no clean-shutdown marker is written at close, and
applications appending meanwhile never wait for the service. Retention (``delete``,
``consumed``), which ``compact_log`` runs at the end of the pass, removes whole segments
under the writers' lock and needs a writer handle in today's library: only logs with such a
policy are opened for writing, for the length of the pass (open takes the writers' lock
briefly, like any application opening the log).

Outcomes: ``cleaned`` / ``skipped`` (not due) / ``busy`` (another cleaner holds the log:
skipped this round, never waited on) / ``aborted`` (shutdown) / ``uncleanable`` (corrupt:
``compact_log`` marked it in ``meta``; ``compactlog repair`` clears the mark) / ``failed``
(an error: the scheduler backs off).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import compactlog
from compactlog.compaction import CleanerStats, Throttler, compact_log
from compactlog.errors import CompactLogError, LogLockedError

from .discovery import LogRef


@dataclass
class PassOutcome:
    ref: LogRef
    status: str  # cleaned | skipped | busy | aborted | uncleanable | failed
    reason: str = ""
    stats: CleanerStats | None = None
    seconds: float = 0.0
    forced: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "log": self.ref.name,
            "path": self.ref.path,
            "status": self.status,
            "reason": self.reason,
            "forced": self.forced,
            "seconds": round(self.seconds, 4),
            "stats": self.stats.to_dict() if self.stats is not None else None,
        }


def needs_writer(config: Any) -> bool:
    """Retention removes segments under the writers' lock: it needs a writer handle."""
    return bool(
        config is not None and (config.deletes_by_retention or config.deletes_when_consumed)
    )


def progress_kwargs(progress: Callable[[int, int], None] | None) -> dict[str, Any]:
    """THE PLACE WHERE THE PROGRESS CALLBACK PLUGS IN.

    ``compact_log(progress=callable(bytes_done, bytes_planned))`` is being added to the
    library; once its signature has the parameter, the service passes it here and nowhere
    else. Until then progress comes from the throttler's byte count (``PassThrottle``).
    """
    if progress is None or "progress" not in inspect.signature(compact_log).parameters:
        return {}
    return {"progress": progress}


def run_pass(
    ref: LogRef,
    *,
    writer: bool,
    force: bool,
    now_ms: int,
    should_abort: Callable[[], bool],
    throttler: Throttler,
    progress: Callable[[int, int], None] | None = None,
    settings: dict[str, Any] | None = None,
) -> PassOutcome:
    """One ``compact_log`` call on ``ref`` (see the module docstring for how it opens), with
    the service's override ``settings`` for this pass (``overrides.py``; never stored)."""
    started = time.monotonic()
    outcome = PassOutcome(ref, "failed", forced=force)
    try:
        log = compactlog.open(ref.path, create=False, read_only=not writer)
        try:
            stats = compact_log(
                log,
                force=force,
                now_ms=now_ms,
                should_abort=should_abort,
                throttler=throttler,
                settings=settings or None,
                **progress_kwargs(progress),
            )
        finally:
            log.close()
    except LogLockedError as error:
        outcome.status, outcome.reason = "busy", str(error)
    except (CompactLogError, OSError) as error:
        outcome.status, outcome.reason = "failed", _describe(error)
    else:
        outcome.stats = stats
        if stats.uncleanable:
            outcome.status, outcome.reason = "uncleanable", stats.uncleanable
        elif stats.aborted:
            outcome.status, outcome.reason = "aborted", stats.skipped or "aborted"
        elif stats.cleaned:
            outcome.status = "cleaned"
        else:
            outcome.status, outcome.reason = "skipped", stats.skipped or ""
            if stats.retention is not None and getattr(stats.retention, "segments_deleted", None):
                outcome.status = "cleaned"  # retention did the work
    outcome.seconds = time.monotonic() - started
    return outcome


def _describe(error: BaseException) -> str:
    if isinstance(error, OSError) and not isinstance(error, CompactLogError):
        where = f"{error.filename}: " if error.filename else ""
        return f"{type(error).__name__}: {where}{error.strerror or error}"
    return f"{type(error).__name__}: {error}"
