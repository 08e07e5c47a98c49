"""Progress of a restore's long step, for a progress bar or a log.

The Arrow engine (:mod:`compactlog.restore.arrow_restore`) reads every record of the
snapshot once, in offset order, and writes the kept ones: its ``"write"`` phase plans the
offsets of the snapshot to read (an upper bound on records: compaction leaves gaps) and
reports the offsets covered so far. The callback gets a first event with
``records_done == 0``, an event after every chunk read (about 64k records), and a last
event with ``records_done == records_planned``. It runs on the restoring thread: keep it
cheap. The other phases (the snapshot, the plan, the Spark job, the rename into place) are
short or opaque and are told by log lines of the ``compactlog.restore`` logger.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

logger = logging.getLogger("compactlog.restore")


@dataclass(frozen=True, slots=True)
class RestoreStep:
    """One progress event of a restore: ``phase`` (``"write"``), offsets covered so far and
    the offsets it plans to cover."""

    phase: str
    records_done: int
    records_planned: int

    @property
    def fraction(self) -> float:
        """Share of the phase done, 0.0 to 1.0 (1.0 for an empty phase)."""
        if self.records_planned <= 0:
            return 1.0
        return min(self.records_done / self.records_planned, 1.0)

    def to_dict(self) -> dict[str, object]:
        return {
            "phase": self.phase,
            "records_done": self.records_done,
            "records_planned": self.records_planned,
        }


RestoreCallback = Callable[[RestoreStep], None]


class OffsetMeter:
    """Offsets covered of the ranges a phase reads, reported to a callback (a no-op
    without one)."""

    def __init__(self, callback: RestoreCallback | None, phase: str, planned: int) -> None:
        self.callback = callback
        self.phase = phase
        self.planned = planned
        self.done = 0
        if callback is not None:
            callback(RestoreStep(phase, 0, planned))

    def add(self, records: int) -> None:
        self.done = min(self.done + records, self.planned)
        if self.callback is not None:
            self.callback(RestoreStep(self.phase, self.done, self.planned))

    def finish(self) -> None:
        """The last event: all that was planned is covered."""
        if self.callback is not None and self.done < self.planned:
            self.done = self.planned
            self.callback(RestoreStep(self.phase, self.done, self.planned))


__all__ = ["OffsetMeter", "RestoreCallback", "RestoreStep", "logger"]
