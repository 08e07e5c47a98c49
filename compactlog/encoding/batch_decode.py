"""Batches into columns and records: the decoder of the batch grammar in ``format.py``.

:func:`decode_batch` turns one checked batch into a :class:`RecordBatch` (numpy columns
and byte blobs, no object per record; a one-record batch straight from its bytes);
:class:`Record` is one record as a user sees it. :func:`filter_batch` keeps the records
where a mask is true, :func:`concat_batches` joins consecutive batches into one. Runs of
small batches are decoded together by ``small_runs.py``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from itertools import repeat
from operator import attrgetter
from typing import Any, NamedTuple

import numpy as np

from .byte_items import struct_layout
from .format import (
    BATCH_HEADER,
    BATCH_MAGIC,
    CODEC_NONE,
    CODEC_ZSTD,
    FLAG_CONTIGUOUS,
    FLAG_HEADERS,
    FLAG_SINGLE_TIMESTAMP,
    TWO_LENGTHS,
    BatchHeader,
    decode_headers,
    encode_headers,
    zstd_decompress,
)


class Record(NamedTuple):
    """One record as a user sees it. ``value is None`` marks a tombstone."""

    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: Mapping[str, bytes] | None = None

    @property
    def is_tombstone(self) -> bool:
        """Whether the record deletes its key (its value is ``None``)."""
        return self.value is None


@dataclass(slots=True)
class RecordBatch:
    """A decoded batch in columnar form: numpy columns and byte blobs, no per-record objects.

    ``offsets``, ``timestamps``, ``key_lengths`` and ``value_lengths`` are numpy arrays;
    ``keys_blob``/``values_blob`` hold the concatenated bytes (a key of length -1 is absent,
    a value of length -1 is a tombstone). ``position`` is the batch's byte position in its
    segment file.
    """

    header: BatchHeader
    position: int
    offsets: np.ndarray
    timestamps: np.ndarray
    key_lengths: np.ndarray
    value_lengths: np.ndarray
    keys_blob: bytes | memoryview
    values_blob: bytes | memoryview
    header_lengths: np.ndarray | None = None
    headers_blob: bytes | memoryview | None = None
    stored_batches: int = 1  # > 1: a run of small stored batches (see decode_small_run)
    decoded: list[Record] | None = None  # the records, when decoded straight from bytes

    def __len__(self) -> int:
        return self.header.count

    @property
    def base_offset(self) -> int:
        """The offset of the batch's first record."""
        return self.header.base_offset

    @property
    def next_offset(self) -> int:
        """The offset after the batch's last record."""
        return self.header.next_offset

    @property
    def size_bytes(self) -> int:
        """The batch's length on disk, header included."""
        return self.header.length

    @staticmethod
    def _bounds(lengths: np.ndarray) -> tuple[list[int], list[int]]:
        ends = np.cumsum(np.maximum(lengths, 0), dtype=np.int64)
        starts = ends - np.maximum(lengths, 0)
        return starts.tolist(), ends.tolist()

    def keys(self) -> list[bytes | None]:
        """Every record's key, in offset order (``None`` for a null key)."""
        return _split(self.keys_blob, self.key_lengths)

    def values(self) -> list[bytes | None]:
        """Every record's value, in offset order (``None`` for a tombstone)."""
        return _split(self.values_blob, self.value_lengths)

    def headers(self) -> list[dict[str, bytes] | None]:
        """Every record's headers, in offset order (``None`` for a record with none)."""
        if self.header_lengths is None or self.headers_blob is None:
            return [None] * len(self)
        blob = bytes(self.headers_blob)
        return [
            decode_headers(blob[s:e]) if e > s else None
            for s, e in zip(*self._bounds(self.header_lengths), strict=True)
        ]

    def records(
        self, keys: Sequence[Any] | None = None, values: Sequence[Any] | None = None
    ) -> Iterator[Record]:
        """The records; ``keys``/``values`` (one item per record) replace the stored ones,
        for keys and values a deserializer made into objects (``serde.py``)."""
        if self.decoded is not None and keys is None and values is None:
            return iter(self.decoded)
        # built by map() in C: no Python frame (generator step) per record
        offsets = self.offsets.tolist()
        record_headers = (
            repeat(None, len(offsets)) if self.header_lengths is None else self.headers()
        )
        columns = zip(
            offsets,
            self.keys() if keys is None else keys,
            self.values() if values is None else values,
            self.timestamps.tolist(),
            record_headers,
            strict=True,
        )
        return map(tuple.__new__, repeat(Record), columns)

    def select(self, mask: np.ndarray) -> RecordBatch:
        """The records where ``mask`` is true, as a batch (used to cut a batch at an offset)."""
        keys = self.keys()
        values = self.values()
        record_headers = self.headers()
        idx = np.flatnonzero(mask).tolist()
        selected = _columns_batch(
            self.header,
            self.position,
            self.offsets[mask],
            self.timestamps[mask],
            [keys[i] for i in idx],
            [values[i] for i in idx],
            [record_headers[i] for i in idx],
        )
        selected.stored_batches = self.stored_batches
        return selected

    def split(self, n: int) -> tuple[RecordBatch, RecordBatch]:
        """The first ``n`` records and the rest, as two batches over this one's bytes
        (views: no copy, and work in proportion to the ``n`` taken, not to the batch): how a
        subscriber hands a large batch out a poll at a time, decoding it once. Each part
        keeps the stored header, with its count and its share of ``length``."""
        n = min(max(n, 0), len(self))
        cuts = [_blob_end(self.key_lengths, n), _blob_end(self.value_lengths, n)]
        blobs = [memoryview(self.keys_blob), memoryview(self.values_blob)]
        if self.header_lengths is not None and self.headers_blob is not None:
            cuts.append(_blob_end(self.header_lengths, n))
            blobs.append(memoryview(self.headers_blob))
        first_length = self.header.length * n // max(len(self), 1)

        def part(rows: slice, ends: list[slice], count: int, length: int) -> RecordBatch:
            lengths = self.header_lengths
            return RecordBatch(
                header=self.header._replace(count=count, length=length),
                position=self.position,
                offsets=self.offsets[rows],
                timestamps=self.timestamps[rows],
                key_lengths=self.key_lengths[rows],
                value_lengths=self.value_lengths[rows],
                keys_blob=blobs[0][ends[0]],
                values_blob=blobs[1][ends[1]],
                header_lengths=None if lengths is None else lengths[rows],
                headers_blob=blobs[2][ends[2]] if len(blobs) > 2 else None,
                stored_batches=self.stored_batches,
                decoded=None if self.decoded is None else self.decoded[rows],
            )

        head = part(slice(0, n), [slice(0, cut) for cut in cuts], n, first_length)
        rest = part(
            slice(n, None),
            [slice(cut, None) for cut in cuts],
            len(self) - n,
            self.header.length - first_length,
        )
        return head, rest


def _blob_end(lengths: np.ndarray, n: int) -> int:
    """Bytes the first ``n`` items of a blob cut at ``lengths`` take (-1: absent, none)."""
    return int(np.maximum(lengths[:n], 0).sum()) if n else 0


def _split(blob: bytes | memoryview, lengths: np.ndarray) -> list[bytes | None]:
    """The items of ``blob`` cut at ``lengths`` (a negative length: ``None``, no bytes)."""
    n = len(lengths)
    if not n:
        return []
    first = int(lengths[0])
    if first >= 0 and bool((lengths == first).all()):
        if not first:
            return [b""] * n
        # equal lengths: numpy cuts the blob into bytes objects ("V" items keep NUL bytes)
        return np.frombuffer(blob, dtype=f"V{first}", count=n).tolist()
    sizes = np.maximum(lengths, 0)
    out: list[bytes | None]
    if int(sizes.sum()) > len(blob):  # (not from a decoder, which checks the sizes)
        raw = bytes(blob)
        ends = np.cumsum(sizes, dtype=np.int64).tolist()
        out = [raw[s:e] for s, e in zip([0, *ends[:-1]], ends, strict=True)]
    else:
        # lengths that vary: one struct unpack cuts every item, no slice object each
        out = list(struct_layout((sizes, b"s"), count=n).unpack_from(blob))
    if int(lengths.min()) < 0:
        for i in np.flatnonzero(lengths < 0).tolist():
            out[i] = None
    return out


def _columns_batch(
    header: BatchHeader,
    position: int,
    offsets: np.ndarray,
    timestamps: np.ndarray,
    keys: list[bytes | None],
    values: list[bytes | None],
    headers: list[dict[str, bytes] | None],
) -> RecordBatch:
    key_lengths = np.fromiter((-1 if k is None else len(k) for k in keys), np.int32, len(keys))
    value_lengths = np.fromiter(
        (-1 if v is None else len(v) for v in values), np.int32, len(values)
    )
    encoded = [encode_headers(h) if h else b"" for h in headers]
    has_headers = any(encoded)
    return RecordBatch(
        header=header._replace(count=len(keys)),
        position=position,
        offsets=offsets,
        timestamps=timestamps,
        key_lengths=key_lengths,
        value_lengths=value_lengths,
        keys_blob=b"".join(k for k in keys if k is not None),
        values_blob=b"".join(v for v in values if v is not None),
        header_lengths=np.fromiter(map(len, encoded), np.int32, len(encoded))
        if has_headers
        else None,
        headers_blob=b"".join(encoded) if has_headers else None,
    )


def decode_batch(buf: bytes | memoryview, pos: int, header: BatchHeader) -> RecordBatch:
    """Decode the (already CRC-checked) batch at ``pos`` into columns."""
    body = batch_body(buf, pos, header)
    if header.count == 1:
        one = _decode_one(body, pos, header)
        if one is not None:
            return one
    return _decode_columns(body, pos, header)


def batch_body(buf: bytes | memoryview, pos: int, header: BatchHeader) -> bytes | memoryview:
    """The body of the batch at ``pos``, decompressed, checked against its stored length."""
    body: bytes | memoryview = memoryview(buf)[pos + BATCH_HEADER.size : pos + header.length]
    if header.codec == CODEC_ZSTD:
        body = zstd_decompress(body, header.body_length)
    if len(body) != header.body_length:
        raise ValueError(f"body is {len(body)} bytes, header says {header.body_length}")
    return body


def _decode_columns(body: bytes | memoryview, pos: int, header: BatchHeader) -> RecordBatch:
    count = header.count
    cursor = 0
    if header.flags & FLAG_SINGLE_TIMESTAMP:
        timestamps = np.full(count, header.first_ts, dtype=np.int64)
    else:
        timestamps = np.frombuffer(body, dtype=np.int64, count=count, offset=cursor)
        cursor += 8 * count
    if header.flags & FLAG_CONTIGUOUS:
        offsets = np.arange(header.base_offset, header.base_offset + count, dtype=np.int64)
    else:
        deltas = np.frombuffer(body, dtype=np.uint32, count=count, offset=cursor)
        cursor += 4 * count
        offsets = deltas.astype(np.int64) + header.base_offset
    key_lengths = np.frombuffer(body, dtype=np.int32, count=count, offset=cursor)
    cursor += 4 * count
    value_lengths = np.frombuffer(body, dtype=np.int32, count=count, offset=cursor)
    cursor += 4 * count
    header_lengths = None
    if header.flags & FLAG_HEADERS:
        header_lengths = np.frombuffer(body, dtype=np.int32, count=count, offset=cursor)
        cursor += 4 * count
    key_total = int(np.maximum(key_lengths, 0).sum())
    value_total = int(np.maximum(value_lengths, 0).sum())
    header_total = int(header_lengths.sum()) if header_lengths is not None else 0
    if cursor + key_total + value_total + header_total != len(body):
        raise ValueError("column lengths do not add up to the batch body")
    keys_blob = body[cursor : cursor + key_total]
    cursor += key_total
    values_blob = body[cursor : cursor + value_total]
    cursor += value_total
    headers_blob = body[cursor : cursor + header_total] if header_lengths is not None else None
    return RecordBatch(
        header,
        pos,
        offsets,
        timestamps,
        key_lengths,
        value_lengths,
        keys_blob,
        values_blob,
        header_lengths,
        headers_blob,
    )


_I64 = struct.Struct("<q")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")


def _decode_one(body: bytes | memoryview, pos: int, header: BatchHeader) -> RecordBatch | None:
    """:func:`decode_batch` of a one-record batch (a single append) straight from the
    bytes with ``struct``: its :class:`Record` is made here (``records()`` returns it) and
    the columns are one-item arrays. ``None`` for a body the columnar path must judge
    (negative header length)."""
    flags = header.flags
    cursor = 0
    timestamp = header.first_ts
    if not flags & FLAG_SINGLE_TIMESTAMP:
        (timestamp,) = _I64.unpack_from(body, 0)
        cursor = 8
    delta = 0
    if not flags & FLAG_CONTIGUOUS:
        (delta,) = _U32.unpack_from(body, cursor)
        cursor += 4
    key_length, value_length = TWO_LENGTHS.unpack_from(body, cursor)
    cursor += 8
    header_length = -1
    if flags & FLAG_HEADERS:
        (header_length,) = _I32.unpack_from(body, cursor)
        cursor += 4
        if header_length < 0:
            return None
    k = key_length if key_length > 0 else 0
    v = value_length if value_length > 0 else 0
    h = header_length if header_length > 0 else 0
    if cursor + k + v + h != len(body):
        raise ValueError("column lengths do not add up to the batch body")
    raw = body if isinstance(body, bytes) else bytes(body)
    key = raw[cursor : cursor + k] if key_length >= 0 else None
    cursor += k
    value = raw[cursor : cursor + v] if value_length >= 0 else None
    cursor += v
    headers_blob = raw[cursor : cursor + h] if flags & FLAG_HEADERS else None
    offset = header.base_offset + delta
    record = Record(offset, key, value, timestamp, decode_headers(headers_blob) if h else None)
    return RecordBatch(
        header,
        pos,
        np.array([offset], dtype=np.int64),
        np.array([timestamp], dtype=np.int64),
        np.array([key_length], dtype=np.int32),
        np.array([value_length], dtype=np.int32),
        key or b"",
        value or b"",
        np.array([header_length], dtype=np.int32) if flags & FLAG_HEADERS else None,
        headers_blob,
        decoded=[record],
    )


@dataclass(slots=True)
class Columns:
    """The columns of one or more batches laid end to end, without a batch header: what a
    consumer of records in bulk needs (Arrow, Spark). :class:`RecordBatch` holds the same
    columns for one batch (or run)."""

    offsets: np.ndarray
    timestamps: np.ndarray
    key_lengths: np.ndarray
    value_lengths: np.ndarray
    keys_blob: bytes | memoryview
    values_blob: bytes | memoryview
    header_lengths: np.ndarray | None
    headers_blob: bytes | memoryview | None

    def __len__(self) -> int:
        return len(self.offsets)


# The columns, named once (by Columns), read off a RecordBatch or a Columns as a tuple in C.
# RecordBatch holds the same fields in the same order after its header and position, so a
# tuple of them fills either class.
COLUMN_NAMES = tuple(f.name for f in fields(Columns))
_columns_of = attrgetter(*COLUMN_NAMES)
assert tuple(f.name for f in fields(RecordBatch))[2 : 2 + len(COLUMN_NAMES)] == COLUMN_NAMES


def concat_columns(batches: Sequence[RecordBatch]) -> Columns:
    """The columns of ``batches`` joined in order (they may come from several segments);
    the header columns are ``None`` when no batch has headers. One batch's columns are
    taken as they are, views included; joined blobs are ``bytes``. Used by
    :func:`concat_batches` and by consumers that need only the columns (Arrow, Spark)."""
    if len(batches) == 1:  # (spelled out: faster than unpacking _columns_of, per Arrow batch)
        b = batches[0]
        return Columns(
            b.offsets,
            b.timestamps,
            b.key_lengths,
            b.value_lengths,
            b.keys_blob,
            b.values_blob,
            b.header_lengths,
            b.headers_blob,
        )
    with_headers = any(b.header_lengths is not None for b in batches)
    header_lengths = headers_blob = None
    if with_headers:
        header_lengths = np.concatenate(
            [
                np.zeros(len(b), np.int32) if b.header_lengths is None else b.header_lengths
                for b in batches
            ]
        )
        headers_blob = b"".join([b.headers_blob or b"" for b in batches])

    def column(name: str) -> np.ndarray:
        arrays = [getattr(b, name) for b in batches]
        return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)

    return Columns(
        column("offsets"),
        column("timestamps"),
        column("key_lengths"),
        column("value_lengths"),
        b"".join([b.keys_blob for b in batches]),
        b"".join([b.values_blob for b in batches]),
        header_lengths,
        headers_blob,
    )


def concat_batches(batches: Sequence[RecordBatch]) -> RecordBatch:
    """Consecutive batches (in offset order, each from the byte after the previous one)
    as one, with the run header :func:`decode_small_run` describes."""
    if len(batches) == 1:
        return batches[0]
    first, last = batches[0], batches[-1]
    count = sum(len(b) for b in batches)
    header = BatchHeader(
        sum(b.size_bytes for b in batches),
        0,
        BATCH_MAGIC,
        CODEC_NONE,
        0,
        first.base_offset,
        count,
        last.next_offset - 1 - first.base_offset,
        first.header.first_ts,
        max(b.header.max_ts for b in batches),
        0,
    )
    return RecordBatch(
        header,
        first.position,
        *_columns_of(concat_columns(batches)),
        sum(b.stored_batches for b in batches),
    )


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
