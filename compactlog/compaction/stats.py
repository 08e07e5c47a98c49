"""What one cleaning pass did: the numbers of Kafka's cleaner log line, plus retention."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

MB = 1024 * 1024  # the summary's unit, MiB (the CLI's progress says MiB too)


@dataclass
class CleanerStats:
    """Statistics of one :func:`~compactlog.compaction.compact_log` call.

    ``cleaned`` is false when the pass was skipped (``skipped`` says why), aborted
    (``aborted``) or found corruption (``uncleanable`` holds the reason, also stored in
    ``meta``). Byte counts are file bytes (compressed bodies as stored).
    """

    cleaned: bool = False
    forced: bool = False
    skipped: str | None = None
    aborted: bool = False
    uncleanable: str | None = None
    now_ms: int = 0
    # selection
    dirty_ratio: float = 0.0
    clean_bytes: int = 0
    dirty_bytes: int = 0
    active_segment_bytes: int = 0  # the active segment's data: never cleaned, in no ratio
    first_dirty_offset: int = 0  # the cleaner point before the pass
    first_uncleanable_offset: int = 0  # active segment or min_compaction_lag_ms bound
    new_first_dirty_offset: int = 0  # the cleaner point after the pass
    # offset map
    map_entries: int = 0
    map_capacity: int = 0
    map_records: int = 0  # dirty-section records fed to the map
    map_bytes_read: int = 0  # dirty-section bytes read to build the map
    verify_bytes_read: int = 0  # bytes whose CRC was checked before any file changed
    map_full: bool = False
    # rewrite
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_retained: int = 0
    records_removed: int = 0
    tombstones_removed: int = 0
    tombstones_retained: int = 0
    batches_dropped: int = 0
    batches_copied: int = 0  # kept whole, byte for byte
    batches_rewritten: int = 0  # lost some records, re-encoded
    batches_merged: int = 0  # small batches whose surviving records went into larger ones
    segments_before: int = 0
    segments_after: int = 0
    groups_swapped: int = 0
    groups_unchanged: int = 0
    # time
    map_seconds: float = 0.0
    clean_seconds: float = 0.0
    elapsed_seconds: float = 0.0
    throttled_seconds: float = 0.0
    # retention run by the same call
    retention: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def map_fill(self) -> float:
        """How full the offset map got: entries / capacity (0.0 when unused)."""
        return self.map_entries / self.map_capacity if self.map_capacity else 0.0

    @property
    def mb_per_second_read(self) -> float:
        """Bytes read per second of the pass, in MiB (2**20 bytes)."""
        return self.bytes_read / MB / self.elapsed_seconds if self.elapsed_seconds else 0.0

    @property
    def mb_per_second_written(self) -> float:
        """Bytes written per second of the pass, in MiB (2**20 bytes)."""
        return self.bytes_written / MB / self.elapsed_seconds if self.elapsed_seconds else 0.0

    @property
    def records_per_second(self) -> float:
        """Records read per second of the pass."""
        return self.records_read / self.elapsed_seconds if self.elapsed_seconds else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The stats as plain JSON-ready values (``compactlog compact --json``)."""
        document = asdict(self)
        retention = self.retention
        if retention is not None and not isinstance(retention, dict):
            document["retention"] = asdict(retention)
        document.update(
            map_fill=self.map_fill,
            mb_per_second_read=self.mb_per_second_read,
            mb_per_second_written=self.mb_per_second_written,
            records_per_second=self.records_per_second,
        )
        return document

    def summary(self, name: str = "log") -> str:
        """Kafka's cleaner log line, adapted."""
        if not self.cleaned:
            why = self.uncleanable or self.skipped or ("aborted" if self.aborted else "not run")
            return f"Cleaner did not clean {name}: {why}"
        total = self.elapsed_seconds or 1e-9
        reduction = 1 - self.bytes_written / self.bytes_read if self.bytes_read else 0.0
        fewer = self.records_removed / self.records_read if self.records_read else 0.0
        return "\n".join(
            [
                f"Cleaner cleaned {name} (dirty section = "
                f"[{self.first_dirty_offset}, {self.new_first_dirty_offset}))",
                f"\t{self.bytes_read / MB:.1f} MiB of log processed in {total:.1f} seconds "
                f"({self.mb_per_second_read:.1f} MiB/sec).",
                f"\tIndexed {self.map_records} records in {self.map_seconds:.1f} seconds "
                f"({100 * self.map_seconds / total:.1f}% of total time)",
                f"\tBuffer utilization: {100 * self.map_fill:.1f}% "
                f"({self.map_entries} of {self.map_capacity} keys)",
                f"\tCleaned {self.records_read} records in {self.clean_seconds:.1f} seconds "
                f"({100 * self.clean_seconds / total:.1f}% of total time)",
                f"\tStart size: {self.bytes_read / MB:.1f} MiB ({self.records_read} messages, "
                f"{self.segments_before} segments)",
                f"\tEnd size: {self.bytes_written / MB:.1f} MiB ({self.records_retained} "
                f"messages, {self.segments_after} segments)",
                f"\t{100 * reduction:.1f}% size reduction ({100 * fewer:.1f}% fewer messages, "
                f"{self.tombstones_removed} tombstones removed)",
            ]
        )
