"""Columnar batch surgery for the cleaner and the latest-state reader.

:func:`filter_batch` keeps the records of a decoded :class:`~compactlog.format.RecordBatch`
where a mask is true and :func:`encode_filtered` writes such a batch back in the format of
``format.py`` (through :class:`~compactlog.format.EncodedBatch`, so the header and CRC code
is the format module's). Both work on numpy columns and byte blobs: the blobs are cut with
one byte mask each, never with a Python object per record.
"""

from __future__ import annotations

import numpy as np

from ..format import (
    BATCH_HEADER,
    CODEC_ZSTD,
    FLAG_CONTIGUOUS,
    FLAG_HEADERS,
    FLAG_SINGLE_TIMESTAMP,
    EncodedBatch,
    RecordBatch,
    _zstd_compress,
    crc32c,
)

_EMPTY = np.empty(0, dtype=np.uint8)


def _cut_blob(blob: bytes | memoryview | None, lengths: np.ndarray, mask: np.ndarray) -> bytes:
    if blob is None or len(blob) == 0:
        return b""
    present = lengths > 0
    width = int(lengths.max())
    if width <= 0:
        return b""
    if bool((lengths[present] == width).all()):
        # every non-empty item has the same length (fixed-size keys, values or tombstones):
        # cut whole rows, no byte mask
        rows = np.frombuffer(blob, dtype=f"V{width}")
        return rows[mask[present]].tobytes()
    kept = np.repeat(mask, np.maximum(lengths, 0))
    return np.frombuffer(blob, dtype=np.uint8)[kept].tobytes()


def filter_batch(batch: RecordBatch, mask: np.ndarray) -> RecordBatch:
    """The records of ``batch`` where ``mask`` is true (header fields kept but ``count``)."""
    header_lengths = headers_blob = None
    if batch.header_lengths is not None:
        header_lengths = batch.header_lengths[mask]
        headers_blob = _cut_blob(batch.headers_blob, batch.header_lengths, mask)
    return RecordBatch(
        header=batch.header._replace(count=int(mask.sum())),
        position=batch.position,
        offsets=batch.offsets[mask],
        timestamps=batch.timestamps[mask],
        key_lengths=batch.key_lengths[mask],
        value_lengths=batch.value_lengths[mask],
        keys_blob=_cut_blob(batch.keys_blob, batch.key_lengths, mask),
        values_blob=_cut_blob(batch.values_blob, batch.value_lengths, mask),
        header_lengths=header_lengths,
        headers_blob=headers_blob,
    )


def encode_filtered(batch: RecordBatch, codec: int, level: int) -> bytes:
    """Encode a (filtered, non-empty) batch keeping its base offset, last offset delta,
    offsets, timestamps and headers. The body is compressed with ``codec``."""
    count = len(batch.offsets)
    base = batch.header.base_offset
    last_delta = batch.header.last_delta
    flags = 0
    columns: list[bytes] = []
    ts = batch.timestamps
    first_ts = int(ts[0])
    max_ts = int(ts.max())
    if bool((ts == first_ts).all()):
        flags |= FLAG_SINGLE_TIMESTAMP
    else:
        columns.append(np.ascontiguousarray(ts, dtype="<i8").tobytes())
    deltas = (batch.offsets - base).astype("<u4")
    if int(deltas[0]) == 0 and int(deltas[-1]) == count - 1 and last_delta == count - 1:
        flags |= FLAG_CONTIGUOUS
    else:
        columns.append(deltas.tobytes())
    columns.append(np.ascontiguousarray(batch.key_lengths, dtype="<i4").tobytes())
    columns.append(np.ascontiguousarray(batch.value_lengths, dtype="<i4").tobytes())
    headers_blob = b""
    if batch.header_lengths is not None and bool(batch.header_lengths.any()):
        flags |= FLAG_HEADERS
        columns.append(np.ascontiguousarray(batch.header_lengths, dtype="<i4").tobytes())
        headers_blob = bytes(batch.headers_blob or b"")
    columns.append(bytes(batch.keys_blob))
    columns.append(bytes(batch.values_blob))
    columns.append(headers_blob)
    body = b"".join(columns)
    body_length = len(body)
    if codec == CODEC_ZSTD:
        body = _zstd_compress(body, level)
    encoded = EncodedBatch(
        body, crc32c(body), body_length, count, last_delta, first_ts, max_ts, flags, codec
    )
    assert encoded.size == BATCH_HEADER.size + len(body)
    return encoded.to_bytes(base)
