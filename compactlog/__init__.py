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

from .config import LogConfig
from .errors import (
    CompactionError,
    CompactionWriteError,
    CompactLogError,
    ConfigError,
    CorruptLogError,
    DecodeError,
    DiskFullError,
    InvalidArgumentError,
    InvalidRecordError,
    LogCheckError,
    LogClosedError,
    LogLockedError,
    MissingSegmentError,
    NotALogError,
    ReadOnlyLogError,
    RecordTooLargeError,
    SettingIgnoredWarning,
    SubscriberBusyError,
    SubscriberError,
    UnsafeChangeError,
    WriteRefusedError,
)

if TYPE_CHECKING:
    from .batch_decode import Record, RecordBatch
    from .compaction.stats import CleanerStats
    from .format import FORMAT_VERSION
    from .log import Log
    from .log import open_log as open
    from .recovery import RepairReport
    from .repair_log import repair
    from .snapshot import Snapshot
    from .subscriber import Subscriber
    from .table import Table

_LAZY = {
    "FORMAT_VERSION": ("format", "FORMAT_VERSION"),
    "Record": ("batch_decode", "Record"),
    "RecordBatch": ("batch_decode", "RecordBatch"),
    "CleanerStats": ("compaction.stats", "CleanerStats"),
    "Log": ("log", "Log"),
    "Snapshot": ("snapshot", "Snapshot"),
    "Subscriber": ("subscriber", "Subscriber"),
    "open": ("log", "open_log"),
    "RepairReport": ("recovery", "RepairReport"),
    "Table": ("table", "Table"),
    "repair": ("repair_log", "repair"),
}


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
    "CleanerStats",
    "CompactLogError",
    "CompactionError",
    "CompactionWriteError",
    "ConfigError",
    "CorruptLogError",
    "DecodeError",
    "DiskFullError",
    "InvalidArgumentError",
    "InvalidRecordError",
    "Log",
    "LogCheckError",
    "LogClosedError",
    "LogConfig",
    "LogLockedError",
    "MissingSegmentError",
    "NotALogError",
    "ReadOnlyLogError",
    "Record",
    "RecordBatch",
    "RecordTooLargeError",
    "RepairReport",
    "SettingIgnoredWarning",
    "Snapshot",
    "Subscriber",
    "SubscriberBusyError",
    "SubscriberError",
    "Table",
    "UnsafeChangeError",
    "WriteRefusedError",
    "open",
    "repair",
]

__version__ = "0.1.0"
