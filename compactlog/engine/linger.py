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

import threading
import time
from collections.abc import Iterator
from typing import Any

from ..config import LogConfig
from ..encoding.batch_encode import EncodedBatch, OneRecord, encode_batch, split_points
from ..encoding.format import BATCH_HEADER


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
        self.headers: list[bytes] = []  # encoded blocks (``b""``: none)

    @property
    def count(self) -> int:
        return len(self.keys)

    def start(self, first_offset: int, now: float) -> None:
        self.first_offset = first_offset
        self.started = now

    def append(self, record: OneRecord) -> int:
        """Buffer one record; returns its offset."""
        key, value, timestamp, headers = record
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


class LingerAppends:
    """The writer's linger path (a part of ``SegmentWriter``, which the mixin joins):
    buffering single appends into :class:`LingerBuffer` under the writers' lock, and
    writing the buffer as batches; also how buffered records (linger, precommit) become
    batches."""

    # what the linger path uses of the writer (and the writer's methods it calls:
    # _check_open, _flocked, _check_space, _refusal, _write_locked, _publish_head,
    # _materialize_locked, sync_all)
    config: LogConfig
    lock: threading.Lock
    closed: bool
    sync_failed: OSError | None
    end_offset: int
    write_seq: int
    linger: LingerBuffer | None
    precommit: Any
    _holding_for_linger: bool
    _sync_always: bool
    _kick: threading.Event

    def append_linger(self, record: OneRecord) -> int:
        """Buffer one checked record in memory (``linger.py``); returns its offset.

        The first buffered record takes the writers' lock, kept until the buffer is
        written, so the offsets handed out are final."""
        buffer = self.linger
        assert buffer is not None
        with self.lock:
            if self.closed or self.sync_failed is not None:
                self._check_open()
            if not buffer.count:
                try:
                    with self._flocked():
                        if self.precommit is not None and self.precommit.count:
                            self._materialize_locked()
                        self._check_space(BATCH_HEADER.size)
                        self._holding_for_linger = True
                except OSError as error:
                    raise self._refusal(error) from error
                buffer.start(self.end_offset, time.monotonic())
                offset = buffer.append(record)
                self._kick.set()  # the interval thread sleeps while the buffer is empty
            else:
                offset = buffer.append(record)
            if buffer.count >= self.config.batch_records or buffer.byte_count >= (
                self.config.segment_bytes // 2
            ):
                self._flush_linger_or_refuse()
        return offset

    def flush_linger(self, *, older_than: float = 0.0) -> None:
        """Write the linger buffer if it holds records buffered ``older_than`` seconds ago."""
        buffer = self.linger
        if buffer is None or not buffer.count:
            return
        with self.lock:
            if self.closed or self.sync_failed is not None:
                return
            if not buffer.count or time.monotonic() - buffer.started < older_than:
                return
            self._flush_linger_or_refuse()
        if self._sync_always:
            self.sync_all()  # the timer's write is as durable as any other under "always"

    def _flush_linger_or_refuse(self) -> None:
        try:
            with self._flocked():
                self._flush_linger_locked()
        except OSError as error:
            raise self._refusal(error) from error

    def _flush_linger_locked(self) -> None:
        """Write the buffered records as batches (caller holds both locks), then let the
        writers' lock go. On a failed write the records not yet written stay buffered (and
        their offsets stay reserved) for the next flush to retry."""
        buffer = self.linger
        assert buffer is not None
        count = buffer.count
        if count:
            written = 0
            try:
                for written_to, batch in self._encode_in_batches(
                    buffer.keys,
                    buffer.values,
                    buffer.timestamps,
                    buffer.headers if any(buffer.headers) else None,
                    buffer.byte_count,
                ):
                    self._write_locked(batch)
                    written = written_to
            finally:
                if written:
                    self.write_seq += 1
                    self._publish_head()
                    if written < count:
                        buffer.drop_first(written)
            buffer.clear()
        self._holding_for_linger = False

    def _encode_in_batches(
        self,
        keys: list[bytes | None],
        values: list[bytes | None],
        timestamps: list[int],
        header_blocks: list[bytes] | None,
        raw_bytes: int,
    ) -> Iterator[tuple[int, EncodedBatch]]:
        """Buffered records (linger, precommit) as batches, each with the index just past
        its last record: one batch, or, when the buffer held more than half a segment
        (``raw_bytes``), the batches :func:`split_points` cuts, so segments still roll near
        ``segment_bytes``. Encoded one at a time, as they are written."""
        config = self.config
        cuts = [(0, len(keys))]
        if raw_bytes > config.segment_bytes // 2:
            sizes = [len(k or b"") + len(v or b"") for k, v in zip(keys, values, strict=True)]
            cuts = split_points(sizes, config.segment_bytes)
        codec = 1 if config.compression == "zstd" else 0
        for lo, hi in cuts:
            yield (
                hi,
                encode_batch(
                    keys[lo:hi],
                    values[lo:hi],
                    timestamps[lo:hi],
                    header_blocks=header_blocks[lo:hi] if header_blocks is not None else None,
                    codec=codec,
                    level=config.compression_level,
                ),
            )
