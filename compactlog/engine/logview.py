"""What the modules below the facade read of an open log (:class:`compactlog.log.Log`).

``log.py`` imports compaction, recovery, snapshots, subscribers, ``latest`` and the Arrow
tables; they are handed the open log and read a few of its attributes. They name those
attributes here instead of importing ``log.py`` back, so that the import graph has no
cycle (``tests/test_layers.py``). :class:`~compactlog.log.Log` satisfies :class:`LogView`
structurally: nothing subclasses it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..config import LogConfig
    from ..encoding.batch_encode import EncodedBatch
    from ..storage.fsio import FileSystem
    from ..storage.retention import RetentionResult
    from ..storage.segment import TimestampCache
    from ..storage.state_files import Meta
    from .writer import SegmentWriter


class LogView(Protocol):
    """The attributes and methods of an open log that the library's own modules use."""

    directory: str
    fs: FileSystem
    clock: Callable[[], int]
    meta: Meta
    writer: SegmentWriter | None  # None when read-only
    recovery_report: list[str]
    _timestamp_cache: TimestampCache  # compaction's and retention's, kept per log

    @property
    def config(self) -> LogConfig: ...
    @property
    def closed(self) -> bool: ...
    @property
    def end_offset(self) -> int: ...
    @property
    def start_offset(self) -> int: ...

    def reload_meta(self) -> Meta: ...
    def update_meta(self, **changes: Any) -> None: ...
    def cleaner_lock(
        self, *, wait: bool = False, brief: bool = False
    ) -> AbstractContextManager[Any]: ...
    def subscribers(self) -> dict[str, int]: ...
    def append_encoded(self, batches: Sequence[EncodedBatch]) -> range: ...
    def close(self) -> None: ...
    def _enforce_retention_locked(
        self, now: int, config: LogConfig | None = None
    ) -> RetentionResult: ...


__all__ = ["LogView"]
