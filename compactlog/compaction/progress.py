"""Progress of a compaction pass, for a progress bar or the cleaner service's metrics.

A pass has up to three phases, in order: ``"map"`` (reading the dirty section into
the offset map), ``"verify"`` (checking the CRC of batches the map did not read, before any
file changes; often empty) and ``"rewrite"`` (filtering the segments into their cleaned
copies). For each phase that runs, the callback gets a first event with ``bytes_done == 0``
and the bytes the phase plans to read, then an event at least every
:data:`PROGRESS_EVERY_BYTES` bytes read, and a last event with ``bytes_done ==
bytes_planned``. The plan can shrink: the map phase plans the whole dirty section but stops
where the map fills, and its last event then says so (``bytes_planned`` becomes what was
read). Bytes are segment bytes read, so a phase's rate is its read throughput.

The callback runs on the cleaner's thread, between batches: keep it cheap. An exception it
raises stops the pass like any other (the group in progress is removed) and propagates.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

PROGRESS_EVERY_BYTES = 2 << 20
PHASES = ("map", "verify", "rewrite")


@dataclass(frozen=True, slots=True)
class CompactionProgress:
    """One progress event: ``phase`` (``"map"``, ``"verify"`` or ``"rewrite"``), bytes read
    so far in the phase, and the bytes it plans to read."""

    phase: str
    bytes_done: int
    bytes_planned: int

    @property
    def fraction(self) -> float:
        """Share of the phase done, 0.0 to 1.0 (1.0 for an empty phase)."""
        if self.bytes_planned <= 0:
            return 1.0
        return min(self.bytes_done / self.bytes_planned, 1.0)

    def to_dict(self) -> dict[str, object]:
        return {
            "phase": self.phase,
            "bytes_done": self.bytes_done,
            "bytes_planned": self.bytes_planned,
        }


ProgressCallback = Callable[[CompactionProgress], None]


class Meter:
    """Counts a phase's bytes and calls the callback at most every
    :data:`PROGRESS_EVERY_BYTES` (a no-op without a callback)."""

    def __init__(self, callback: ProgressCallback | None) -> None:
        self.callback = callback
        self.phase = ""
        self.done = 0
        self.planned = 0
        self.reported = 0

    def start(self, phase: str, planned: int) -> None:
        self.phase, self.done, self.planned, self.reported = phase, 0, planned, 0
        if self.callback is not None:
            self.callback(CompactionProgress(phase, 0, planned))

    def add(self, nbytes: int) -> None:
        self.done += nbytes
        if self.callback is not None and self.done - self.reported >= PROGRESS_EVERY_BYTES:
            self.reported = self.done
            self.callback(CompactionProgress(self.phase, self.done, max(self.planned, self.done)))

    def finish(self) -> None:
        """The phase's last event: whatever was planned, what was done is all there is."""
        if self.callback is not None:
            self.callback(CompactionProgress(self.phase, self.done, self.done))
