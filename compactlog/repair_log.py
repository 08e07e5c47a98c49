"""``compactlog.repair(path)``: recovery's file fixes, then an open of the log.

:func:`compactlog.engine.recovery.repair` fixes the files with the writers' lock held and then
needs the open-time passes (tail validation, a dead writer's precommit), which only an
open :class:`~compactlog.log.Log` runs. ``recovery.py`` sits below ``log.py`` and does not
import it, so the open is handed in from here, above both.
"""

from __future__ import annotations

import os

from .engine.recovery import RepairReport
from .engine.recovery import repair as _repair_files
from .errors import ReadOnlyLogError
from .log import Log
from .storage.state_files import REPLICA_ADVICE, replica_of


def _open_time_passes(directory: str) -> list[str]:
    with Log(directory) as log:
        return log.recovery_report


def repair(
    path: str | os.PathLike[str],
    *,
    dry_run: bool = False,
    rebuild_meta: bool = False,
    meta_from: str | os.PathLike[str] | None = None,
) -> RepairReport:
    """``jlogctl repair``: fix what can be fixed without deleting a valid batch.

    Stop writers first (the writers' lock is taken, so concurrent appends wait). A log that
    an ``exclusive=True`` writer holds is refused at once:
    :class:`~compactlog.errors.LogLockedError` names its pid. An archive replica is refused
    (:class:`~compactlog.errors.ReadOnlyLogError`): its follower alone writes it, from the
    archive.
    ``rebuild_meta``: a missing or unreadable ``meta`` is rebuilt from what the damaged file
    and the segments still say, naming the settings it could not recover (without it, such
    a log is refused). ``meta_from``: a snapshot or backup of this log whose ``meta``
    supplies the settings the damaged one no longer shows (implies ``rebuild_meta``).
    """
    replica = replica_of(os.fspath(path))
    if replica is not None:
        raise ReadOnlyLogError(
            f"is a replica of {replica.get('url')}; {REPLICA_ADVICE}", path=os.fspath(path)
        )
    return _repair_files(
        path,
        dry_run=dry_run,
        open_passes=_open_time_passes,
        rebuild_meta=rebuild_meta or meta_from is not None,
        meta_from=None if meta_from is None else os.fspath(meta_from),
    )


__all__ = ["RepairReport", "repair"]
