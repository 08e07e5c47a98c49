"""Records into batches: the encoder of the batch grammar in ``format.py``.

:func:`encode_batch` (Python objects) and :func:`encode_columns` (columns, the body
grammar's one implementation, which columnar producers such as the Spark writer's tasks
call directly) make an :class:`EncodedBatch`: a body encoded, and compressed, without its
base offset, so writers encode outside their lock and stamp the header under it. A
one-record batch is encoded by :func:`encode_single` (:func:`encode_plain` for the plain
record of the single-append fast path, ``single.py``). :func:`encode_within_segment` cuts a
large append into batches of at most about half a segment (:func:`split_points`), so that
segments still roll. :func:`read_staged_batches` reads back the batches the Spark writer
staged.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from .format import (
    BATCH_HEADER,
    BATCH_MAGIC,
    CODEC_NONE,
    CODEC_ZSTD,
    FILE_HEADER,
    FLAG_CONTIGUOUS,
    FLAG_HEADERS,
    FLAG_SINGLE_TIMESTAMP,
    HEADER_TAIL,
    LENGTH_CRC,
    MAX_BATCH_BYTES,
    STAGING_MAGIC,
    TWO_LENGTHS,
    check_batch_crc,
    check_file_header,
    crc32c,
    encode_headers,
    zstd_compress,
)


def _lengths(items: Sequence[bytes | None], count: int) -> np.ndarray:
    return np.fromiter(map(len, items), dtype=np.int32, count=count)


def _lengths_with_none(items: Sequence[Any], count: int) -> np.ndarray:
    return np.fromiter((-1 if x is None else len(x) for x in items), dtype=np.int32, count=count)


@dataclass(slots=True)
class EncodedBatch:
    """A batch body encoded (and compressed) without knowing its base offset yet.

    Writers encode outside their lock and only call :meth:`header` under it, once the base
    offset is known. The CRC is computed over the body first and continued over header
    bytes [8, 48), so the body's share is computed here, outside any lock.
    """

    body: bytes | memoryview  # a view when read back from a staging file
    body_crc: int
    body_length: int
    count: int
    last_delta: int
    first_ts: int
    max_ts: int
    flags: int
    codec: int
    largest_record: int = 0  # the largest key + value, for ``max_record_bytes``
    null_keys: bool = False  # some record has no key (refused on a compacted log)

    @property
    def size(self) -> int:
        return BATCH_HEADER.size + len(self.body)

    def header(self, base_offset: int) -> bytes:
        tail = HEADER_TAIL.pack(
            BATCH_MAGIC,
            self.codec,
            self.flags,
            base_offset,
            self.count,
            self.last_delta,
            self.first_ts,
            self.max_ts,
            self.body_length,
        )
        return LENGTH_CRC.pack(self.size, crc32c(tail, self.body_crc)) + tail

    def to_bytes(self, base_offset: int) -> bytes:
        return self.header(base_offset) + self.body


class OneRecord(NamedTuple):
    """One checked record on the writer's buffered paths (linger, precommit): key and
    value (``None``: absent), its timestamp, and its headers as the encoded block
    (``format.encode_headers``, ``b""`` for none), encoded once at the door."""

    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: bytes


def encode_batch(
    keys: Sequence[bytes | None],
    values: Sequence[bytes | None],
    timestamps: int | Sequence[int],
    *,
    headers: Sequence[Mapping[str, bytes] | None] | None = None,
    header_blocks: Sequence[bytes] | None = None,
    offset_deltas: np.ndarray | None = None,
    last_delta: int | None = None,
    codec: int = CODEC_NONE,
    level: int = 3,
    allow_none_keys: bool = True,
) -> EncodedBatch:
    """Encode one batch body. Keys and values must already be bytes-like or ``None``.

    ``timestamps`` is one int shared by all records (the common case: no column stored) or
    one per record. ``header_blocks`` are the headers already encoded (``OneRecord``'s),
    given instead of ``headers``. ``offset_deltas`` is given only when rewriting a batch
    that lost records; fresh batches have contiguous offsets and store no delta column.
    """
    count = len(keys)
    if count == 1 and isinstance(timestamps, int) and offset_deltas is None and last_delta is None:
        return _encode_one(
            keys[0],
            values[0],
            timestamps,
            header_blocks[0] if header_blocks else _header_block(headers[0] if headers else None),
            codec,
            level,
            allow_none_keys,
        )
    # keys and values are copied once, straight into the body (no separate blobs); a
    # non-bytes item that has a len() (a str) fails that join and is reported below
    key_parts: Sequence[Any] = keys
    value_parts: Sequence[Any] = values
    try:
        key_lengths = _lengths(keys, count)
    except TypeError:
        validate_column(keys, "key", allow_none=allow_none_keys)
        key_parts = [k for k in keys if k is not None]
        key_lengths = _lengths_with_none(keys, count)
    try:
        value_lengths = _lengths(values, count)
    except TypeError:
        validate_column(keys, "key", allow_none=allow_none_keys)
        validate_column(values, "value", allow_none=True)
        value_parts = [v for v in values if v is not None]
        value_lengths = _lengths_with_none(values, count)
    if header_blocks is None:
        header_lengths, header_parts = encode_header_column(headers)
    else:
        header_lengths, header_parts = block_column(header_blocks)
    try:
        return encode_columns(
            key_lengths,
            key_parts,
            value_lengths,
            value_parts,
            timestamps,
            header_lengths=header_lengths,
            header_parts=header_parts,
            offset_deltas=offset_deltas,
            last_delta=last_delta,
            codec=codec,
            level=level,
        )
    except TypeError:
        validate_column(keys, "key", allow_none=allow_none_keys)
        validate_column(values, "value", allow_none=True)
        raise


def encode_header_column(
    headers: Sequence[Mapping[str, bytes] | None] | None,
) -> tuple[np.ndarray | None, list[bytes]]:
    """The headers column of a batch: per record its encoded block (``b""`` for ``None``
    or an empty mapping) and their ``int32`` lengths, or ``(None, [])`` when no record
    has headers (the batch then stores no headers column, flag bit 0 clear)."""
    if headers is None or not any(headers):
        return None, []
    return block_column([_header_block(h) for h in headers])


def block_column(blocks: Sequence[bytes]) -> tuple[np.ndarray | None, list[bytes]]:
    """:func:`encode_header_column` of headers already encoded (``b""``: none)."""
    if not any(blocks):
        return None, []
    return np.fromiter(map(len, blocks), dtype=np.int32, count=len(blocks)), list(blocks)


def _header_block(headers: Mapping[str, bytes] | None) -> bytes:
    return encode_headers(headers) if headers else b""


def encode_columns(
    key_lengths: np.ndarray,
    key_parts: Sequence[Any],
    value_lengths: np.ndarray,
    value_parts: Sequence[Any],
    timestamps: int | Sequence[int] | np.ndarray,
    *,
    header_lengths: np.ndarray | None = None,
    header_parts: Sequence[Any] = (),
    offset_deltas: np.ndarray | None = None,
    last_delta: int | None = None,
    codec: int = CODEC_NONE,
    level: int = 3,
) -> EncodedBatch:
    """Encode one batch body from its columns: the body grammar's one implementation.

    :func:`encode_batch` calls it with the lengths of Python ``bytes`` and the objects
    themselves as parts; columnar producers (the Spark writer's tasks, from Arrow's offset
    and data buffers) call it directly, so no per-record object is made. ``key_lengths`` and
    ``value_lengths`` are ``int32`` (-1: no key, tombstone); the bytes-like ``*_parts``,
    joined, are the blobs (so a producer passes its buffers as they are and the body is
    their one copy). ``header_lengths`` (0: no headers) is given only when some record has
    headers, ``header_parts`` then being the encoded header blocks (``encode_headers``).
    The caller checks keys against the log's policy; ``null_keys`` of the result says
    whether any key is absent.
    """
    count = len(key_lengths)
    flags = 0
    columns: list[bytes] = []
    if isinstance(timestamps, int):
        flags |= FLAG_SINGLE_TIMESTAMP
        first_ts = max_ts = timestamps
    else:
        ts = np.asarray(timestamps, dtype=np.int64)
        first_ts = int(ts[0]) if count else 0
        max_ts = int(ts.max()) if count else 0
        if count and (ts == first_ts).all():
            flags |= FLAG_SINGLE_TIMESTAMP
        else:
            columns.append(ts.tobytes())
    if offset_deltas is None:
        flags |= FLAG_CONTIGUOUS
        last = count - 1 if last_delta is None else last_delta
    else:
        deltas = np.asarray(offset_deltas, dtype=np.uint32)
        last = int(deltas[-1]) if last_delta is None else last_delta
        if count and deltas[0] == 0 and deltas[-1] == count - 1 and last == count - 1:
            flags |= FLAG_CONTIGUOUS
        else:
            columns.append(deltas.tobytes())
    largest = int((np.maximum(key_lengths, 0) + np.maximum(value_lengths, 0)).max()) if count else 0
    null_keys = bool(count) and int(key_lengths.min()) < 0
    columns.append(np.asarray(key_lengths, dtype=np.int32).tobytes())
    columns.append(np.asarray(value_lengths, dtype=np.int32).tobytes())
    if header_lengths is not None:
        flags |= FLAG_HEADERS
        columns.append(np.asarray(header_lengths, dtype=np.int32).tobytes())
    body = b"".join([*columns, *key_parts, *value_parts, *header_parts])
    body_length = len(body)
    if codec == CODEC_ZSTD:
        body = zstd_compress(body, level)
    if BATCH_HEADER.size + len(body) > MAX_BATCH_BYTES:
        raise ValueError(f"batch of {len(body)} bytes exceeds the format limit")
    return EncodedBatch(
        body,
        crc32c(body),
        body_length,
        count,
        last,
        first_ts,
        max_ts,
        flags,
        codec,
        largest,
        null_keys,
    )


_BYTES_LIKE = (bytes, bytearray, memoryview)
_THREE_LENGTHS = struct.Struct("<iii")


def _encode_one(
    key: Any,
    value: Any,
    timestamp: int,
    header_block: bytes,
    codec: int,
    level: int,
    allow_none_keys: bool,
) -> EncodedBatch:
    """:func:`encode_batch` for a single record, byte for byte, without numpy: single
    appends are dominated by fixed costs, and the columns of one record are two ints."""
    if not (key is None or isinstance(key, _BYTES_LIKE)) or (key is None and not allow_none_keys):
        validate_column([key], "key", allow_none=allow_none_keys)
    if not (value is None or isinstance(value, _BYTES_LIKE)):
        validate_column([value], "value", allow_none=True)
    body, flags = _one_body(key, value, header_block)
    body_length = len(body)
    if codec == CODEC_ZSTD:
        body = zstd_compress(body, level)
    largest = (0 if key is None else len(key)) + (0 if value is None else len(value))
    return EncodedBatch(
        body,
        crc32c(body),
        body_length,
        1,
        0,
        timestamp,
        timestamp,
        flags,
        codec,
        largest,
        key is None,
    )


SINGLE_FLAGS = FLAG_SINGLE_TIMESTAMP | FLAG_CONTIGUOUS
PLAIN_MAX_BYTES = 4095
"""Key + value bytes of a *plain* record (below, :func:`encode_plain`): up to this the body
and header tail are copied into one string for a single ``crc32c`` call; past it a record
is rare, and a second ``crc32c`` call costs less than copying it once more."""

_pack_lengths = TWO_LENGTHS.pack
_pack_tail = HEADER_TAIL.pack
_pack_length_crc = LENGTH_CRC.pack


def encode_plain(key: bytes, value: bytes, timestamp: int, base_offset: int) -> bytes:
    """A plain record (a bytes key and value of at most :data:`PLAIN_MAX_BYTES` together,
    no headers) as a whole uncompressed one-record batch: the bytes :func:`encode_single`
    gives for it.

    The encoder of the single-append fast path (``single.py``), which calls it once per
    ``append``: three packs (bound at import), one CRC call over the body and header bytes
    [8, 48) concatenated (what the CRC covers, in that order: copying a small record once
    more costs less than a second call of ``crc32c``), two concatenations.
    """
    body = _pack_lengths(len(key), len(value)) + key + value
    length = len(body)
    tail = _pack_tail(
        BATCH_MAGIC, CODEC_NONE, SINGLE_FLAGS, base_offset, 1, 0, timestamp, timestamp, length
    )
    return _pack_length_crc(length + 48, crc32c(body + tail)) + tail + body


def encode_single(
    key: bytes | None, value: bytes | None, timestamp: int, headers: bytes, base_offset: int
) -> bytes:
    """One uncompressed record as a whole one-record batch, header included.

    Byte for byte what ``encode_batch([key], [value], timestamp, ...).to_bytes(base_offset)``
    gives, without numpy and without an intermediate object, so that its only allocations
    are the record's bytes and the few small ``struct`` packs. ``key`` and ``value`` must
    already be checked (bytes or ``None``); ``headers`` is the encoded header block
    (``encode_headers``) or ``b""``. A plain record is :func:`encode_plain`'s.
    """
    if (
        key is not None
        and value is not None
        and not headers
        and len(key) + len(value) <= PLAIN_MAX_BYTES
    ):
        return encode_plain(key, value, timestamp, base_offset)
    body, flags = _one_body(key, value, headers)
    length = len(body)
    tail = HEADER_TAIL.pack(
        BATCH_MAGIC, CODEC_NONE, flags, base_offset, 1, 0, timestamp, timestamp, length
    )
    return b"".join((LENGTH_CRC.pack(48 + length, crc32c(tail, crc32c(body))), tail, body))


def _one_body(key: bytes | None, value: bytes | None, header_block: bytes) -> tuple[bytes, int]:
    """The body of a one-record batch and its flags (one timestamp, contiguous; headers
    when ``header_block``, the encoded headers, is not empty): its lengths columns, then
    key, value and headers. The one rule for :func:`_encode_one` and :func:`encode_single`."""
    key_length = -1 if key is None else len(key)
    value_length = -1 if value is None else len(value)
    if header_block:
        lengths = _THREE_LENGTHS.pack(key_length, value_length, len(header_block))
        flags = SINGLE_FLAGS | FLAG_HEADERS
    else:
        lengths = TWO_LENGTHS.pack(key_length, value_length)
        flags = SINGLE_FLAGS
    return b"".join((lengths, key or b"", value or b"", header_block)), flags


def validate_column(
    items: Sequence[Any], what: str, *, allow_none: bool, single: bool = False
) -> None:
    """Raise :class:`InvalidRecordError` naming the first item that is not bytes (or None):
    by its index in a batch (``record 3: key ...``), or, for a ``single`` record, as the
    argument it is (``key ...``)."""
    from ..errors import InvalidRecordError

    for index, item in enumerate(items):
        where = "" if single else f"record {index}: "
        if item is None:
            if not allow_none:
                raise InvalidRecordError(
                    f"{where}a {what} of None is not allowed on a compacted log "
                    "(every record needs a key)"
                )
        elif not isinstance(item, _BYTES_LIKE):
            raise InvalidRecordError(
                f"{where}{what} must be bytes{' or None' if allow_none else ''}, "
                f"not {type(item).__name__}"
            )


def read_staged_batches(buf: Any, extras: Sequence[tuple[int, bool]]) -> list[EncodedBatch]:
    """The batches of a staging file (``buf``: its whole content), each checked as a
    segment's batch is (:func:`check_batch`, CRC included), as :class:`EncodedBatch`
    objects ready to append at any base offset (their bodies are views of ``buf``).

    ``extras`` is what the file's producer reported for each batch besides its bytes,
    ``(largest_record, null_keys)``: the staging file must hold exactly that many batches,
    each at base offset 0, back to back to its end. Raises ``ValueError`` naming the byte
    position of the first problem.
    """
    reason = check_file_header(bytes(buf[: FILE_HEADER.size]), STAGING_MAGIC)
    if reason is not None:
        raise ValueError(f"at byte 0: {reason}")
    end = len(buf)
    pos = FILE_HEADER.size
    batches: list[EncodedBatch] = []
    view = memoryview(buf)
    try:
        for largest, null_keys in extras:
            header, body_crc, reason = check_batch_crc(buf, pos, end)
            if header is None:
                raise ValueError(f"at byte {pos}: {reason}")
            if header.base_offset != 0:
                raise ValueError(f"at byte {pos}: staged batch at base offset {header.base_offset}")
            body = view[pos + BATCH_HEADER.size : pos + header.length]
            batches.append(
                EncodedBatch(
                    body,
                    body_crc,
                    header.body_length,
                    header.count,
                    header.last_delta,
                    header.first_ts,
                    header.max_ts,
                    header.flags,
                    header.codec,
                    largest,
                    null_keys,
                )
            )
            pos += header.length
        if pos != end:
            raise ValueError(f"at byte {pos}: {end - pos} bytes after the last staged batch")
    except ValueError:
        for staged in batches:  # a view alive would keep a mapped ``buf`` from closing
            body = staged.body
            if isinstance(body, memoryview):
                body.release()
        raise
    finally:
        view.release()
    return batches


def split_points(sizes: Sequence[int], segment_bytes: int) -> list[tuple[int, int]]:
    """Cut a run of records into batches of at most about ``segment_bytes // 2`` raw bytes,
    so that a large ``append_batch`` still lets segments roll near ``segment_bytes``."""
    limit = max(segment_bytes // 2, 1)
    cuts: list[tuple[int, int]] = []
    start = 0
    total = 0
    for i, size in enumerate(sizes):
        if total and total + size > limit:
            cuts.append((start, i))
            start, total = i, 0
        total += size
    cuts.append((start, len(sizes)))
    return cuts


def encode_within_segment(
    encode: Callable[[int, int], EncodedBatch],
    count: int,
    sizes: Callable[[], Sequence[int]],
    segment_bytes: int,
) -> list[EncodedBatch]:
    """Records ``[0, count)`` as one batch (``encode(lo, hi)`` encodes records
    ``[lo, hi)``) or, when that batch is more than half a segment, as the batches
    :func:`split_points` cuts by the records' raw ``sizes()``: so a large append still lets
    segments roll near ``segment_bytes``. The one rule for :meth:`Log.append_batch` and
    batches encoded elsewhere (the Spark writer's tasks)."""
    batch = encode(0, count)
    if batch.size <= segment_bytes // 2 or batch.count <= 1:
        return [batch]
    return [encode(lo, hi) for lo, hi in split_points(sizes(), segment_bytes)]
