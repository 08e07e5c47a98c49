"""The batch format: encode/decode round trips, CRC detection, header checks."""

from __future__ import annotations

import numpy as np
import pytest

from compactlog.encoding.batch_decode import decode_batch
from compactlog.encoding.batch_encode import (
    PLAIN_MAX_BYTES,
    encode_batch,
    encode_plain,
    encode_single,
)
from compactlog.encoding.format import (
    BATCH_HEADER,
    CODEC_NONE,
    CODEC_ZSTD,
    FLAG_CONTIGUOUS,
    FLAG_HEADERS,
    FLAG_SINGLE_TIMESTAMP,
    INDEX_FILE_HEADER,
    SEGMENT_FILE_HEADER,
    SEGMENT_MAGIC,
    check_batch,
    check_file_header,
    find_next_valid_batch,
)
from compactlog.errors import InvalidRecordError

from .helpers import encode_record_batch


def roundtrip(keys, values, timestamps, base=100, **kwargs):
    data = encode_batch(keys, values, timestamps, **kwargs).to_bytes(base)
    header, reason = check_batch(data, 0, len(data))
    assert header is not None, reason
    assert header.length == len(data)
    return decode_batch(data, 0, header)


def test_plain_batch_round_trips_keys_values_and_offsets():
    batch = roundtrip([b"a", b"bb", b""], [b"1", b"", b"333"], 5)
    assert batch.offsets.tolist() == [100, 101, 102]
    assert batch.keys() == [b"a", b"bb", b""]
    assert batch.values() == [b"1", b"", b"333"]
    assert batch.timestamps.tolist() == [5, 5, 5]
    assert batch.header.flags & FLAG_CONTIGUOUS
    assert batch.header.flags & FLAG_SINGLE_TIMESTAMP
    assert batch.next_offset == 103


def test_tombstones_decode_as_none_values():
    batch = roundtrip([b"k1", b"k2"], [None, b"v"], 1)
    records = list(batch.records())
    assert records[0].value is None and records[0].is_tombstone
    assert records[1].value == b"v" and not records[1].is_tombstone


def test_none_keys_round_trip_when_allowed():
    batch = roundtrip([None, b"k"], [b"v1", b"v2"], 1)
    assert batch.keys() == [None, b"k"]


def test_none_key_is_refused_when_keys_are_required():
    with pytest.raises(InvalidRecordError, match="None"):
        encode_batch([b"k", None], [b"v", b"v"], 1, allow_none_keys=False)


def test_headers_round_trip_per_record():
    headers = [{"trace": b"abc", "ü": b""}, None, {"x": b"\x00\xff"}]
    batch = roundtrip([b"a", b"b", b"c"], [b"1", b"2", b"3"], 1, headers=headers)
    assert batch.header.flags & FLAG_HEADERS
    assert batch.headers() == headers
    assert [r.headers for r in batch.records()] == headers


def test_per_record_timestamps_are_stored_as_a_column():
    batch = roundtrip([b"a", b"b", b"c"], [b"1", b"2", b"3"], [10, 30, 20])
    assert not batch.header.flags & FLAG_SINGLE_TIMESTAMP
    assert batch.timestamps.tolist() == [10, 30, 20]
    assert batch.header.first_ts == 10
    assert batch.header.max_ts == 30


def test_equal_per_record_timestamps_collapse_to_one():
    batch = roundtrip([b"a", b"b"], [b"1", b"2"], [7, 7])
    assert batch.header.flags & FLAG_SINGLE_TIMESTAMP
    assert batch.timestamps.tolist() == [7, 7]


def test_zstd_batch_round_trips_and_is_smaller():
    values = [b"x" * 1000] * 50
    keys = [b"key%d" % i for i in range(50)]
    plain = encode_batch(keys, values, 1, codec=CODEC_NONE)
    packed = encode_batch(keys, values, 1, codec=CODEC_ZSTD)
    assert packed.size < plain.size // 10
    batch = roundtrip(keys, values, 1, codec=CODEC_ZSTD)
    assert batch.header.codec == CODEC_ZSTD
    assert batch.keys() == keys and batch.values() == values


def test_sparse_offsets_round_trip_after_filtering():
    batch = roundtrip([b"a", b"b", b"c", b"d"], [b"1", None, b"3", b"4"], [1, 2, 3, 4])
    kept = batch.select(np.array([True, False, False, True]))
    data = encode_record_batch(kept, 100, batch.header.last_delta, CODEC_NONE, 3)
    header, _ = check_batch(data, 0, len(data))
    again = decode_batch(data, 0, header)
    assert again.offsets.tolist() == [100, 103]
    assert again.next_offset == 104  # the offsets the batch was written with are kept
    assert again.keys() == [b"a", b"d"]
    assert again.timestamps.tolist() == [1, 4]


def test_every_single_bit_flip_is_detected_by_the_crc():
    data = encode_batch([b"key"], [b"value"], 3, headers=[{"h": b"v"}]).to_bytes(7)
    for position in range(len(data)):
        for bit in (0, 5):
            damaged = bytearray(data)
            damaged[position] ^= 1 << bit
            header, _ = check_batch(bytes(damaged), 0, len(damaged))
            assert header is None, f"flip at byte {position} bit {bit} went unnoticed"


def test_truncated_batch_is_reported_incomplete():
    data = encode_batch([b"key"], [b"value" * 20], 3).to_bytes(0)
    for length in (0, 10, BATCH_HEADER.size, len(data) - 1):
        header, reason = check_batch(data[:length], 0, length)
        assert header is None
        assert reason.startswith("incomplete")


def test_resync_scan_finds_the_next_valid_batch():
    first = encode_batch([b"a"], [b"1"], 1).to_bytes(0)
    second = encode_batch([b"b"], [b"2"], 1).to_bytes(1)
    data = bytearray(first + second)
    data[BATCH_HEADER.size] ^= 0xFF
    assert check_batch(bytes(data), 0, len(data))[0] is None
    assert find_next_valid_batch(bytes(data), 0, len(data)) == len(first)
    assert find_next_valid_batch(bytes(data), len(first), len(data)) is None


def test_wrong_types_are_refused_with_the_record_index():
    with pytest.raises(InvalidRecordError, match="record 1: key must be bytes"):
        encode_batch([b"a", "b"], [b"1", b"2"], 1)
    with pytest.raises(InvalidRecordError, match="record 0: value must be bytes"):
        encode_batch([b"a"], [3], 1)


def test_file_headers_name_foreign_and_newer_files():
    assert check_file_header(SEGMENT_FILE_HEADER, SEGMENT_MAGIC) is None
    assert "not a compactlog file" in check_file_header(INDEX_FILE_HEADER, SEGMENT_MAGIC)
    newer = bytearray(SEGMENT_FILE_HEADER)
    newer[8] = 99
    assert "newer" in check_file_header(bytes(newer), SEGMENT_MAGIC)
    assert "expected 16" in check_file_header(b"CLOG", SEGMENT_MAGIC)


@pytest.mark.parametrize("codec", [0, 1])
@pytest.mark.parametrize(
    ("key", "value", "headers"),
    [
        (b"k", b"v", None),
        (b"", b"", None),
        (b"key", None, None),
        (None, b"x", None),
        (b"k", b"v", {"a": b"b", "c": b""}),
        (bytearray(b"ab"), memoryview(b"cd"), None),
    ],
)
def test_single_record_fast_path_encodes_the_same_bytes_as_the_column_path(
    key, value, headers, codec
):
    # a list of timestamps takes the general (numpy) path; an int takes the single-record one
    fast = encode_batch([key], [value], 7, headers=[headers] if headers else None, codec=codec)
    general = encode_batch([key], [value], [7], headers=[headers] if headers else None, codec=codec)
    assert fast.to_bytes(3) == general.to_bytes(3)
    assert fast.largest_record == general.largest_record


@pytest.mark.parametrize("size", [0, 1, 100, PLAIN_MAX_BYTES - 16, PLAIN_MAX_BYTES - 15])
def test_plain_record_encoder_gives_the_bytes_of_the_batch_encoder(size):
    # the single-append fast path's encoder, either side of the one-CRC-call limit
    key, value = b"k" * 16, bytes(range(256)) * (size // 256) + b"v" * (size % 256)
    expected = encode_batch([key], [value], [1_700_000_000_000]).to_bytes(12345)
    assert encode_plain(key, value, 1_700_000_000_000, 12345) == expected
    assert encode_single(key, value, 1_700_000_000_000, b"", 12345) == expected
