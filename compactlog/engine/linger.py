"""The producer-side linger buffer: single appends collected in memory, written as one batch.

Kafka's producer ``linger.ms`` / ``batch.size``, for applications that accept losing the last
few milliseconds of appends when the process dies. With ``linger_ms > 0`` a single
``append`` only stores the record here and returns its offset; the writer turns the buffer
into one batch on ``flush()``, ``close()``, any other write or maintenance operation, when
``batch_records`` are waiting, or ``linger_ms`` after the first of them.

The offsets are final when ``append`` returns: the writer holds the writers' lock from the
first buffered record until the buffer is written, exactly as with the precommit buffer, so
no other writer (in any process) can take them; other writers wait at most ``linger_ms``.

**Not crash-safe, by design**: a record here is in this process's memory only. A ``kill -9``
loses every record not yet flushed, and nothing else: the log on disk is untouched until the
flush, whose batch write follows the ordinary crash protocol (``writer.py``). Records are
invisible to readers (this process's included) until flushed. ``precommit_bytes`` is the
crash-safe way to cheap single appends.
"""

from __future__ import annotations

from collections.abc import Mapping


class LingerBuffer:
    """Records waiting to be written, as columns. Not thread-safe: the writer calls it under
    its lock."""

    __slots__ = ("byte_count", "first_offset", "headers", "keys", "started", "timestamps", "values")

    def __init__(self) -> None:
        self.first_offset = 0
        self.started = 0.0  # time.monotonic() of the first buffered record
        self.byte_count = 0
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.timestamps: list[int] = []
        self.headers: list[Mapping[str, bytes] | None] = []

    @property
    def count(self) -> int:
        return len(self.keys)

    def start(self, first_offset: int, now: float) -> None:
        self.first_offset = first_offset
        self.started = now

    def append(
        self,
        key: bytes | None,
        value: bytes | None,
        timestamp: int,
        headers: Mapping[str, bytes] | None,
    ) -> int:
        """Buffer one record; returns its offset."""
        keys = self.keys
        offset = self.first_offset + len(keys)
        keys.append(key)
        self.values.append(value)
        self.timestamps.append(timestamp)
        self.headers.append(headers)
        self.byte_count += (0 if key is None else len(key)) + (0 if value is None else len(value))
        return offset

    def drop_first(self, count: int) -> None:
        """Forget the first ``count`` records (they were written)."""
        del self.keys[:count], self.values[:count], self.timestamps[:count], self.headers[:count]
        self.first_offset += count
        self.byte_count = sum(map(_size, self.keys)) + sum(map(_size, self.values))

    def clear(self) -> None:
        self.keys.clear()
        self.values.clear()
        self.timestamps.clear()
        self.headers.clear()
        self.byte_count = 0


def _size(item: bytes | None) -> int:
    return 0 if item is None else len(item)
