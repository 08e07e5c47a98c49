"""Spark integration: ``spark.read.format("compactlog")`` and restores (``restore.py``).

Nothing here imports pyspark at import time, so the core library works without Spark. The
data source classes live in :mod:`compactlog.spark.source` (imported by Spark's Python
workers, so it has no import-time side effects); planning and partitioning are in
:mod:`~compactlog.restore.plan`, the Arrow conversion from ``batch_decode``'s columns in
:mod:`~compactlog.spark.arrow`. PySpark also finds the source with no call at all through
the top-level ``pyspark_compactlog`` module (its ``DefaultSource``).
"""

from __future__ import annotations

from typing import Any

from .session import register

SOURCE_NAME = "compactlog"


def restore(*args: Any, **kwargs: Any) -> Any:
    """See :func:`compactlog.spark.restore.restore`."""
    from .restore import restore as _restore

    return _restore(*args, **kwargs)


__all__ = ["SOURCE_NAME", "register", "restore"]
