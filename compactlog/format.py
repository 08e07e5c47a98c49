"""The on-disk byte grammar: the single source of truth for every file layout.

All integers are little-endian. ``docs/format.md`` repeats this grammar with an example.
FORMAT_VERSION is stored in ``meta`` and in every segment and index file header; a newer
version is refused, never guessed at.

Segment file ``<base>.log``::

    segment    := file_header batch*
    file_header:= magic "CLOGSEG\\0" (8) | version u16 | flags u16 | reserved u32   (16 bytes)
    batch      := batch_header body
    batch_header (48 bytes):
        length       u32   whole batch, header included
        crc          u32   crc32c of the body, continued over header bytes [8, 48)
        magic        u8    BATCH_MAGIC (1)
        codec        u8    0 none, 1 zstd (the body is compressed as a whole)
        flags        u16   bit0 headers column present, bit1 offsets contiguous (no delta
                           column), bit2 one timestamp for all records (no timestamp column)
        base_offset  i64   offset of the batch's first offset (kept when records are removed)
        count        u32   records stored in the batch
        last_delta   u32   last offset the batch was written with, minus base_offset
        first_ts     i64   timestamp of the first record (ms since epoch)
        max_ts       i64   largest record timestamp
        body_length  u32   length of the body before compression
    body (columnar, after decompression):
        timestamps     i64[count]   unless flag bit2
        offset_deltas  u32[count]   unless flag bit1
        key_lengths    i32[count]   -1 = no key
        value_lengths  i32[count]   -1 = tombstone
        header_lengths i32[count]   only with flag bit0; 0 = no headers
        keys blob | values blob | headers blob
    headers of one record := count u16 (name_len u16 name value_len u32 value)*

Index file ``<base>.idx`` (sparse, a rebuildable cache)::

    file_header (magic "CLOGIDX\\0") entry*
    entry := relative_offset u32 | position u32       (8 bytes)

Precommit file ``pre_commit``: file_header (magic "CLOGPRE\\0") then entries::

    entry := length u32 | crc u32 (crc32c of [8, length)) | offset i64 | timestamp i64
             | key_length i32 | value_length i32 | header_length i32 | key value headers

Staging file (the Spark writer's tasks stage batches for the driver to append; never part
of a log)::

    file_header (magic "CLOGSTG\0") batch*    each batch as above, at base_offset 0
"""

from __future__ import annotations

import mmap
import struct
import threading
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, NamedTuple

import crc32c as _crc32c
import numpy as np
import zstandard

FORMAT_VERSION = 1
BATCH_MAGIC = 1

SEGMENT_MAGIC = b"CLOGSEG\0"
INDEX_MAGIC = b"CLOGIDX\0"
PRECOMMIT_MAGIC = b"CLOGPRE\0"
STAGING_MAGIC = b"CLOGSTG\0"

FILE_HEADER = struct.Struct("<8sHHI")
BATCH_HEADER = struct.Struct("<IIBBHqIIqqI")
INDEX_ENTRY = struct.Struct("<II")
PRECOMMIT_ENTRY = struct.Struct("<IIqqiii")
PRECOMMIT_LENGTH_CRC = struct.Struct("<II")  # the entry's first two fields ...
PRECOMMIT_FIELDS = struct.Struct("<qqiii")  # ... and the rest, which the CRC covers
assert FILE_HEADER.size == 16
assert BATCH_HEADER.size == 48
assert INDEX_ENTRY.size == 8
assert PRECOMMIT_ENTRY.size == 36 == PRECOMMIT_LENGTH_CRC.size + PRECOMMIT_FIELDS.size

CODEC_NONE = 0
CODEC_ZSTD = 1
CODECS = {"none": CODEC_NONE, "zstd": CODEC_ZSTD}

FLAG_HEADERS = 1
FLAG_CONTIGUOUS = 2
FLAG_SINGLE_TIMESTAMP = 4
KNOWN_FLAGS = FLAG_HEADERS | FLAG_CONTIGUOUS | FLAG_SINGLE_TIMESTAMP

CRC_START = 8  # the CRC covers everything after the length and crc fields
MAX_BATCH_BYTES = (1 << 32) - 1

crc32c = _crc32c.crc32c


# -- file headers ------------------------------------------------------------------------


def file_header(magic: bytes) -> bytes:
    return FILE_HEADER.pack(magic, FORMAT_VERSION, 0, 0)


SEGMENT_FILE_HEADER = file_header(SEGMENT_MAGIC)
INDEX_FILE_HEADER = file_header(INDEX_MAGIC)
PRECOMMIT_FILE_HEADER = file_header(PRECOMMIT_MAGIC)
STAGING_FILE_HEADER = file_header(STAGING_MAGIC)


def check_file_header(data: bytes, magic: bytes) -> str | None:
    """Why ``data`` is not a valid header with ``magic`` (``None`` when it is)."""
    if len(data) < FILE_HEADER.size:
        return f"file header is {len(data)} bytes, expected {FILE_HEADER.size}"
    found, version, _flags, _reserved = FILE_HEADER.unpack_from(data)
    if found != magic:
        return f"not a compactlog file (magic {found!r}, expected {magic!r})"
    if version > FORMAT_VERSION:
        return f"format version {version} is newer than this compactlog supports ({FORMAT_VERSION})"
    return None


# -- records -----------------------------------------------------------------------------


class Record(NamedTuple):
    """One record as a user sees it. ``value is None`` marks a tombstone."""

    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: Mapping[str, bytes] | None = None

    @property
    def is_tombstone(self) -> bool:
        return self.value is None


def encode_headers(headers: Mapping[str, bytes]) -> bytes:
    parts = [struct.pack("<H", len(headers))]
    for name, value in headers.items():
        if not isinstance(name, str):
            raise TypeError(f"header names must be str, not {type(name).__name__}")
        if not isinstance(value, bytes | bytearray | memoryview):
            raise TypeError(f"header {name!r} value must be bytes, not {type(value).__name__}")
        raw_name = name.encode("utf-8")
        parts.append(struct.pack("<H", len(raw_name)))
        parts.append(raw_name)
        parts.append(struct.pack("<I", len(value)))
        parts.append(bytes(value))
    return b"".join(parts)


def decode_headers(data: bytes) -> dict[str, bytes]:
    (count,) = struct.unpack_from("<H", data, 0)
    pos = 2
    headers: dict[str, bytes] = {}
    for _ in range(count):
        (name_len,) = struct.unpack_from("<H", data, pos)
        pos += 2
        name = data[pos : pos + name_len].decode("utf-8")
        pos += name_len
        (value_len,) = struct.unpack_from("<I", data, pos)
        pos += 4
        headers[name] = bytes(data[pos : pos + value_len])
        pos += value_len
    if pos != len(data):
        raise ValueError("header block length does not match its contents")
    return headers


# -- batch encoding ----------------------------------------------------------------------

_compressors = threading.local()


def _zstd_compress(data: bytes, level: int) -> bytes:
    compressors = getattr(_compressors, "by_level", None)
    if compressors is None:
        compressors = _compressors.by_level = {}
    compressor = compressors.get(level)
    if compressor is None:
        compressor = compressors[level] = zstandard.ZstdCompressor(level=level)
    return compressor.compress(data)


def _zstd_decompress(data: bytes | memoryview, size: int) -> bytes:
    decompressor = getattr(_compressors, "decompressor", None)
    if decompressor is None:
        decompressor = _compressors.decompressor = zstandard.ZstdDecompressor()
    return decompressor.decompress(data, max_output_size=size)


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
        packed = BATCH_HEADER.pack(
            self.size,
            0,
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
        crc = crc32c(memoryview(packed)[CRC_START:], self.body_crc)
        return struct.pack("<II", self.size, crc) + packed[CRC_START:]

    def to_bytes(self, base_offset: int) -> bytes:
        return self.header(base_offset) + self.body


def encode_batch(
    keys: Sequence[bytes | None],
    values: Sequence[bytes | None],
    timestamps: int | Sequence[int],
    *,
    headers: Sequence[Mapping[str, bytes] | None] | None = None,
    offset_deltas: np.ndarray | None = None,
    last_delta: int | None = None,
    codec: int = CODEC_NONE,
    level: int = 3,
    allow_none_keys: bool = True,
) -> EncodedBatch:
    """Encode one batch body. Keys and values must already be bytes-like or ``None``.

    ``timestamps`` is one int shared by all records (the common case: no column stored) or
    one per record. ``offset_deltas`` is given only when rewriting a batch that lost
    records; fresh batches have contiguous offsets and store no delta column.
    """
    count = len(keys)
    if count == 1 and isinstance(timestamps, int) and offset_deltas is None and last_delta is None:
        return _encode_one(
            keys[0],
            values[0],
            timestamps,
            headers[0] if headers else None,
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
    header_lengths, header_parts = encode_header_column(headers)
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
    parts = [encode_headers(h) if h else b"" for h in headers]
    return np.fromiter(map(len, parts), dtype=np.int32, count=len(parts)), parts


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
        body = _zstd_compress(body, level)
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
TWO_LENGTHS = struct.Struct("<ii")
_THREE_LENGTHS = struct.Struct("<iii")


def _encode_one(
    key: Any,
    value: Any,
    timestamp: int,
    headers: Mapping[str, bytes] | None,
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
    key_len = -1 if key is None else len(key)
    value_len = -1 if value is None else len(value)
    flags = FLAG_SINGLE_TIMESTAMP | FLAG_CONTIGUOUS
    if headers:
        flags |= FLAG_HEADERS
        header_blob = encode_headers(headers)
        lengths = _THREE_LENGTHS.pack(key_len, value_len, len(header_blob))
    else:
        header_blob = b""
        lengths = TWO_LENGTHS.pack(key_len, value_len)
    body = b"".join((lengths, key or b"", value or b"", header_blob))
    body_length = len(body)
    if codec == CODEC_ZSTD:
        body = _zstd_compress(body, level)
    largest = max(key_len, 0) + max(value_len, 0)
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


LENGTH_CRC = struct.Struct("<II")  # batch header bytes [0, 8)
HEADER_TAIL = struct.Struct("<BBHqIIqqI")  # batch header bytes [8, 48), the CRC covers them
SINGLE_FLAGS = FLAG_SINGLE_TIMESTAMP | FLAG_CONTIGUOUS
assert LENGTH_CRC.size + HEADER_TAIL.size == BATCH_HEADER.size


def encode_single(
    key: bytes | None, value: bytes | None, timestamp: int, headers: bytes, base_offset: int
) -> bytes:
    """One uncompressed record as a whole one-record batch, header included.

    The single-append path: byte for byte what ``encode_batch([key], [value], timestamp,
    ...).to_bytes(base_offset)`` gives, without numpy and without an intermediate object, so
    that its only allocations are the record's bytes and the few small ``struct`` packs.
    ``key`` and ``value`` must already be checked (bytes or ``None``); ``headers`` is the
    encoded header block (``encode_headers``) or ``b""``.

    The common record (a key, a value, no headers) takes the first branch, which runs once
    per ``append`` (see docs/benchmarks.md): three packs, one CRC call over the body and
    header bytes [8, 48) concatenated (what the CRC covers, in that order: copying a small
    record once more costs less than a second call of ``crc32c``) and the record joined
    (one ``join`` of three parts costs less than two concatenations).
    """
    if key is not None and value is not None and not headers:
        key_length = len(key)
        value_length = len(value)
        lengths = key_length + value_length
        body = TWO_LENGTHS.pack(key_length, value_length) + key + value
        tail = HEADER_TAIL.pack(
            BATCH_MAGIC,
            CODEC_NONE,
            SINGLE_FLAGS,
            base_offset,
            1,
            0,
            timestamp,
            timestamp,
            lengths + 8,
        )
        # (a large record is not copied once more for it: two calls instead)
        crc = crc32c(body + tail) if lengths < 4096 else crc32c(tail, crc32c(body))
        return b"".join((LENGTH_CRC.pack(lengths + 56, crc), tail, body))
    key_length = -1 if key is None else len(key)
    value_length = -1 if value is None else len(value)
    if headers:
        lengths_block = _THREE_LENGTHS.pack(key_length, value_length, len(headers))
        flags = SINGLE_FLAGS | FLAG_HEADERS
    else:
        lengths_block = TWO_LENGTHS.pack(key_length, value_length)
        flags = SINGLE_FLAGS
    body = b"".join((lengths_block, key or b"", value or b"", headers))
    length = len(body)
    tail = HEADER_TAIL.pack(
        BATCH_MAGIC, CODEC_NONE, flags, base_offset, 1, 0, timestamp, timestamp, length
    )
    return b"".join((LENGTH_CRC.pack(48 + length, crc32c(tail, crc32c(body))), tail, body))


def validate_column(
    items: Sequence[Any], what: str, *, allow_none: bool, single: bool = False
) -> None:
    """Raise :class:`InvalidRecordError` naming the first item that is not bytes (or None):
    by its index in a batch (``record 3: key ...``), or, for a ``single`` record, as the
    argument it is (``key ...``)."""
    from .errors import InvalidRecordError

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


# -- batch decoding ----------------------------------------------------------------------


class BatchHeader(NamedTuple):
    length: int
    crc: int
    magic: int
    codec: int
    flags: int
    base_offset: int
    count: int
    last_delta: int
    first_ts: int
    max_ts: int
    body_length: int

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_delta + 1


def read_batch_header(
    buf: bytes | memoryview, pos: int, end: int
) -> tuple[BatchHeader | None, str]:
    """Parse and sanity-check a batch header at ``pos``; the CRC is not checked here.

    Returns ``(header, "")`` or ``(None, reason)``; a reason starting with ``"incomplete"``
    means the bytes simply end too early (a torn or in-progress write).
    """
    if end - pos < BATCH_HEADER.size:
        return None, f"incomplete batch header ({end - pos} bytes)"
    header = BatchHeader._make(BATCH_HEADER.unpack_from(buf, pos))
    if header.length < BATCH_HEADER.size:
        return None, f"bad batch length {header.length}"
    if header.magic != BATCH_MAGIC:
        return None, f"unknown batch magic {header.magic}"
    if header.codec not in (CODEC_NONE, CODEC_ZSTD):
        return None, f"unknown codec {header.codec}"
    if header.flags & ~KNOWN_FLAGS:
        return None, f"unknown batch flags {header.flags:#x}"
    if header.count > header.last_delta + 1:
        return None, f"batch claims {header.count} records in {header.last_delta + 1} offsets"
    if pos + header.length > end:
        return None, f"incomplete batch ({end - pos} of {header.length} bytes present)"
    return header, ""


def check_batch(buf: bytes | memoryview, pos: int, end: int) -> tuple[BatchHeader | None, str]:
    """Header checks plus the CRC: is there a whole, valid batch at ``pos``?"""
    header, _body_crc, reason = _check_batch_crc(buf, pos, end)
    return header, reason


def _check_batch_crc(buf: Any, pos: int, end: int) -> tuple[BatchHeader | None, int, str]:
    """:func:`check_batch`, also returning the body's share of the CRC (section 6)."""
    header, reason = read_batch_header(buf, pos, end)
    if header is None:
        return None, 0, reason
    with memoryview(buf) as view:
        body_crc = crc32c(view[pos + BATCH_HEADER.size : pos + header.length])
        if crc32c(view[pos + CRC_START : pos + BATCH_HEADER.size], body_crc) != header.crc:
            return None, 0, "batch CRC mismatch"
    return header, body_crc, ""


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
            header, body_crc, reason = _check_batch_crc(buf, pos, end)
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


def find_next_valid_batch(buf: bytes | memoryview, start: int, end: int) -> int | None:
    """Position of the first whole, valid batch after ``start`` (a resynchronising scan).

    Used to tell a torn tail (nothing valid follows) from corruption (valid data follows).
    """
    data = np.frombuffer(buf, dtype=np.uint8, count=end, offset=0)
    candidates = np.flatnonzero(data[start + 9 : end] == BATCH_MAGIC)
    for index in candidates:
        pos = start + 1 + int(index)
        header, _ = check_batch(buf, pos, end)
        if header is not None and header.count > 0:
            return pos
    return None


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
        return self.header.base_offset

    @property
    def next_offset(self) -> int:
        return self.header.next_offset

    @property
    def size_bytes(self) -> int:
        return self.header.length

    @staticmethod
    def _bounds(lengths: np.ndarray) -> tuple[list[int], list[int]]:
        ends = np.cumsum(np.maximum(lengths, 0), dtype=np.int64)
        starts = ends - np.maximum(lengths, 0)
        return starts.tolist(), ends.tolist()

    def keys(self) -> list[bytes | None]:
        return _split(self.keys_blob, self.key_lengths)

    def values(self) -> list[bytes | None]:
        return _split(self.values_blob, self.value_lengths)

    def headers(self) -> list[dict[str, bytes] | None]:
        if self.header_lengths is None or self.headers_blob is None:
            return [None] * len(self)
        blob = bytes(self.headers_blob)
        return [
            decode_headers(blob[s:e]) if e > s else None
            for s, e in zip(*self._bounds(self.header_lengths), strict=True)
        ]

    def key_digest_input(self) -> tuple[bytes, np.ndarray, np.ndarray]:
        """Keys blob plus start/end positions, for hashing keys without Python objects."""
        lengths = np.maximum(self.key_lengths, 0).astype(np.int64)
        ends = np.cumsum(lengths)
        return bytes(self.keys_blob), ends - lengths, ends

    def records(
        self, keys: Sequence[Any] | None = None, values: Sequence[Any] | None = None
    ) -> Iterator[Record]:
        """The records; ``keys``/``values`` (one item per record) replace the stored ones,
        for keys and values a deserializer made into objects (``serde.py``)."""
        if self.decoded is not None and keys is None and values is None:
            return iter(self.decoded)
        # built by map() in C: no Python frame (generator step) per record
        offsets = self.offsets.tolist()
        heads = repeat(None, len(offsets)) if self.header_lengths is None else self.headers()
        columns = zip(
            offsets,
            self.keys() if keys is None else keys,
            self.values() if values is None else values,
            self.timestamps.tolist(),
            heads,
            strict=True,
        )
        return map(tuple.__new__, repeat(Record), columns)

    def select(self, mask: np.ndarray) -> RecordBatch:
        """The records where ``mask`` is true, as a batch (used to cut a batch at an offset)."""
        keys = self.keys()
        values = self.values()
        heads = self.headers()
        idx = np.flatnonzero(mask).tolist()
        selected = _columns_batch(
            self.header,
            self.position,
            self.offsets[mask],
            self.timestamps[mask],
            [keys[i] for i in idx],
            [values[i] for i in idx],
            [heads[i] for i in idx],
        )
        selected.stored_batches = self.stored_batches
        return selected


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
        out = list(_layout((sizes, b"s"), count=n).unpack_from(blob))
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
    count = header.count
    body: bytes | memoryview = memoryview(buf)[pos + BATCH_HEADER.size : pos + header.length]
    if header.codec == CODEC_ZSTD:
        body = _zstd_decompress(body, header.body_length)
    if len(body) != header.body_length:
        raise ValueError(f"body is {len(body)} bytes, header says {header.body_length}")
    if count == 1:
        one = _decode_one(body, pos, header)
        if one is not None:
            return one
    return _decode_columns(body, pos, header)


def decode_columns(buf: bytes | memoryview, pos: int, header: BatchHeader) -> RecordBatch:
    """:func:`decode_batch` always through the columnar path (the reference the fast
    paths are tested against)."""
    body: bytes | memoryview = memoryview(buf)[pos + BATCH_HEADER.size : pos + header.length]
    if header.codec == CODEC_ZSTD:
        body = _zstd_decompress(body, header.body_length)
    if len(body) != header.body_length:
        raise ValueError(f"body is {len(body)} bytes, header says {header.body_length}")
    return _decode_columns(body, pos, header)


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


# -- runs of small batches ---------------------------------------------------------------
#
# A log written by single appends is a file of one-record batches. Decoding each through
# the columnar path above costs a dozen numpy calls per record; instead, readers take a run
# of consecutive small batches at once: :func:`scan_small_run` walks them by their length
# fields, checks every batch's own CRC for the whole run at once (:func:`rows_crcs` for
# batches of one length, one crc32c call per body otherwise), checks their headers
# together, and :func:`decode_small_run` returns the run as one RecordBatch whose columns are the
# concatenation of the batches' columns (the records, offsets, timestamps and headers of
# ``decode_batch`` for each batch, in order). Runs of batches alike (records of one size,
# the commonest log of single appends) take shorter paths still: their header fields are
# checked as a few words per batch (:func:`_check_alike`), their CRC messages gathered
# into a per-thread scratch buffer (:func:`_messages_crcs`), and their blobs copied as one
# column range of the rows each (:func:`_decode_alike`).

SMALL_BATCH_RECORDS = 8
"""A batch of at most this many records is *small* (typically one single append)."""

_LENGTH_CRC_COUNT = struct.Struct("<II12xI")
_HEADER_DTYPE = np.dtype(
    [
        ("length", "<u4"),
        ("crc", "<u4"),
        ("magic", "u1"),
        ("codec", "u1"),
        ("flags", "<u2"),
        ("base_offset", "<i8"),
        ("count", "<u4"),
        ("last_delta", "<u4"),
        ("first_ts", "<i8"),
        ("max_ts", "<i8"),
        ("body_length", "<u4"),
    ]
)
assert _HEADER_DTYPE.itemsize == BATCH_HEADER.size
_SIMPLE_FLAGS = FLAG_SINGLE_TIMESTAMP | FLAG_CONTIGUOUS


@dataclass(slots=True)
class SmallRun:
    """Consecutive whole, valid small batches found by :func:`scan_small_run`."""

    positions: np.ndarray  # int64 byte positions in the buffer scanned
    headers: np.ndarray  # their headers (structured, ``_HEADER_DTYPE``)
    end: int  # position just after the last batch
    length: int = 0  # the one length of every batch, 0 when they differ
    simple: bool = False  # known: every batch is one uncompressed record, flags alike
    bases: np.ndarray | None = None  # the base offsets (int64), where already gathered

    def __len__(self) -> int:
        return len(self.positions)


# batch header bytes [8, 12) as one little-endian word: magic, codec, flags. A word passes
# check_batch's field checks when its magic is BATCH_MAGIC and no bit outside the codecs
# (0, 1) and the known flags is set
_WORD_MASK = 0xFF | ((0xFF ^ CODEC_ZSTD) << 8) | ((0xFFFF ^ KNOWN_FLAGS) << 16)
assert CODEC_NONE == 0 and CODEC_ZSTD == 1  # the codecs the mask lets through
_SIMPLE_WORDS = (
    BATCH_MAGIC | (_SIMPLE_FLAGS << 16),
    BATCH_MAGIC | ((_SIMPLE_FLAGS | FLAG_HEADERS) << 16),
)


def scan_small_run(
    buf: bytes | memoryview | Any,
    pos: int,
    end: int,
    max_records: int = 1 << 62,
    max_bytes: int = 1 << 62,
) -> SmallRun | None:
    """The run of consecutive small batches starting at ``pos``, or ``None`` when fewer
    than two are there.

    Every batch of the run passes exactly the checks of :func:`check_batch`, done for the
    whole run at once where they can be: the run's batches are found by their lengths
    (:func:`_walk`); the CRCs of a run of one batch length are computed together
    (:func:`rows_crcs`), else each body's CRC is one ``crc32c`` call, continued over the
    48-byte headers for all batches together (:func:`_continue_crc`); every batch's CRC is
    compared with its own stored CRC, and the header fields are checked as columns (as
    two words per batch where every batch has the first one's fields, :func:`_check_alike`).
    The run stops before the first batch that is not small, not whole below ``end``, not
    valid (left to :func:`check_batch`, which says why), whose offsets
    do not follow the previous one's, or that would take it past ``max_bytes`` bytes or
    ``max_records`` records. The run's ``headers`` are a view of ``buf`` where its batches
    have one length.
    """
    header_size = BATCH_HEADER.size
    stop = min(end, pos + max_bytes)
    # a batch holds at least one record unless it is empty: at most max_records batches
    # (cut to max_records records below)
    found, pos, length = _walk(buf, pos, stop, max(max_records, 2))
    n = len(found)
    if n < 2:
        return None
    raw = np.frombuffer(buf, dtype=np.uint8, count=pos)
    positions = np.asarray(found, dtype=np.int64)
    if length:
        # one batch length throughout (records of one size): the run is rows of one
        # length, the headers one strided column of them (a view: nothing is copied)
        first = int(positions[0])
        rows = raw[first:pos].reshape(n, length)
        heads = rows[:, :header_size].view(_HEADER_DTYPE)[:, 0]
        crcs = rows_crcs(rows)
        alike = _check_alike(rows, heads, crcs, max_records)
        if alike is not None:
            bad, simple, bases = alike
            return _cut(SmallRun(positions, heads, pos, length, simple, bases), bad)
    else:
        # lengths that vary: every header gathered as one 48-byte item, every body cut out
        # as a bytes object by one struct unpack (no slice object per batch), each body's
        # CRC one crc32c call, continued over its header for all batches at once
        block = _items_at(raw, positions, header_size).view(np.uint8).reshape(n, header_size)
        heads = block.view(_HEADER_DTYPE).ravel()
        body_lengths = np.diff(positions, append=pos) - header_size
        layout = _layout((b"%d" % header_size, b"x"), (body_lengths, b"s"), count=n)
        bodies = layout.unpack_from(buf, int(positions[0]))
        body_crcs = np.frombuffer(array("I", map(crc32c, bodies)), dtype=np.uint32)
        crcs = _continue_crc(body_crcs, block[:, CRC_START:])
    count = heads["count"].astype(np.int64)
    bad = (
        (crcs != heads["crc"])
        | (heads["magic"] != BATCH_MAGIC)
        | (heads["codec"] > CODEC_ZSTD)
        | ((heads["flags"] & (0xFFFF ^ KNOWN_FLAGS)) != 0)
        | (count > heads["last_delta"].astype(np.int64) + 1)
    )
    bad[1:] |= heads["base_offset"][1:] <= heads["base_offset"][:-1] + heads["last_delta"][:-1]
    bad |= np.cumsum(count) > max(max_records, count[0] + count[1])
    return _cut(SmallRun(positions, heads, pos, length), bad)


def _check_alike(
    rows: np.ndarray, heads: np.ndarray, crcs: np.ndarray, max_records: int
) -> tuple[np.ndarray, bool, np.ndarray] | None:
    """:func:`scan_small_run`'s checks for a run whose batches all have the first one's
    magic, codec, flags, count and last delta (single appends of records of one size),
    in fewer numpy passes: those fields compared once as two words per batch, and the
    first batch's fields checked as :func:`check_batch` does. Returns where a batch is bad
    (its CRC, its offsets, or past ``max_records``), whether every batch is one
    uncompressed record with one timestamp and contiguous offsets, and the base offsets
    (gathered once into a contiguous array, for the offsets check and the decoder);
    ``None`` when the fields differ between batches (the general checks then run)."""
    words = rows[:, CRC_START : CRC_START + 4].view("<u4")[:, 0]
    counts = rows[:, 20:28].view("<u8")[:, 0]  # count, then last_delta
    word, both = int(words[0]), int(counts[0])
    count, last_delta = both & 0xFFFFFFFF, both >> 32
    if word & _WORD_MASK != BATCH_MAGIC or count > last_delta + 1:
        return None
    if not bool((words == word).all() and (counts == both).all()):
        return None
    bases = heads["base_offset"].astype(np.int64)
    bad = crcs != heads["crc"]
    bad[1:] |= bases[1:] <= bases[:-1] + last_delta
    # np.cumsum(count) > max(max_records, 2 * count), for one count per batch
    limit = max(max_records, 2 * count)
    if count and len(bad) * count > limit:
        bad[limit // count :] = True
    return bad, count == 1 and word in _SIMPLE_WORDS, bases


def _cut(run: SmallRun, bad: np.ndarray) -> SmallRun | None:
    """``run`` up to its first bad batch (``None`` when fewer than two are left)."""
    if not bool(bad.any()):
        return run
    n = int(np.argmax(bad))
    if n < 2:
        return None
    run.end = int(run.positions[n])
    run.positions, run.headers = run.positions[:n], run.headers[:n]
    if run.bases is not None:
        run.bases = run.bases[:n]
    return run


_LENGTH_COUNT = struct.Struct("<I16xI")
_LEAP_AFTER = 8  # equal lengths in a row before _walk tries a leap


def _walk(
    buf: Any, pos: int, stop: int, max_batches: int
) -> tuple[np.ndarray | list[int], int, int]:
    """Positions of consecutive small batches whose lengths keep them whole below
    ``stop`` (nothing else is checked here), where they end, and their one length when
    they all have one (each length field was read, or leapt over as equal to it), else 0.
    The positions are an int64 array (an empty list when there is no batch).

    Batches are found one length field at a time; after :data:`_LEAP_AFTER` equal
    lengths in a row (single appends of records of one size), the length and count
    fields of the batches that would follow at that spacing are read as one numpy
    column and the walk leaps over every one that matches. The positions of a leap are
    never made one by one: a run of one length is an ``arange``. At the first length
    that differs from the one before (records of varied sizes), the rest is walked by
    :func:`_step`, which reads only the length fields, and the count fields of the
    batches it found are checked here at once.
    """
    first = pos
    found: list[int] = []  # positions stepped on since the last leap
    append = found.append
    parts: list[np.ndarray] = []  # the positions before those, in order
    taken = 0  # how many positions ``parts`` holds
    unpack = _LENGTH_COUNT.unpack_from
    last = stop - BATCH_HEADER.size
    header_size = BATCH_HEADER.size
    small = SMALL_BATCH_RECORDS
    previous = -1
    uniform = True
    same = 0
    leap_after = _LEAP_AFTER
    raw: np.ndarray | None = None
    for _ in range(max_batches):  # one batch found per turn (and a leap adds many)
        if pos > last:
            break
        length, count = unpack(buf, pos)
        following = pos + length
        if count > small or not pos + header_size <= following <= stop:
            break
        append(pos)
        pos = following
        if length != previous:
            if previous >= 0:
                # lengths vary (records of varied sizes): step on through the rest
                uniform = False
                parts.append(np.array(found, dtype=np.int64))
                taken += len(found)
                found.clear()
                pos = _chase(buf, pos, stop, max_batches - taken, parts, found)
                break
            previous = length
            same = 0
        elif same + 1 < leap_after:
            same += 1
        else:
            same = 0
            if raw is None:
                raw = np.frombuffer(buf, dtype=np.uint8, count=stop)
            rows = min((stop - pos) // length, max_batches - taken - len(found))
            if rows <= 0:
                continue  # no room for another batch of this length: walk on
            # the length and count fields of each would-be batch, as strided views
            lengths = np.ndarray((rows,), "<u4", raw, pos, (length,))
            counts = np.ndarray((rows,), "<u4", raw, pos + 20, (length,))
            matching = (lengths == length) & (counts <= small)
            leap = rows if bool(matching.all()) else int(np.argmin(matching))
            if leap < leap_after:
                leap_after *= 2  # lengths only look alike: try less often
            if leap:
                parts.append(np.array(found, dtype=np.int64))
                parts.append(np.arange(pos, pos + leap * length, length, dtype=np.int64))
                taken += len(found) + leap
                found.clear()
                pos += leap * length
                if taken >= max_batches:
                    break
    positions: np.ndarray | list[int] = found
    if uniform and previous > 0:  # (one arange rather than the parts joined)
        positions = np.arange(first, pos, previous, dtype=np.int64)
    elif not uniform:
        # stepped on with _step: its batches' counts are checked here, all at once
        positions = np.frombuffer(array("q", found), dtype=np.int64)
        if parts:
            positions = np.concatenate([*parts, positions])
        raw = np.frombuffer(buf, dtype=np.uint8, count=pos)
        counts = np.ndarray((pos - 23,), "<u4", raw, 20, (1,))[positions]
        over = np.flatnonzero(counts > small)
        if over.size:
            pos = int(positions[over[0]])
            positions = positions[: over[0]]
    elif parts:
        positions = np.concatenate([*parts, np.array(found, dtype=np.int64)])
    if len(positions) > max_batches:  # (steps after a leap)
        pos = int(positions[max_batches])
        positions = positions[:max_batches]
    return positions, pos, previous if uniform and previous > 0 else 0


_DIGITS: dict[int, np.ndarray] = {}
_TABLE_WIDTH = 4  # counts below 10**4 are written by one table lookup each


def _digits(values: np.ndarray) -> np.ndarray:
    """``values`` (>= 0) as rows of fixed-width zero-padded ASCII decimal digits."""
    width = len(str(int(values.max())))
    if width <= _TABLE_WIDTH:
        table = _DIGITS.get(width)
        if table is None:
            text = "".join(f"{v:0{width}d}" for v in range(10**width)).encode()
            table = _DIGITS[width] = np.frombuffer(text, dtype=np.uint8).reshape(-1, width)
        return table[values]
    powers = 10 ** np.arange(width - 1, -1, -1, dtype=np.uint64)
    return (values.astype(np.uint64)[:, None] // powers % np.uint64(10) + np.uint64(48)).astype(
        np.uint8
    )


def _layout(*columns: tuple[np.ndarray | bytes, bytes], count: int) -> struct.Struct:
    """A ``struct`` layout of ``count`` consecutive items, item ``i`` made of, for each
    column in turn, ``counts[i]`` repetitions of the column's format code (``x`` skips
    bytes, ``s`` takes them as one ``bytes`` object); a column whose counts are ``bytes``
    has that one (decimal) count for every item.

    Why: one ``unpack_from`` with this layout cuts a buffer into ``bytes`` objects of
    lengths that vary, in C, at a fraction of the cost of a slice object and a
    ``__getitem__`` call per piece. The format is written by numpy as fixed-width
    zero-padded decimal counts (``struct`` reads ``048x`` as ``48x``), not formatted
    number by number. Every count must be >= 0."""
    if not count:
        return struct.Struct(b"")
    parts = []
    for counts, code in columns:
        if isinstance(counts, bytes):
            text = np.frombuffer(counts + code, dtype=np.uint8)
            parts.append(np.broadcast_to(text, (count, len(text))))
        else:
            parts.append(_digits(counts))
            parts.append(np.full((count, 1), code[0], dtype=np.uint8))
    return struct.Struct(np.hstack(parts).tobytes())


def _items_at(raw: np.ndarray, starts: np.ndarray, width: int) -> np.ndarray:
    """``raw[start : start + width]`` for every start, as one opaque (``V``) item each
    (a copy at memcpy speed, where a 2-D gather copies a byte at a time)."""
    windows = np.ndarray((len(raw) - width + 1,), f"V{width}", raw, 0, (1,))
    return windows[starts]


_LENGTH = struct.Struct("<I")


def _step(buf: Any, pos: int, stop: int, turns: int, found: list[int]) -> int:
    """:func:`_walk` for lengths that vary: up to ``turns`` more batches whose lengths
    keep them whole below ``stop``, found one length field at a time, their positions
    appended to ``found``; returns where they end. The count fields are left to the
    caller, which checks them for all these batches at once.

    Why a loop of its own: the fewest Python operations per batch (one ``unpack_from``,
    two comparisons), about 2/3 of the cost of :func:`_walk`'s loop, which also tracks
    equal lengths for its leaps."""
    unpack = _LENGTH.unpack_from
    header_size = BATCH_HEADER.size
    append = found.append
    try:
        for _ in range(turns):
            (length,) = unpack(buf, pos)
            following = pos + length
            if length < header_size or following > stop:
                break
            append(pos)
            pos = following
    except struct.error:  # fewer than 4 bytes left in the buffer
        pass
    return pos


_CHASE_SPACING = 4096  # bytes between the places where _chase starts a chain
_CHASE_MIN_BYTES = 8 * _CHASE_SPACING  # less to walk: _step alone


def _chase(
    buf: Any, pos: int, stop: int, turns: int, parts: list[np.ndarray], found: list[int]
) -> int:
    """:func:`_step`, the length fields followed by numpy along many chains at once:
    the positions it finds are appended to ``parts`` as arrays (and to ``found`` where
    it falls back to :func:`_step`); returns where they end.

    Why: following the lengths one batch at a time costs about 130 ns a batch in Python.
    Here the walk starts anew every :data:`_CHASE_SPACING` bytes, at the first place
    after it that looks like the start of a batch (the batch at ``pos``'s count and
    last-delta bytes, found by ``find``, with a length that matches its body length),
    and all those chains are followed together, one numpy step for one batch of each.
    Nothing found this way is trusted: chain ``j`` (from the true ``pos`` for the
    first) must land exactly on the start of chain ``j + 1``, so every position is the
    one a walk from ``pos`` reaches, with the same checks (a length of at least a
    header, the batch whole below ``stop``). Where a chain ends elsewhere (a start
    that only looked like a batch) the chains after it are dropped and :func:`_step`
    walks on from where it ended; where a batch fails the checks, the walk ends there.
    """
    header_size = BATCH_HEADER.size
    if (
        stop - pos < _CHASE_MIN_BYTES
        or turns < (stop - pos) // header_size + 1
        or not isinstance(buf, bytes | mmap.mmap)
    ):
        return _step(buf, pos, stop, turns, found)
    raw = np.frombuffer(buf, dtype=np.uint8)
    fields = np.ndarray((len(raw) - 3,), "<u4", raw, 0, (1,))  # a u4 at every byte
    # where a chain may be read (past ``stop`` for the chains that are done): a position
    # in the last 3 bytes reads the u4 before it instead, and such a batch fails the
    # checks below whatever it reads (no room for a header before ``stop``)
    limit = len(raw) - 4
    pattern = buf[pos + 20 : pos + 28]  # count and last delta
    find = buf.find
    starts = [pos]
    for at in range(pos + _CHASE_SPACING, stop - header_size, _CHASE_SPACING):
        hit = find(pattern, at + 20, stop)
        if hit < 0:
            break
        starts.append(hit - 20)
    points = np.unique(np.array(starts, dtype=np.int64))
    # (a start whose length is not its body length + header is no simple batch: dropped)
    later = points[1:]
    later = later[later <= stop - header_size]
    looks = (fields[later] == fields[later + 44].astype(np.int64) + header_size) & (
        later + fields[later] <= stop
    )
    points = np.concatenate([points[:1], later[looks]])
    targets = np.append(points[1:], stop)
    # a chain of valid batches takes at most (its span // header_size) steps; one that
    # takes more has a bad length (checked below) and is stopped there
    steps = int((targets - points).max()) // header_size + 1
    at_ = points
    walked: list[np.ndarray] = []  # where each chain is before each step
    for _ in range(steps):
        moving = at_ < targets
        if not bool(moving.any()):
            break
        walked.append(at_)
        # (a chain that is done stays where it is, and may be past the buffer: clipped)
        at_ = at_ + fields[np.minimum(at_, limit)] * moving
    # chains in order, up to the first that does not end on the next one's start; a
    # chain's positions are where it was before its steps while short of its target
    wrong = at_ != targets
    j = int(np.argmax(wrong)) if bool(wrong.any()) else len(points) - 1
    chained = np.stack(walked, axis=1)[: j + 1]
    positions = chained[chained < targets[: j + 1, None]]
    # the checks of _step, for every batch at once: the walk ends at the first that fails
    lengths = fields[np.minimum(positions, limit)].astype(np.int64)
    bad = np.flatnonzero((lengths < header_size) | (positions + lengths > stop))
    if bad.size:
        cut = int(bad[0])
        parts.append(positions[:cut])
        return int(positions[cut])
    parts.append(positions)
    end = int(at_[j])
    if bool(wrong[j]):
        # chain j passed the start of chain j + 1 (a start that only looked like one)
        end = _step(buf, end, stop, turns - len(positions), found)
    return end


_CRC_TABLES: tuple[np.ndarray, np.ndarray, int] | None = None


def _crc_tables() -> tuple[np.ndarray, np.ndarray, int]:
    """Tables of CRC-32C's linearity for 40-byte messages (a batch header's CRC part).

    ``crc32c(m, c) == ~(zero[~c] ^ part[m])`` where ``zero[x]`` is the register after 40
    zero bytes from register ``x`` and ``part[m]`` the register after ``m`` from 0; both
    are linear over GF(2), so each is a XOR of per-byte table entries (4 for ``zero``, one
    per byte position for ``part``). Built once from ``crc32c`` itself.
    """
    global _CRC_TABLES
    if _CRC_TABLES is None:
        size = BATCH_HEADER.size - CRC_START
        ones = 0xFFFFFFFF
        zeros = bytes(size)
        zero = np.array(
            [[crc32c(zeros, (v << (8 * j)) ^ ones) ^ ones for v in range(256)] for j in range(4)],
            dtype=np.uint32,
        )
        part = np.zeros((size, 256), dtype=np.uint32)
        message = bytearray(size)
        for i in range(size):
            for v in range(256):
                message[i] = v
                part[i, v] = crc32c(bytes(message), ones) ^ ones
            message[i] = 0
        _CRC_TABLES = (zero, part, ones)
    return _CRC_TABLES


def _continue_crc(crcs: np.ndarray, messages: np.ndarray) -> np.ndarray:
    """``crc32c(messages[i], crcs[i])`` for every row of an (n, 40) uint8 array at once.

    Rows of one run differ in few byte positions (offsets, timestamps): the first row's
    CRC part is computed once and the others are corrected only where they differ."""
    zero, part, ones = _crc_tables()
    registers = crcs ^ np.uint32(ones)
    shifted = (
        zero[0][registers & 0xFF]
        ^ zero[1][(registers >> 8) & 0xFF]
        ^ zero[2][(registers >> 16) & 0xFF]
        ^ zero[3][registers >> 24]
    )
    head = messages[0]
    constant = crc32c(head.tobytes(), ones) ^ ones
    width = messages.shape[1]
    if width % 8 == 0 and messages.strides[1] == 1 and messages.strides[0] % 8 == 0:
        # the varying byte positions found 8 at a time: the OR of every row's XOR with the
        # first row, as words, has a nonzero byte exactly where some row differs (a column
        # at a time: numpy reduces a narrow 2-D array over its rows slowly)
        words = messages.view("<u8")
        varying = []
        for j in range(width // 8):
            column = words[:, j]
            folded = int(np.bitwise_or.reduce(column ^ column[0]))
            varying += [8 * j + b for b in range(8) if (folded >> (8 * b)) & 0xFF]
    else:
        varying = np.flatnonzero((messages != head).any(axis=0)).tolist()
    acc = np.full(len(messages), 0, dtype=np.uint32)
    for i in varying:
        acc ^= part[i][messages[:, i]]
        constant ^= int(part[i][head[i]])
    return (shifted ^ acc) ^ np.uint32(constant ^ ones)


_ROWS_CRC_MAX_LENGTH = 4096  # longer batches: one crc32c call each (tables would be large)
_ROWS_CRC_MAX_VARYING = 40  # a table lookup per varying byte costs ~1/40 of a crc32c call
_SHIFT_ROWS: dict[int, np.ndarray] = {}


def _shift_row(distance: int) -> np.ndarray:
    """``row[v]``: the CRC-32C register (started at 0, no final inversion) after the byte
    ``v`` followed by ``distance`` zero bytes. Built from ``crc32c`` itself, bit by bit
    (the register is linear in ``v``), and kept."""
    row = _SHIFT_ROWS.get(distance)
    if row is None:
        ones = 0xFFFFFFFF
        zeros = bytes(distance)
        bits = [crc32c(bytes((1 << b,)) + zeros, ones) ^ ones for b in range(8)]
        values = np.arange(256)
        row = np.zeros(256, dtype=np.uint32)
        for b, contribution in enumerate(bits):
            row[(values >> b) & 1 == 1] ^= np.uint32(contribution)
        _SHIFT_ROWS[distance] = row
    return row


def rows_crcs(rows: np.ndarray) -> np.ndarray:
    """The CRC of every stored batch of an ``(n, length)`` uint8 array whose rows are
    whole batches of one length, each computed exactly as :func:`check_batch` does
    (``crc32c`` of the body continued over header bytes [8, 48)), for the caller to
    compare with the CRC fields in one vector comparison.

    Two ways, the same values: by table (:func:`_rows_crcs_by_table`) where few byte
    columns vary, else one ``crc32c`` call per row over its message (body, then header
    bytes [8, 48)), the messages gathered a block at a time into a scratch buffer whose
    rows are ready-made memoryviews (:func:`_messages_crcs`).
    """
    crcs = _rows_crcs_by_table(rows)
    if crcs is not None:
        return crcs
    return _messages_crcs(rows)


_CRC_SCRATCH_BYTES = 256 << 10  # a block of messages: stays in a core's L2 cache
_CRC_SCRATCH_LENGTHS = 4  # message lengths whose views a thread keeps at once


class _CrcScratch(threading.local):
    """One thread's scratch buffer for :func:`_messages_crcs`, and per message length the
    buffer cut into memoryviews of that length. ``busy`` guards against a re-entrant call
    (a signal handler that reads a log), which then takes the path without scratch."""

    def __init__(self) -> None:
        self.buffer = bytearray(_CRC_SCRATCH_BYTES)
        self.views: dict[int, tuple[np.ndarray, list[memoryview]]] = {}
        self.busy = False

    def block(self, size: int) -> tuple[np.ndarray, list[memoryview]]:
        """The buffer as an ``(rows, size)`` array and its rows as memoryviews."""
        found = self.views.get(size)
        if found is None:
            if len(self.views) >= _CRC_SCRATCH_LENGTHS:
                self.views.clear()
            rows = _CRC_SCRATCH_BYTES // size
            view = memoryview(self.buffer)
            found = self.views[size] = (
                np.frombuffer(self.buffer, dtype=np.uint8, count=rows * size).reshape(rows, size),
                [view[i : i + size] for i in range(0, rows * size, size)],
            )
        return found


_crc_scratch = _CrcScratch()


def _cells(columns: np.ndarray) -> np.ndarray:
    """The rows of a 2-D uint8 array whose rows are contiguous, as one opaque (``V``)
    item each, without a copy: numpy copies such items a row at a time, where it copies
    the bytes of a 2-D slice one column step at a time (2-5 times slower for rows of
    16-124 bytes). Rows must not be empty."""
    return columns.view(f"V{columns.shape[1]}")[:, 0]


assert array("I").itemsize == 4  # read back as uint32


def _messages_crcs(rows: np.ndarray) -> np.ndarray:
    """:func:`rows_crcs` by one ``crc32c`` call per row (any row contents).

    Why a scratch buffer cut into memoryviews: each row's message must be contiguous
    (its header part follows its body), so it is copied anyway; copied into the same
    scratch block after block, the messages are read by ``crc32c`` through views made
    once per thread, where a ``bytes`` item per row (``tolist``) cost a fresh object
    each, and fresh memory (page faults) wherever the allocator had handed its pages back.
    The CRCs come back through an ``array`` (its conversion of ``int`` objects costs less
    than ``numpy.fromiter``'s).
    """
    n, length = rows.shape
    header_size = BATCH_HEADER.size
    body = length - header_size
    size = length - CRC_START
    scratch = _crc_scratch
    if scratch.busy or size > _CRC_SCRATCH_BYTES // 2:
        messages = np.empty((n, size), dtype=np.uint8)
        messages[:, :body] = rows[:, header_size:]
        messages[:, body:] = rows[:, CRC_START:header_size]
        items = messages.view(f"V{size}").ravel().tolist()
        return np.fromiter(map(crc32c, items), dtype=np.uint32, count=n)
    scratch.busy = True
    try:
        block, views = scratch.block(size)
        per = len(views)
        crcs = np.empty(n, dtype=np.uint32)
        # (an empty body has no cells to copy)
        copies = [(_cells(rows[:, CRC_START:header_size]), _cells(block[:, body:]))]
        if body:
            copies.append((_cells(rows[:, header_size:]), _cells(block[:, :body])))
        for start in range(0, n, per):
            stop = min(n, start + per)
            for source, target in copies:
                target[: stop - start] = source[start:stop]
            items = views if stop - start == per else views[: stop - start]
            crcs[start:stop] = np.frombuffer(array("I", map(crc32c, items)), dtype=np.uint32)
        return crcs
    finally:
        scratch.busy = False


def _rows_crcs_by_table(rows: np.ndarray) -> np.ndarray | None:
    """:func:`rows_crcs` by table lookups, or ``None`` when that would not be faster
    (rows too long, or too many byte columns vary).

    Why it is exact and fast: the CRC is affine over GF(2), so for two messages ``a`` and
    ``b`` of one length ``crc(a) ^ crc(b)`` is the XOR, over the byte positions ``i``
    where they differ, of a table entry for ``(a[i] ^ b[i], distance of i to the end)``.
    Single appends of records of one size differ in few byte positions (offsets,
    timestamps, part of the key): the first row's CRC is one ``crc32c`` call and every
    other row's is the first's corrected by one vectorised table lookup per varying
    column. Each row's own bytes enter its own CRC; nothing is combined across rows.
    """
    n, length = rows.shape
    if length > _ROWS_CRC_MAX_LENGTH or length <= BATCH_HEADER.size or n < 2:
        return None
    header_size = BATCH_HEADER.size
    probe = min(n, 16)
    if _varying_columns(rows[:probe]).size > _ROWS_CRC_MAX_VARYING:
        return None  # varied records (random values): not worth the full comparison
    varying = _varying_columns(rows)
    varying = varying[varying >= CRC_START]  # the length and CRC fields are not covered
    if varying.size > _ROWS_CRC_MAX_VARYING:
        return None
    first = rows[0]
    crc = crc32c(first[CRC_START:header_size].tobytes(), crc32c(first[header_size:].tobytes()))
    # the message is body (file columns [48, length)) then header bytes [8, 48): the
    # distance of a file column to the message's last byte
    message_last = length - CRC_START - 1
    body = varying >= header_size
    index = np.where(body, varying - header_size, varying - CRC_START + length - header_size)
    acc = np.zeros(n, dtype=np.uint32)
    for column, distance in zip(varying.tolist(), (message_last - index).tolist(), strict=True):
        acc ^= _shift_row(distance)[rows[:, column]]
    return acc ^ np.uint32(int(acc[0]) ^ crc)


def _varying_columns(rows: np.ndarray) -> np.ndarray:
    """Column indexes where some row differs from the row before it (every column that
    is not constant), compared a word at a time where the row length allows."""
    length = rows.shape[1]
    for width in (8, 4, 2):
        if length % width == 0 and rows.flags.c_contiguous:
            words = rows.view(f"<u{width}")
            wide = np.flatnonzero((words[1:] != words[:-1]).any(axis=0))
            return (wide[:, None] * width + np.arange(width)).ravel()
    return np.flatnonzero((rows[1:] != rows[:-1]).any(axis=0))


def decode_small_run(buf: bytes | memoryview | Any, run: SmallRun) -> RecordBatch:
    """One :class:`RecordBatch` holding the records of every batch of ``run``.

    Its columns are the concatenation of what :func:`decode_batch` gives for each batch;
    ``header`` describes the run as a whole (``length`` its bytes, ``base_offset`` the
    first batch's, ``last_delta`` up to the last batch's last offset, ``count`` every
    record; ``codec``, ``flags`` and ``crc`` 0 as the columns are explicit),
    ``position`` is the first batch's and ``stored_batches`` the number of batches.
    Raises ``ValueError`` when a batch's columns do not add up to its body, or the
    decompressor's error for a body that does not decompress (callers then decode the
    batches one by one to report which).
    """
    if run.simple and run.length:
        batch = _decode_alike(buf, run)
        if batch is not None:
            return batch
    heads = run.headers
    simple = (
        (heads["codec"] == CODEC_NONE)
        & (heads["count"] == 1)
        & ((heads["flags"] | FLAG_HEADERS) == (_SIMPLE_FLAGS | FLAG_HEADERS))
    )
    if bool(simple.all()):
        return _decode_simple(buf, run.positions, heads, run.end)
    pieces: list[RecordBatch] = []
    positions = run.positions.tolist()
    ends = [*positions[1:], run.end]
    flags = simple.tolist()
    i = 0
    while i < len(positions):
        j = i
        while j < len(positions) and flags[j]:
            j += 1
        if j > i:
            pieces.append(_decode_simple(buf, run.positions[i:j], heads[i:j], ends[j - 1]))
        if j < len(positions):
            header = BatchHeader._make(heads[j].item())
            pieces.append(decode_batch(buf, positions[j], header))
            pieces[-1].position = positions[j]
        i = j + 1
    return concat_batches(pieces)


def _decode_alike(buf: bytes | memoryview | Any, run: SmallRun) -> RecordBatch | None:
    """:func:`_decode_simple` for the commonest run: batches of one length (known
    simple, flags alike), no headers, and every record with the first one's key and
    value lengths, neither absent. The lengths are then two numbers: they are checked
    against every batch's length columns and body length in two comparisons, and each
    blob is one column range of the rows. ``None`` for any other run."""
    n, length = len(run), run.length
    heads = run.headers
    header_size = BATCH_HEADER.size
    body = length - header_size
    if int(heads["flags"][0]) & FLAG_HEADERS:
        return None
    first = int(run.positions[0])
    rows = np.frombuffer(buf, dtype=np.uint8, count=run.end)[first:].reshape(n, length)
    # key and value lengths as one 8-byte word per batch: one comparison checks both
    pair = rows[:, header_size : header_size + 8].view("<u8")[:, 0]
    both = int(pair[0])
    key_length, value_length = TWO_LENGTHS.unpack(both.to_bytes(8, "little"))
    if key_length < 0 or value_length < 0 or 8 + key_length + value_length != body:
        return None
    if not bool((pair == both).all() and (heads["body_length"] == body).all()):
        return None
    at = header_size + 8
    keys = rows[:, at : at + key_length]
    values = rows[:, at + key_length :]
    base = heads["base_offset"].astype(np.int64) if run.bases is None else run.bases
    timestamps = heads["first_ts"].astype(np.int64)
    header = BatchHeader(
        run.end - first,
        0,
        BATCH_MAGIC,
        CODEC_NONE,
        0,
        int(base[0]),
        n,
        int(base[-1]) + int(heads["last_delta"][-1]) - int(base[0]),
        int(timestamps[0]),
        int(heads["max_ts"].max()),
        0,
    )
    return RecordBatch(
        header,
        first,
        base,
        timestamps,
        np.full(n, key_length, dtype=np.int32),
        np.full(n, value_length, dtype=np.int32),
        _cells(keys).tobytes() if key_length else b"",
        _cells(values).tobytes() if value_length else b"",
        None,
        None,
        n,
    )


def _decode_simple(
    buf: bytes | memoryview | Any, positions: np.ndarray, heads: np.ndarray, end: int
) -> RecordBatch:
    """The columns of one-record, uncompressed, one-timestamp batches, gathered at once."""
    n = len(positions)
    header_size = BATCH_HEADER.size
    raw = np.frombuffer(buf, dtype=np.uint8, count=end)
    has_headers = (heads["flags"] & FLAG_HEADERS) != 0
    any_headers = bool(has_headers.any())
    columns = 8 + 4 * has_headers.astype(np.int64)
    body = heads["body_length"].astype(np.int64)
    if not bool(
        (body == heads["length"].astype(np.int64) - header_size).all() and (body >= columns).all()
    ):
        raise ValueError("column lengths do not add up to the batch body")
    lengths = _items_at(raw, positions + header_size, 8).view("<i4")
    key_lengths = np.ascontiguousarray(lengths[0::2])
    value_lengths = np.ascontiguousarray(lengths[1::2])
    header_lengths = np.zeros(n, dtype=np.int32)
    if any_headers:
        at = positions[has_headers] + header_size + 8
        header_lengths[has_headers] = _items_at(raw, at, 4).view("<i4")
    klen = np.maximum(key_lengths, 0).astype(np.int64)
    vlen = np.maximum(value_lengths, 0).astype(np.int64)
    sizes = columns + klen + vlen + header_lengths
    if not bool((header_lengths >= 0).all() and (sizes == body).all()):
        raise ValueError("column lengths do not add up to the batch body")
    hlen = header_lengths.astype(np.int64)
    length = int(heads["length"][0])
    first = int(positions[0])
    if (
        end - first == n * length
        and _same(columns)
        and _same(klen)
        and _same(vlen)
        and _same(hlen)
        and _same(np.diff(positions))
    ):
        # every batch alike (records of one size): the run is a 2-D array of rows and each
        # blob a column range of it
        rows = raw[first:end].reshape(n, length)
        at = header_size + int(columns[0])
        k, v, h = int(klen[0]), int(vlen[0]), int(hlen[0])
        keys_blob = rows[:, at : at + k].tobytes()
        values_blob = rows[:, at + k : at + k + v].tobytes()
        headers_blob = rows[:, at + k + v : at + k + v + h].tobytes() if any_headers else None
    elif not any_headers and _same(klen):
        # the run is its batches back to back, each exactly header + columns + key +
        # value + headers (checked above). Keys of one length (the common case): each key
        # is one fixed-width item; the values are cut out by one struct unpack that skips
        # every header, columns and key (the skip is then one number)
        k = int(klen[0])
        at = positions + header_size + 8
        keys_blob = _items_at(raw, at, k).tobytes() if k else b""
        skip = b"%d" % (header_size + 8 + k)
        values = _layout((skip, b"x"), (vlen, b"s"), count=n).unpack_from(buf, first)
        values_blob = b"".join(values)
        headers_blob = None
    else:
        # any layout: one struct unpack yields every key, value and headers blob
        columns_ = [(header_size + columns, b"x"), (klen, b"s"), (vlen, b"s")]
        if any_headers:
            columns_.append((hlen, b"s"))
        pieces = _layout(*columns_, count=n).unpack_from(buf, first)
        step = len(columns_) - 1
        keys_blob = b"".join(pieces[0::step])
        values_blob = b"".join(pieces[1::step])
        headers_blob = b"".join(pieces[2::step]) if any_headers else None
    base = heads["base_offset"]
    header = BatchHeader(
        end - int(positions[0]),
        0,
        BATCH_MAGIC,
        CODEC_NONE,
        0,
        int(base[0]),
        n,
        int(base[-1]) + int(heads["last_delta"][-1]) - int(base[0]),
        int(heads["first_ts"][0]),
        int(heads["max_ts"].max()),
        0,
    )
    return RecordBatch(
        header,
        int(positions[0]),
        base.astype(np.int64),
        heads["first_ts"].astype(np.int64),
        key_lengths,
        value_lengths,
        keys_blob,
        values_blob,
        header_lengths if any_headers else None,
        headers_blob,
        n,
    )


def _same(values: np.ndarray) -> bool:
    return not len(values) or bool((values == values[0]).all())


def concat_columns(
    batches: Sequence[RecordBatch],
) -> tuple[
    np.ndarray,
    np.ndarray,
    np.ndarray,
    np.ndarray,
    bytes,
    bytes,
    np.ndarray | None,
    bytes | None,
]:
    """The columns of ``batches`` joined in order: offsets, timestamps, key lengths, value
    lengths, keys blob, values blob, header lengths and headers blob (``None`` when no batch
    has headers). Blobs come back as ``bytes``; one batch's arrays are returned as they are.
    Used by :func:`concat_batches` and by consumers that need only the columns (Spark)."""
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

    return (
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
        *concat_columns(batches),
        sum(b.stored_batches for b in batches),
    )


def encode_record_batch(
    batch: RecordBatch, base_offset: int, last_delta: int, codec: int, level: int
) -> bytes:
    """Re-encode a (filtered) columnar batch, keeping offsets, timestamps and headers."""
    deltas = (batch.offsets - base_offset).astype(np.uint32)
    heads = batch.headers() if batch.header_lengths is not None else None
    return encode_batch(
        batch.keys(),
        batch.values(),
        batch.timestamps.tolist(),
        headers=heads,
        offset_deltas=deltas,
        last_delta=last_delta,
        codec=codec,
        level=level,
    ).to_bytes(base_offset)
