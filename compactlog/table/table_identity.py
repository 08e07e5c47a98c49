"""Whether a table's state still is a state of its log: the resume-or-rebuild decision.

A disk table (``table_disk.py``) keeps its state between runs and resumes from the offset
it committed. That is right only if the log still holds everything the state lacks. Each
rule below names what would otherwise be served wrongly; the first that applies is the
reason for a rebuild (logged, and counted in ``Table.rebuilds``):

1. **Another log.** The state records the id of the log it was built from
   (``log_identity.py``); a different id means the state directory was used with another
   log (state dir S with log B, then A, then B again would serve keys of both). The
   table rebuilds, or refuses with :class:`~compactlog.errors.ForeignTableStateError`
   (``foreign_state="error"``). A state that records no id (made by an older compactlog)
   cannot be told apart from another log's: it is rebuilt once.
2. **A recreated log.** The log holds no checkpoint of the table's durable subscriber, or
   ends below the state's offset.
3. **Retention** removed offsets the state never saw (the log start passed its offset).
4. **Expired deletes.** The cleaner removed a tombstone at or past the state's offset
   (``delete_retention_ms`` passed while the table was down): the state would keep the
   deleted key for good. ``cleaner.checkpoint``'s ``tombstone_horizon`` bounds the
   offsets of every tombstone ever removed (raised *before* the swap that removes one);
   a state below it rebuilds. When the horizon is not known (a ``cleaner.checkpoint`` of
   an older compactlog) the cleaner point stands in for it, which is safe: a pass removes
   only tombstones below the point it starts from.

Rule 4 also holds while a table follows: a follower that falls more than
``delete_retention_ms`` behind (a stopped process) could read past a removed tombstone.
:class:`HorizonWatch` tells it, at the cost of one ``stat`` per poll.
"""

from __future__ import annotations

import os

from ..storage import filenames
from ..storage.state_files import read_cleaner_state

FOREIGN_STATE_POLICIES = ("rebuild", "error")
RECHECK_S = 1.0  # a follower reads cleaner.checkpoint at least this often


def foreign_reason(state_log_id: str | None, log_id: str | None) -> str | None:
    """Rule 1: why the state is not this log's (``None``: it is, or the log has no id)."""
    if log_id is None:
        return None  # (a log that cannot be given an id: rules 2-4 still apply)
    if state_log_id is None:
        return (
            "the state records no log id (made by an older compactlog): it cannot be told "
            "apart from another log's state"
        )
    if state_log_id != log_id:
        return f"the state was built from another log (log id {state_log_id}, this log {log_id})"
    return None


def stale_reason(offset: int, marked: bool, start: int, end: int, horizon: int) -> str | None:
    """Rules 2-4: why a state of this log committed at ``offset`` cannot be resumed from
    (``marked``: the log holds the table's subscriber checkpoint; ``horizon``: the log's
    tombstone horizon, :func:`tombstone_horizon`)."""
    if not marked:
        return (
            "the log holds no checkpoint of this table's subscriber: it was recreated "
            "(or the subscriber was removed)"
        )
    if offset > end:
        return f"the log ends at {end}, below the state's offset {offset} (recreated)"
    if start > offset:
        return f"retention removed offsets {offset}..{start - 1}, which the state never saw"
    if horizon > offset:
        return (
            f"the cleaner removed expired tombstones below offset {horizon}, past the "
            f"state's offset {offset} (delete_retention_ms passed while it was behind)"
        )
    return None


def tombstone_horizon(directory: str) -> int:
    """Every tombstone the cleaner removed from the log had an offset below this."""
    return read_cleaner_state(directory).horizon()


class HorizonWatch:
    """The tombstone horizon of one log, for a follower: :meth:`missed` after each poll.

    ``cleaner.checkpoint`` is read again when its ``stat`` changed (it is replaced by a
    rename on every write), and at least every :data:`RECHECK_S` whatever ``stat`` says (two
    writes within one timestamp tick can reuse an inode number and size); a late read is
    compared with the oldest offset polled since the last read, so nothing slips by."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, filenames.CLEANER_CHECKPOINT)
        self.directory = directory
        self._seen: tuple[int, ...] | None = None
        self._read_at = -RECHECK_S
        self._oldest: int | None = None  # the oldest offset polled since the last read
        self.horizon = 0

    def missed(self, before: int, now: float) -> int | None:
        """The horizon if it passed an offset the follower polled from since the last
        read (``before``: this poll's first offset; ``now``: ``time.monotonic()``), that is
        if the cleaner may have removed a tombstone the follower did not see."""
        if self._oldest is None or before < self._oldest:
            self._oldest = before
        try:
            st = os.stat(self.path)
            seen: tuple[int, ...] = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
        except FileNotFoundError:
            seen = ()
        if seen == self._seen and now - self._read_at < RECHECK_S:
            return None
        self._seen, self._read_at = seen, now
        if seen:
            self.horizon = max(self.horizon, tombstone_horizon(self.directory))
        oldest, self._oldest = self._oldest, None
        return self.horizon if self.horizon > oldest else None


__all__ = [
    "FOREIGN_STATE_POLICIES",
    "RECHECK_S",
    "HorizonWatch",
    "foreign_reason",
    "stale_reason",
    "tombstone_horizon",
]
