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

What lives where: this module is the grammar (magics, file headers, structs, codecs,
flags, the batch header's one layout and its checks). Turning records into batches is
``batch_encode.py``, batches into columns and records ``batch_decode.py``; readers take
runs of small batches at once through ``small_runs.py``, whose CRCs ``row_crcs.py``
computes for many batches together.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Mapping
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
INDEX_ENTRY = struct.Struct("<II")
PRECOMMIT_ENTRY = struct.Struct("<IIqqiii")
PRECOMMIT_LENGTH_CRC = struct.Struct("<II")  # the entry's first two fields ...
PRECOMMIT_FIELDS = struct.Struct("<qqiii")  # ... and the rest, which the CRC covers
assert FILE_HEADER.size == 16
assert INDEX_ENTRY.size == 8
assert PRECOMMIT_ENTRY.size == 36 == PRECOMMIT_LENGTH_CRC.size + PRECOMMIT_FIELDS.size

CODEC_NONE = 0
CODEC_ZSTD = 1
CODECS = {"none": CODEC_NONE, "zstd": CODEC_ZSTD}

FLAG_HEADERS = 1
FLAG_CONTIGUOUS = 2
FLAG_SINGLE_TIMESTAMP = 4
KNOWN_FLAGS = FLAG_HEADERS | FLAG_CONTIGUOUS | FLAG_SINGLE_TIMESTAMP

MAX_BATCH_BYTES = (1 << 32) - 1
TWO_LENGTHS = struct.Struct("<ii")  # a one-record body's key and value lengths

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


# -- codecs -----------------------------------------------------------------------------

_compressors = threading.local()


def zstd_compress(data: bytes, level: int) -> bytes:
    compressors = getattr(_compressors, "by_level", None)
    if compressors is None:
        compressors = _compressors.by_level = {}
    compressor = compressors.get(level)
    if compressor is None:
        compressor = compressors[level] = zstandard.ZstdCompressor(level=level)
    return compressor.compress(data)


def zstd_decompress(data: bytes | memoryview, size: int) -> bytes:
    decompressor = getattr(_compressors, "decompressor", None)
    if decompressor is None:
        decompressor = _compressors.decompressor = zstandard.ZstdDecompressor()
    return decompressor.decompress(data, max_output_size=size)


# -- batch headers ---------------------------------------------------------------------


BATCH_HEADER_FIELDS: tuple[tuple[str, str], ...] = (
    ("length", "I"),
    ("crc", "I"),
    ("magic", "B"),
    ("codec", "B"),
    ("flags", "H"),
    ("base_offset", "q"),
    ("count", "I"),
    ("last_delta", "I"),
    ("first_ts", "q"),
    ("max_ts", "q"),
    ("body_length", "I"),
)
"""The batch header's one definition: its fields in file order, as ``struct`` codes. The
struct, the field offsets, :class:`BatchHeader`, the numpy dtype and the partial views
that hot loops read are all built from it."""

BATCH_HEADER = struct.Struct("<" + "".join(code for _, code in BATCH_HEADER_FIELDS))


def _field_offsets() -> dict[str, int]:
    offsets, at = {}, 0
    for name, code in BATCH_HEADER_FIELDS:
        offsets[name] = at
        at += struct.calcsize("<" + code)
    return offsets


BATCH_FIELD_AT = _field_offsets()
"""The byte offset of every batch header field, by name."""
LENGTH_AT = BATCH_FIELD_AT["length"]
MAGIC_AT = BATCH_FIELD_AT["magic"]
CODEC_AT = BATCH_FIELD_AT["codec"]
FLAGS_AT = BATCH_FIELD_AT["flags"]
COUNT_AT = BATCH_FIELD_AT["count"]
LAST_DELTA_AT = BATCH_FIELD_AT["last_delta"]
BODY_LENGTH_AT = BATCH_FIELD_AT["body_length"]
CRC_START = MAGIC_AT  # the CRC covers everything after the length and crc fields
assert BATCH_HEADER.size == 48
assert (CRC_START, COUNT_AT, LAST_DELTA_AT, BODY_LENGTH_AT) == (8, 20, 24, 44)


def header_fields(*names: str) -> struct.Struct:
    """A partial view of the batch header: the fields ``names`` (in file order), read from
    the first one's offset, the bytes between them skipped. Hot loops unpack only the
    fields they need with it (``unpack_from(buf, pos + BATCH_FIELD_AT[names[0]])``)."""
    codes = dict(BATCH_HEADER_FIELDS)
    layout = "<"
    at = BATCH_FIELD_AT[names[0]]
    for name in names:
        gap = BATCH_FIELD_AT[name] - at
        assert gap >= 0, "fields in file order"
        layout += f"{gap}x" * bool(gap) + codes[name]
        at = BATCH_FIELD_AT[name] + struct.calcsize("<" + codes[name])
    return struct.Struct(layout)


LENGTH_CRC = header_fields("length", "crc")  # batch header bytes [0, 8)
# batch header bytes [8, 48), the part the CRC covers
HEADER_TAIL = header_fields(*(name for name, at in BATCH_FIELD_AT.items() if at >= CRC_START))
assert LENGTH_CRC.size + HEADER_TAIL.size == BATCH_HEADER.size
BATCH_HEADER_DTYPE = np.dtype(
    [(name, np.dtype(code).newbyteorder("<")) for name, code in BATCH_HEADER_FIELDS]
)
"""The batch header as a numpy structured item (a run's headers read as one array)."""
assert BATCH_HEADER_DTYPE.itemsize == BATCH_HEADER.size


class BatchHeader(NamedTuple):
    """A parsed batch header (fields: :data:`BATCH_HEADER_FIELDS`)."""

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


assert BatchHeader._fields == tuple(name for name, _ in BATCH_HEADER_FIELDS)


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
    header, _body_crc, reason = check_batch_crc(buf, pos, end)
    return header, reason


def check_batch_crc(buf: Any, pos: int, end: int) -> tuple[BatchHeader | None, int, str]:
    """:func:`check_batch`, also returning the body's share of the CRC (section 6)."""
    header, reason = read_batch_header(buf, pos, end)
    if header is None:
        return None, 0, reason
    with memoryview(buf) as view:
        body_crc = crc32c(view[pos + BATCH_HEADER.size : pos + header.length])
        if crc32c(view[pos + CRC_START : pos + BATCH_HEADER.size], body_crc) != header.crc:
            return None, 0, "batch CRC mismatch"
    return header, body_crc, ""


def find_next_valid_batch(buf: bytes | memoryview, start: int, end: int) -> int | None:
    """Position of the first whole, valid batch after ``start`` (a resynchronising scan).

    Used to tell a torn tail (nothing valid follows) from corruption (valid data follows).
    """
    data = np.frombuffer(buf, dtype=np.uint8, count=end, offset=0)
    candidates = np.flatnonzero(data[start + 1 + MAGIC_AT : end] == BATCH_MAGIC)
    for index in candidates:
        pos = start + 1 + int(index)
        header, _ = check_batch(buf, pos, end)
        if header is not None and header.count > 0:
            return pos
    return None
