"""Which directory is which: one log, or a table of ``partition-<N>`` logs.

Apart from :mod:`compactlog.spark.partitioned` (the reader and writer of such tables) so
that the data source's schema and a stream's set-up can tell the two apart without
importing the writer and pyarrow's compute kernels: Spark runs both in Python processes it
starts for each query.
"""

from __future__ import annotations

import os
import re

from . import filenames

PARTITION_PREFIX = "partition-"
PARTITION_COLUMN = "partition"
_NAME = re.compile(r"^partition-(\d+)$")


def partition_dir(table: str, index: int) -> str:
    return os.path.join(table, f"{PARTITION_PREFIX}{index}")


def list_partitions(table: str) -> list[tuple[int, str]]:
    """``(partition number, log directory)`` of every log in ``table``, by number."""
    if not os.path.isdir(table):
        return []
    found = []
    for name in os.listdir(table):
        match = _NAME.match(name)
        directory = os.path.join(table, name)
        if match and os.path.exists(os.path.join(directory, filenames.META)):
            found.append((int(match.group(1)), directory))
    return sorted(found)


def is_partitioned(path: str) -> bool:
    """A directory of logs (and not itself a log)."""
    return not os.path.exists(os.path.join(path, filenames.META)) and bool(list_partitions(path))


__all__ = [
    "PARTITION_COLUMN",
    "PARTITION_PREFIX",
    "is_partitioned",
    "list_partitions",
    "partition_dir",
]
