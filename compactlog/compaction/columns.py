"""Columnar batch rewriting for the cleaner.

:func:`encode_filtered` writes a filtered batch (``batch_decode.filter_batch``) back in the
batch format (through :class:`~compactlog.encoding.batch_encode.EncodedBatch`, so the header and CRC
code is the encoder's); it is the reference :func:`encode_kept` is tested against.
:func:`encode_kept` (and :class:`KeptColumns` for a window of batches) is filter and encode
in one step: the kept columns are written straight into one body buffer (one copy instead
of four), with the same bytes as ``encode_filtered(filter_batch(batch, keep))``. Both work
on numpy columns and byte blobs, never with a Python object per record.
"""

from __future__ import annotations

import numpy as np

from ..encoding.batch_decode import RecordBatch
from ..encoding.batch_encode import EncodedBatch
from ..encoding.format import (
    BATCH_HEADER,
    CODEC_ZSTD,
    FLAG_CONTIGUOUS,
    FLAG_HEADERS,
    FLAG_SINGLE_TIMESTAMP,
    crc32c,
    zstd_compress,
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
        body = zstd_compress(body, level)
    encoded = EncodedBatch(
        body, crc32c(body), body_length, count, last_delta, first_ts, max_ts, flags, codec
    )
    assert encoded.size == BATCH_HEADER.size + len(body)
    return encoded.to_bytes(base)


def _rows(lengths: np.ndarray) -> int:
    """The common length of the non-empty items, or 0 when they differ (or are all empty)."""
    width = int(lengths.max()) if len(lengths) else 0
    if width <= 0 or not bool((lengths[lengths > 0] == width).all()):
        return 0
    return width


def _put_kept(
    body: np.ndarray,
    at: int,
    blob: bytes | memoryview | None,
    lengths: np.ndarray,
    keep: np.ndarray,
    size: int,
    width: int,
) -> int:
    """Copy the kept items of ``blob`` (``size`` bytes in all) into ``body[at:]``;
    ``width``: the length of every non-empty item (0: they differ)."""
    if size == 0 or blob is None:
        return at
    out = body[at : at + size]
    if width:
        rows = np.frombuffer(blob, dtype=f"V{width}")
        if len(rows) != len(keep):
            keep = keep[lengths > 0]
        np.compress(keep, rows, out=out.view(f"V{width}"))
    else:
        raw = np.frombuffer(blob, dtype=np.uint8)
        np.compress(np.repeat(keep, np.maximum(lengths, 0)), raw, out=out)
    return at + size


def encode_kept(
    batch: RecordBatch, keep: np.ndarray, codec: int, level: int
) -> tuple[bytes, bytes | np.ndarray]:
    """``(header, body)`` of the records of ``batch`` where ``keep`` is true (at least
    one): the bytes of ``encode_filtered(filter_batch(batch, keep), codec, level)``."""
    count = len(batch)
    kept = KeptColumns(
        [batch], keep, batch.offsets, batch.key_lengths, batch.value_lengths, [0], [count]
    )
    return kept.encode(0, codec, level)


def range_sums(values: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``values[start : start + count].sum()`` for consecutive ranges that together cover
    ``values`` (``np.add.reduceat``, several times faster than a cumulative sum)."""
    out = np.zeros(len(starts), dtype=np.int64)
    nonempty = counts > 0
    if bool(nonempty.any()):
        out[nonempty] = np.add.reduceat(values, starts[nonempty], dtype=np.int64)
    return out


class KeptColumns:
    """The kept records of a window of consecutive batches, for :meth:`encode`.

    The window's columns (concatenated by the caller) are filtered once and the per-batch
    figures the header needs (first and largest timestamp, blob sizes) computed for every
    batch at once, so encoding one batch is a few slices and two blob copies.
    """

    def __init__(
        self,
        window: list[RecordBatch],
        keep: np.ndarray,
        offsets: np.ndarray,
        key_lengths: np.ndarray,
        value_lengths: np.ndarray,
        starts: list[int],
        ends: list[int],
    ) -> None:
        self.window = window
        self.keep = keep
        self.starts = starts
        self.ends = ends
        index = np.flatnonzero(keep)
        counts = np.asarray(ends, dtype=np.int64) - np.asarray(starts, dtype=np.int64)
        k_counts = range_sums(keep, np.asarray(starts, dtype=np.int64), counts)
        k_ends = np.cumsum(k_counts)
        k_starts = k_ends - k_counts
        self.k_starts = k_starts.tolist()
        self.k_ends = k_ends.tolist()
        timestamps = (
            window[0].timestamps
            if len(window) == 1
            else np.concatenate([b.timestamps for b in window])
        )
        self.ts = timestamps[index].astype("<i8", copy=False)
        self.offsets = offsets[index]
        self.key_lengths = key_lengths[index].astype("<i4", copy=False)
        self.value_lengths = value_lengths[index].astype("<i4", copy=False)
        self.header_lengths: np.ndarray | None = None
        if any(b.header_lengths is not None for b in window):
            heads = [
                np.zeros(len(b), np.int32) if b.header_lengths is None else b.header_lengths
                for b in window
            ]
            self.header_lengths = np.concatenate(heads)[index].astype("<i4", copy=False)
        # items of one length across the window (fixed-size keys, values): cut as rows
        self.key_width = _rows(key_lengths)
        self.value_width = _rows(value_lengths)
        self.key_bytes = self._per_batch(np.maximum(self.key_lengths, 0), k_starts, k_ends)
        self.value_bytes = self._per_batch(np.maximum(self.value_lengths, 0), k_starts, k_ends)
        self.header_bytes = (
            self._per_batch(self.header_lengths, k_starts, k_ends)
            if self.header_lengths is not None
            else [0] * len(window)
        )
        nonempty = np.flatnonzero(k_ends > k_starts)
        self.ts_min = [0] * len(window)
        self.ts_max = [0] * len(window)
        if len(nonempty):
            at = k_starts[nonempty]
            for i, low, high in zip(
                nonempty.tolist(),
                np.minimum.reduceat(self.ts, at).tolist(),
                np.maximum.reduceat(self.ts, at).tolist(),
                strict=True,
            ):
                self.ts_min[i] = low
                self.ts_max[i] = high
        last = max(len(index) - 1, 0)
        padded = self.offsets if len(index) else np.zeros(1, np.int64)
        self.first_offsets = padded[np.minimum(k_starts, last)].tolist()
        self.last_offsets = padded[np.maximum(k_ends - 1, 0)].tolist()

    @staticmethod
    def _per_batch(sizes: np.ndarray, k_starts: np.ndarray, k_ends: np.ndarray) -> list[int]:
        return range_sums(sizes, k_starts, k_ends - k_starts).tolist()

    def encode(self, i: int, codec: int, level: int) -> tuple[bytes, bytes | np.ndarray]:
        """``(header, body)`` of batch ``i``'s kept records (at least one): the bytes of
        ``encode_filtered(filter_batch(batch, keep), codec, level)``."""
        batch = self.window[i]
        a = self.k_starts[i]
        b = self.k_ends[i]
        count = b - a
        assert count > 0, "encode a batch that keeps records"
        base = batch.header.base_offset
        last_delta = batch.header.last_delta
        flags = 0
        fixed: list[np.ndarray] = []
        first_ts = int(self.ts[a])
        max_ts = self.ts_max[i]
        if self.ts_min[i] == max_ts:
            flags |= FLAG_SINGLE_TIMESTAMP
        else:
            fixed.append(self.ts[a:b])
        if (
            self.first_offsets[i] == base
            and self.last_offsets[i] - base == count - 1
            and last_delta == count - 1
        ):
            flags |= FLAG_CONTIGUOUS
        else:
            fixed.append((self.offsets[a:b] - base).astype("<u4"))
        fixed.append(self.key_lengths[a:b])
        fixed.append(self.value_lengths[a:b])
        header_bytes = self.header_bytes[i]
        if header_bytes:
            assert self.header_lengths is not None
            flags |= FLAG_HEADERS
            fixed.append(self.header_lengths[a:b])
        key_bytes = self.key_bytes[i]
        value_bytes = self.value_bytes[i]
        column_bytes = sum(column.nbytes for column in fixed)
        body = np.empty(column_bytes + key_bytes + value_bytes + header_bytes, dtype=np.uint8)
        at = 0
        for column in fixed:
            body[at : at + column.nbytes] = column.view(np.uint8)
            at += column.nbytes
        keep = self.keep[self.starts[i] : self.ends[i]]
        at = _put_kept(
            body, at, batch.keys_blob, batch.key_lengths, keep, key_bytes, self.key_width
        )
        at = _put_kept(
            body, at, batch.values_blob, batch.value_lengths, keep, value_bytes, self.value_width
        )
        if header_bytes:
            assert batch.header_lengths is not None
            lengths = batch.header_lengths
            at = _put_kept(
                body, at, batch.headers_blob, lengths, keep, header_bytes, _rows(lengths)
            )
        assert at == len(body)
        stored: bytes | np.ndarray = body
        if codec == CODEC_ZSTD:
            stored = zstd_compress(body.data, level)
        encoded = EncodedBatch(
            memoryview(stored),  # type: ignore[arg-type]  # only its length is used
            crc32c(stored),
            len(body),
            count,
            last_delta,
            first_ts,
            max_ts,
            flags,
            codec,
        )
        return encoded.header(base), stored
