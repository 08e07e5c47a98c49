"""compactlog: a durable, embeddable, key-compacted changelog store.

>>> import compactlog
>>> with compactlog.open("/tmp/example-log") as log:   # doctest: +SKIP
...     log.append(b"user:1", b'{"name": "Ada"}')
...     log.flush()
...     for record in log.read():
...         print(record.offset, record.key, record.value)
"""

from .config import LogConfig
from .errors import (
    CompactLogError,
    ConfigError,
    CorruptLogError,
    InvalidRecordError,
    LogClosedError,
    LogLockedError,
    MissingSegmentError,
    NotALogError,
    ReadOnlyLogError,
    RecordTooLargeError,
    SubscriberError,
    WriteRefusedError,
)
from .format import FORMAT_VERSION, Record, RecordBatch
from .log import Log, open_log
from .recovery import RepairReport, repair

open = open_log

__all__ = [
    "FORMAT_VERSION",
    "CompactLogError",
    "ConfigError",
    "CorruptLogError",
    "InvalidRecordError",
    "Log",
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
    "SubscriberError",
    "WriteRefusedError",
    "open",
    "repair",
]

__version__ = "0.1.0"
