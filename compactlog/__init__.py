"""compactlog: a durable, embeddable, key-compacted changelog store.

>>> import compactlog
>>> with compactlog.open("/tmp/example-log") as log:   # doctest: +SKIP
...     log.append(b"user:1", b'{"name": "Ada"}')
...     log.flush()
...     for record in log.read():
...         print(record.offset, record.key, record.value)

The heavy modules (numpy, zstandard) load on first use of ``open``, ``repair`` and the other
names below, so that importing the package (and starting the CLI) stays fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import _old_paths
from .config import LogConfig
from .errors import (
    ArchiveError,
    CompactionError,
    CompactionWriteError,
    CompactLogError,
    ConfigError,
    CorruptLogError,
    DdlError,
    DecodeError,
    DiskFullError,
    ForeignTableStateError,
    InexactReadError,
    InvalidArgumentError,
    InvalidRecordError,
    LeaseHeldError,
    LeaseLostError,
    LogCheckError,
    LogClosedError,
    LogLockedError,
    MissingSegmentError,
    NoManifestError,
    NotALogError,
    ObjectCorruptError,
    ObjectMissingError,
    ReadOnlyLogError,
    RecordTooLargeError,
    RestoreTargetError,
    SettingIgnoredWarning,
    SnapshotError,
    SparkUnavailableError,
    StagedFileError,
    StoreError,
    SubscriberBusyError,
    SubscriberError,
    TableError,
    TableFullError,
    TableStateCorruptError,
    UnsafeChangeError,
    ValueDecodeError,
    WriteRefusedByModeError,
    WriteRefusedError,
)

if TYPE_CHECKING:
    from .compaction.stats import CleanerStats
    from .encoding.batch_decode import Record, RecordBatch
    from .encoding.format import FORMAT_VERSION
    from .engine.recovery import RepairReport
    from .engine.snapshot import Snapshot
    from .engine.subscriber import Subscriber
    from .log import Log
    from .log import open_log as open
    from .repair_log import repair
    from .table.table import Table

_LAZY = {
    "FORMAT_VERSION": ("encoding.format", "FORMAT_VERSION"),
    "Record": ("encoding.batch_decode", "Record"),
    "RecordBatch": ("encoding.batch_decode", "RecordBatch"),
    "CleanerStats": ("compaction.stats", "CleanerStats"),
    "Log": ("log", "Log"),
    "Snapshot": ("engine.snapshot", "Snapshot"),
    "Subscriber": ("engine.subscriber", "Subscriber"),
    "open": ("log", "open_log"),
    "RepairReport": ("engine.recovery", "RepairReport"),
    "Table": ("table.table", "Table"),
    "repair": ("repair_log", "repair"),
}

_old_paths.install()


def __getattr__(name: str) -> Any:
    try:
        module_name, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'compactlog' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f".{module_name}", __name__), attribute)
    globals()[name] = value
    return value


__all__ = [
    "FORMAT_VERSION",
    "ArchiveError",
    "CleanerStats",
    "CompactLogError",
    "CompactionError",
    "CompactionWriteError",
    "ConfigError",
    "CorruptLogError",
    "DdlError",
    "DecodeError",
    "DiskFullError",
    "ForeignTableStateError",
    "InexactReadError",
    "InvalidArgumentError",
    "InvalidRecordError",
    "LeaseHeldError",
    "LeaseLostError",
    "Log",
    "LogCheckError",
    "LogClosedError",
    "LogConfig",
    "LogLockedError",
    "MissingSegmentError",
    "NoManifestError",
    "NotALogError",
    "ObjectCorruptError",
    "ObjectMissingError",
    "ReadOnlyLogError",
    "Record",
    "RecordBatch",
    "RecordTooLargeError",
    "RepairReport",
    "RestoreTargetError",
    "SettingIgnoredWarning",
    "Snapshot",
    "SnapshotError",
    "SparkUnavailableError",
    "StagedFileError",
    "StoreError",
    "Subscriber",
    "SubscriberBusyError",
    "SubscriberError",
    "Table",
    "TableError",
    "TableFullError",
    "TableStateCorruptError",
    "UnsafeChangeError",
    "ValueDecodeError",
    "WriteRefusedByModeError",
    "WriteRefusedError",
    "open",
    "repair",
]

__version__ = "0.1.0"
