"""JLog's precommit buffer: an mmap'ed ``pre_commit`` file that single appends go to.

An entry written here survives a killed process (the page cache holds it), costs no system
call, and is invisible to readers until it is *materialized*: encoded as one batch and
appended to the active segment, on ``flush()``, when the buffer fills, on the sync interval,
or by the next writer to take the lock after this process died.

The process owning the buffer holds the writers' lock from its first buffered append until
the buffer is materialized, so the offsets it hands out stay valid.

Crash protocol of :meth:`PrecommitBuffer.append` and materialization:

1. An entry is written after the previous one; its CRC makes a half-written entry invalid,
   and parsing stops at the first invalid entry or at an offset that does not follow on.
2. Materializing appends the batch to the segment first, then zeroes the first entry's
   length. A crash between the two leaves entries whose offsets are below the log end:
   the next materialization skips them, so nothing is written twice.
"""

from __future__ import annotations

import mmap
import os
import threading
from dataclasses import dataclass
from typing import Any

from ..encoding.batch_encode import OneRecord
from ..encoding.format import (
    FILE_HEADER,
    PRECOMMIT_ENTRY,
    PRECOMMIT_FIELDS,
    PRECOMMIT_FILE_HEADER,
    PRECOMMIT_LENGTH_CRC,
    PRECOMMIT_MAGIC,
    check_file_header,
    crc32c,
)
from ..storage import filenames

DATA_START = FILE_HEADER.size


@dataclass
class PendingEntries:
    offsets: list[int]
    keys: list[bytes | None]
    values: list[bytes | None]
    timestamps: list[int]
    headers: list[bytes]  # encoded blocks (``b""``: none)


class PrecommitBuffer:
    """The mmap'ed buffer. Not thread-safe: the writer calls it under its lock."""

    def __init__(self, path: str, capacity: int) -> None:
        self.path = path
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                os.pwrite(fd, PRECOMMIT_FILE_HEADER, 0)
            else:
                problem = check_file_header(os.pread(fd, FILE_HEADER.size, 0), PRECOMMIT_MAGIC)
                if problem:
                    from ..errors import NotALogError

                    raise NotALogError(problem, path=path)
            capacity = max(capacity, size, DATA_START + 4096)
            if size < capacity:
                os.ftruncate(fd, capacity)
            self.map = mmap.mmap(fd, capacity)
        finally:
            os.close(fd)
        self.capacity = capacity
        self.position = DATA_START
        self.count = 0
        self.bytes_pending = 0
        # what this process appended since the last clear, so that materializing does not
        # re-parse the mmap it just wrote (the mmap is parsed only after a crash)
        self._forget_mirror()

    def close(self) -> None:
        self.map.close()

    def room_for(self, payload_length: int) -> bool:
        return self.position + PRECOMMIT_ENTRY.size + payload_length + 4 <= self.capacity

    def append(
        self,
        offset: int,
        record: OneRecord,
    ) -> None:
        """Write one entry (the caller checked :meth:`room_for`).

        The entry and a zeroed length after it (so a parse never runs into a stale entry)
        go in with one copy; a process killed mid-copy leaves an entry whose CRC fails.
        """
        key, value, timestamp, headers = record
        key_length = -1 if key is None else len(key)
        value_length = -1 if value is None else len(value)
        keys = self._keys
        if not keys:
            self._first_offset = offset
        keys.append(key)
        self._values.append(value)
        self._timestamps.append(timestamp)
        if headers:
            self._headers[len(keys) - 1] = headers
        payload = b"".join(
            (
                PRECOMMIT_FIELDS.pack(offset, timestamp, key_length, value_length, len(headers)),
                key or b"",
                value or b"",
                headers,
            )
        )
        length = 8 + len(payload)
        start = self.position
        self.map[start : start + length + 4] = b"".join(
            (PRECOMMIT_LENGTH_CRC.pack(length, crc32c(payload)), payload, b"\0\0\0\0")
        )
        self.position = start + length
        self.count += 1
        self.bytes_pending += length

    def pending(self) -> PendingEntries:
        """The entries to materialize: this process's own, or those parsed from the file
        when another (dead) process wrote them."""
        count = len(self._keys)
        if self.count and count == self.count:
            first = self._first_offset
            headers = self._headers
            return PendingEntries(
                list(range(first, first + count)),
                self._keys,
                self._values,
                self._timestamps,
                [headers.get(i, b"") for i in range(count)] if headers else [b""] * count,
            )
        return self.entries()

    def unwritten(self, end_offset: int) -> PendingEntries:
        """The pending entries from ``end_offset`` on (the log's end: entries below it were
        written before a crash cut materialization short, step 2 above); none if they do not
        start exactly there."""
        entries = self.pending()
        offsets = entries.offsets
        skip = 0
        while skip < len(offsets) and offsets[skip] < end_offset:
            skip += 1
        if skip == len(offsets) or offsets[skip] != end_offset:
            return PendingEntries([], [], [], [], [])
        if skip == 0:
            return entries
        return PendingEntries(
            offsets[skip:],
            entries.keys[skip:],
            entries.values[skip:],
            entries.timestamps[skip:],
            entries.headers[skip:],
        )

    def entries(self) -> PendingEntries:
        """Parse the valid entries with consecutive offsets from the start of the buffer."""
        mem = self.map
        pos = DATA_START
        result = PendingEntries([], [], [], [], [])
        expected: int | None = None
        while pos + PRECOMMIT_ENTRY.size <= self.capacity:
            length, crc = PRECOMMIT_LENGTH_CRC.unpack_from(mem, pos)
            if length < PRECOMMIT_ENTRY.size or pos + length > self.capacity:
                break
            payload = mem[pos + 8 : pos + length]
            if crc32c(payload) != crc:
                break
            offset, timestamp, key_len, value_len, header_len = PRECOMMIT_FIELDS.unpack_from(
                payload
            )
            if expected is not None and offset != expected:
                break
            cursor = PRECOMMIT_FIELDS.size
            key = None
            if key_len >= 0:
                key = payload[cursor : cursor + key_len]
                cursor += key_len
            value = None
            if value_len >= 0:
                value = payload[cursor : cursor + value_len]
                cursor += value_len
            result.offsets.append(offset)
            result.keys.append(key)
            result.values.append(value)
            result.timestamps.append(timestamp)
            result.headers.append(payload[cursor : cursor + header_len])
            expected = offset + 1
            pos += length
        return result

    def _forget_mirror(self) -> None:
        self._first_offset = 0
        self._keys: list[bytes | None] = []
        self._values: list[bytes | None] = []
        self._timestamps: list[int] = []
        self._headers: dict[int, bytes] = {}

    def clear(self) -> None:
        self.map[DATA_START : DATA_START + 4] = b"\0\0\0\0"
        self.position = DATA_START
        self.count = 0
        self.bytes_pending = 0
        self._forget_mirror()


class PrecommitAppends:
    """The writer's precommit path (a part of ``SegmentWriter``, which the mixin joins):
    buffering records into the crash-safe :class:`PrecommitBuffer`, and materializing
    them into the log, ours or those a stopped writer left."""

    # what the precommit path uses of the writer (and the writer's methods it calls:
    # _check_open, _flocked, _check_space, _publish_head, _write_locked,
    # _flush_linger_or_refuse, _encode_in_batches)
    directory: str
    lock: threading.Lock
    closed: bool
    sync_failed: OSError | None
    end_offset: int
    write_seq: int
    linger: Any
    precommit: PrecommitBuffer | None
    plain_single: bool
    steady: bool
    precommit_recovered: int
    _holding_for_precommit: bool

    def append_precommit(self, record: OneRecord) -> int:
        """Buffer one record; returns its offset, or -1 if it is larger than the buffer."""
        buffer = self.precommit
        assert buffer is not None
        key, value, _, headers = record
        payload = len(key or b"") + len(value or b"") + len(headers)
        with self.lock:
            if self.closed or self.sync_failed is not None:
                self._check_open()
            if not buffer.room_for(payload):
                with self._flocked():
                    self._materialize_locked()
                if not buffer.room_for(payload):
                    return -1  # larger than the buffer: the caller writes it directly
            if not self._holding_for_precommit:
                with self._flocked():
                    self._check_space(payload)
                    self._holding_for_precommit = True
                    self._publish_head()
            offset = self.end_offset + buffer.count
            buffer.append(offset, record)
            return offset

    def materialize(self) -> None:
        if self.linger is not None and self.linger.count:
            with self.lock:
                if not self.closed and self.sync_failed is None and self.linger.count:
                    self._flush_linger_or_refuse()
        if self.precommit is None:
            return
        with self.lock:
            if self.closed or self.sync_failed is not None:
                return  # after a failed fsync the entries wait in the buffer for a reopen
            if self.precommit.count or self._holding_for_precommit:
                with self._flocked():
                    self._materialize_locked()

    def materialize_left_pending(self) -> None:
        """Open-time recovery's pass 6 (caller holds both locks): entries still in the
        precommit buffer at open belong to a stopped writer, flagged in the head or not;
        write them (those already in the log are skipped), counted in
        ``precommit_recovered``."""
        buffer = self.precommit
        if buffer is not None and not self._holding_for_precommit and buffer.entries().offsets:
            self.precommit_recovered += self._materialize_locked()

    def _materialize_locked(self) -> int:
        """Turn pending precommit entries into batches (caller holds both locks). Returns
        how many entries were written (entries already in the log are skipped)."""
        buffer = self.precommit
        if buffer is None:
            path = os.path.join(self.directory, filenames.PRECOMMIT)
            buffer = self.precommit = PrecommitBuffer(path, 0)
            self.plain_single = self.steady = False
        entries = buffer.unwritten(self.end_offset)
        written = len(entries.offsets)
        if written:
            for _, batch in self._encode_in_batches(
                entries.keys,
                entries.values,
                entries.timestamps,
                entries.headers if any(entries.headers) else None,
                buffer.bytes_pending,
            ):
                self._write_locked(batch)
            self.write_seq += 1
        buffer.clear()
        self._holding_for_precommit = False
        self._publish_head()
        return written
