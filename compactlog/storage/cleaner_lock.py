"""``.cleaner.lock``: the lock held by the one process cleaning (or pruning) a log."""

from __future__ import annotations

import os
import time

from ..errors import LogLockedError
from . import filenames, lockfile


class CleanerLock:
    """``.cleaner.lock``: held by the one process cleaning (or pruning) a log.

    A crashed holder's lock goes with its process (``flock``), so it never blocks forever.
    A *brief* holder (``brief=True``: the archiver's capture of its durable view) keeps it
    for milliseconds and says so in its stamp; a pass that finds one waits for it, up to
    :data:`BRIEF_PATIENCE_S`, instead of failing. Any other holder (another cleaner, a
    retention run, a snapshot linking its segments) refuses it at once, as before.
    """

    def __init__(self, directory: str, *, wait: bool = False, brief: bool = False) -> None:
        self.directory = directory
        self.wait = wait
        self.brief = brief
        self.fd = -1

    def __enter__(self) -> CleanerLock:
        path = os.path.join(self.directory, filenames.CLEANER_LOCK)
        deadline = time.monotonic() + BRIEF_PATIENCE_S
        note = BRIEF_HOLDER if self.brief else ""
        while True:
            try:
                self.fd = lockfile.lock(path, wait=self.wait, note=note)
                return self
            except lockfile.LockHeld as held:
                if not _brief_or_unstamped(held.holder) or time.monotonic() >= deadline:
                    raise LogLockedError(
                        "another cleaner is working on this log "
                        f"({held.holder or 'another process'})",
                        path=self.directory,
                    ) from None
            time.sleep(0.005)

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            lockfile.release(self.fd)
            self.fd = -1


BRIEF_HOLDER = "brief"  # the stamp's note of a holder that keeps the lock for milliseconds
BRIEF_PATIENCE_S = 2.0  # how long a pass waits for brief holders before it is refused


def _brief_or_unstamped(holder: str) -> bool:
    """A holder worth waiting for: one that said it is brief, or one that has taken the
    lock but not written its stamp yet (microseconds; its stamp decides next time)."""
    return not holder or holder.split()[2:] == [BRIEF_HOLDER]
