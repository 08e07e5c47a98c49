"""Tables: a log's latest state kept in memory (``table_memory``, ``table_frozen``) or on
disk (``table_disk``), restored and followed by :class:`~compactlog.table.table.Table`.

docs/tables.md.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    # ``from compactlog.table import Table`` as before ``table/`` was a folder, without
    # importing the table (and the log) for a module of this package
    if name == "Table":
        from .table import Table

        return Table
    raise AttributeError(f"module 'compactlog.table' has no attribute {name!r}")
