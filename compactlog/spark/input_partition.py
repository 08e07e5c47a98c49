"""One Spark task's share of a read of one log: offsets ``[start, end)``.

Used by the batch reader (``source.py``) and the stream reader (``stream.py``: a
micro-batch task is a batch task). Spark pickles it by reference into every Python worker,
so this module, like ``source.py``, has no import-time side effects.
"""

from __future__ import annotations

from pyspark.sql.datasource import InputPartition


class CompactLogPartition(InputPartition):
    """One task's offsets ``[start, end)`` of the snapshot being read."""

    def __init__(self, index: int, start: int, end: int) -> None:
        super().__init__(index)
        self.index = index
        self.start = start
        self.end = end

    def __repr__(self) -> str:
        return f"CompactLogPartition({self.index}, offsets {self.start}..{self.end})"


__all__ = ["CompactLogPartition"]
