"""Logs of small batches (single appends): runs decoded at once, merged by the cleaner.

The fast path (``small_runs.scan_small_run`` + ``small_runs.decode_small_run``) must decode exactly
what the columnar path (``batch_decode.decode_batch``, batch by batch) decodes: keys, values,
``None`` keys and values, headers, timestamps, compressed bodies, offset deltas left by
compaction. Every reader (``read``, ``read_batches``, subscribers, latest state, the
cleaner) goes through it, and the cleaner turns runs of small batches into large ones
while keeping offsets, order, timestamps and headers.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import compactlog
from compactlog.encoding.batch_decode import Record, RecordBatch, decode_batch
from compactlog.encoding.batch_encode import encode_batch
from compactlog.encoding.format import (
    BATCH_HEADER,
    CODEC_NONE,
    CODEC_ZSTD,
    CRC_START,
    SEGMENT_FILE_HEADER,
    check_batch,
    crc32c,
)
from compactlog.encoding.small_runs import SMALL_BATCH_RECORDS, decode_small_run, scan_small_run
from compactlog.errors import ConfigError, CorruptLogError
from compactlog.storage.segment import HEADER_SIZE, SegmentReader, list_segments

from .compaction_helpers import Model, check_log
from .helpers import (
    assert_run_matches,
    batch_positions,
    body_position,
    decode_columns,
    flip_bit,
    segment_files,
)

# -- stored batches built with the encoder ---------------------------------------------------

names = st.text(alphabet="abcxyz-", min_size=1, max_size=6)
headers_strategy = st.one_of(
    st.none(), st.dictionaries(names, st.binary(max_size=12), min_size=1, max_size=3)
)
record_strategy = st.tuples(
    st.one_of(st.none(), st.binary(max_size=24)),  # key
    st.one_of(st.none(), st.binary(max_size=40)),  # value (None: tombstone)
    headers_strategy,
    st.integers(0, 3),  # offset gap before the record (compaction removed records)
    st.integers(1_700_000_000_000, 1_700_000_000_050),  # timestamp
)
batch_strategy = st.tuples(
    st.lists(record_strategy, min_size=1, max_size=SMALL_BATCH_RECORDS + 3),
    st.booleans(),  # one timestamp for the batch
    st.sampled_from([CODEC_NONE, CODEC_ZSTD]),
    st.integers(0, 2),  # offsets after the last record (a batch that lost its last records)
)


def build_segment(batches) -> tuple[bytes, list[tuple[int, int]]]:
    """A segment's bytes and (position, base offset) of each batch."""
    parts = [SEGMENT_FILE_HEADER]
    where = []
    pos = len(SEGMENT_FILE_HEADER)
    next_offset = 0
    for records, one_timestamp, codec, slack in batches:
        base = next_offset + records[0][3]
        deltas = []
        delta = 0
        for i, (_k, _v, _h, gap, _ts) in enumerate(records):
            delta += gap if i else 0
            deltas.append(delta)
            delta += 1
        timestamps = records[0][4] if one_timestamp else [r[4] for r in records]
        encoded = encode_batch(
            [r[0] for r in records],
            [r[1] for r in records],
            timestamps,
            headers=[r[2] for r in records],
            offset_deltas=np.array(deltas, dtype=np.uint32),
            last_delta=deltas[-1] + slack,
            codec=codec,
        )
        data = encoded.to_bytes(base)
        parts.append(data)
        where.append((pos, base))
        pos += len(data)
        next_offset = base + deltas[-1] + slack + 1
    return b"".join(parts), where


def columnar(buf: bytes, start: int = HEADER_SIZE) -> list[RecordBatch]:
    """The reference: every batch through ``decode_batch``."""
    out = []
    pos = start
    while pos < len(buf):
        header, reason = check_batch(buf, pos, len(buf))
        assert header is not None, reason
        out.append(decode_columns(buf, pos, header))
        pos += header.length
    return out


def fast(buf: bytes, max_records: int, max_bytes: int) -> list[tuple[RecordBatch, int]]:
    """The fast path as readers use it: a run where there is one, else one batch."""
    out = []
    pos = HEADER_SIZE
    while pos < len(buf):
        run = scan_small_run(buf, pos, len(buf), max_records, max_bytes)
        if run is not None:
            batch = decode_small_run(buf, run)
            assert batch.stored_batches == len(run) >= 2
            assert batch.size_bytes == run.end - pos
            out.append((batch, pos))
            pos = run.end
        else:
            header, reason = check_batch(buf, pos, len(buf))
            assert header is not None, reason
            out.append((decode_batch(buf, pos, header), pos))
            pos += header.length
    return out


def records_of(batches: list[RecordBatch]) -> list[Record]:
    return [record for batch in batches for record in batch.records()]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=st.lists(batch_strategy, min_size=1, max_size=12),
    max_records=st.integers(1, 40),
    max_bytes=st.sampled_from([1, 200, 600, 1 << 20]),
)
def test_runs_decode_exactly_what_the_columnar_path_decodes(batches, max_records, max_bytes):
    buf, where = build_segment(batches)
    reference = columnar(buf)
    decoded = fast(buf, max_records, max_bytes)
    assert records_of([b for b, _ in decoded]) == records_of(reference)
    # column by column, and each run covers exactly the stored batches it replaces
    i = 0
    for batch, pos in decoded:
        covered = reference[i : i + batch.stored_batches]
        i += batch.stored_batches
        assert batch.position == pos == where[i - batch.stored_batches][0]
        assert len(batch) == sum(len(b) for b in covered)
        assert_run_matches(batch, covered)
        if batch.stored_batches > 1:
            # a run starts at a small batch; the batches after it may be of any size
            assert len(covered[0]) <= SMALL_BATCH_RECORDS
            second = min(len(covered[1]), SMALL_BATCH_RECORDS)
            assert len(batch) <= max(max_records, len(covered[0]) + second)
            assert batch.size_bytes <= max(max_bytes, 0) or batch.stored_batches < 2
    assert i == len(reference)


@settings(max_examples=150, deadline=None)
@given(batch=batch_strategy)
def test_one_record_batches_decode_straight_from_bytes_as_the_columns_do(batch):
    records, one_timestamp, codec, slack = batch
    buf, _where = build_segment([(records[:1], one_timestamp, codec, slack)])
    header, _reason = check_batch(buf, HEADER_SIZE, len(buf))
    fast_batch = decode_batch(buf, HEADER_SIZE, header)
    reference = decode_columns(buf, HEADER_SIZE, header)
    assert fast_batch.decoded is not None  # the struct path was taken
    assert list(fast_batch.records()) == list(reference.records())
    reference.decoded = fast_batch.decoded = None  # now compare the columns themselves
    assert list(fast_batch.records()) == list(reference.records())
    assert fast_batch.offsets.tolist() == reference.offsets.tolist()
    assert fast_batch.timestamps.tolist() == reference.timestamps.tolist()
    assert fast_batch.key_lengths.tolist() == reference.key_lengths.tolist()
    assert fast_batch.value_lengths.tolist() == reference.value_lengths.tolist()
    assert bytes(fast_batch.keys_blob) == bytes(reference.keys_blob)
    assert bytes(fast_batch.values_blob) == bytes(reference.values_blob)
    assert fast_batch.headers() == reference.headers()
    assert (fast_batch.header_lengths is None) == (reference.header_lengths is None)


def test_uniform_single_appends_decode_as_one_run():
    records = [(b"k%05d" % i, b"v" * 20, None, 0, 1_700_000_000_000 + i) for i in range(50)]
    batches = [([r], True, CODEC_NONE, 0) for r in records]
    buf, _where = build_segment(batches)
    (batch, _pos), *rest = fast(buf, 1 << 20, 1 << 20)
    assert rest == []
    assert batch.stored_batches == 50
    assert batch.offsets.tolist() == list(range(50))
    assert batch.keys() == [r[0] for r in records]
    assert batch.timestamps.tolist() == [r[4] for r in records]


def test_a_run_stops_before_a_batch_whose_crc_is_wrong():
    batches = [([(b"k%d" % i, b"v", None, 0, 5)], True, CODEC_NONE, 0) for i in range(10)]
    buf, where = build_segment(batches)
    damaged = bytearray(buf)
    damaged[body_position(where[4][0])] ^= 1
    run = scan_small_run(bytes(damaged), HEADER_SIZE, len(damaged))
    assert run is not None
    assert run.positions.tolist() == [p for p, _ in where[:4]]
    assert run.end == where[4][0]
    assert check_batch(bytes(damaged), run.end, len(damaged)) == (None, "batch CRC mismatch")


@pytest.mark.parametrize("damaged_index", [1, 8, 9, 50, 99])
@pytest.mark.parametrize("field", ["body", "length", "crc", "base_offset"])
def test_damage_anywhere_in_a_long_run_ends_the_run_there(damaged_index, field):
    # 100 batches of one length: the walk leaps over most of them with numpy
    batches = [([(b"k%03d" % i, b"v" * 9, None, 0, 5)], True, CODEC_NONE, 0) for i in range(100)]
    buf, where = build_segment(batches)
    damaged = bytearray(buf)
    pos = where[damaged_index][0]
    at = {"body": body_position(pos), "length": pos, "crc": pos + 5, "base_offset": pos + 13}
    damaged[at[field]] ^= 4
    run = scan_small_run(bytes(damaged), HEADER_SIZE, len(damaged))
    if damaged_index == 1:
        assert run is None
    else:
        assert run is not None
        assert run.positions.tolist() == [p for p, _ in where[:damaged_index]]
        assert run.end == pos
    assert check_batch(bytes(damaged), pos, len(damaged))[0] is None


@settings(max_examples=60, deadline=None)
@given(
    crcs=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=30),
    data=st.data(),
)
def test_crcs_continued_over_headers_at_once_equal_crc32c(crcs, data):
    from compactlog.encoding.row_crcs import continue_crc as _continue_crc

    rows = [data.draw(st.binary(min_size=40, max_size=40)) for _ in crcs]
    messages = np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(len(rows), 40)
    got = _continue_crc(np.array(crcs, dtype=np.uint32), messages)
    assert got.tolist() == [crc32c(row, crc) for row, crc in zip(rows, crcs, strict=True)]


@pytest.mark.parametrize("max_records", [1, 2, 9, 10, 17, 99, 100, 1000])
@pytest.mark.parametrize("max_bytes", [100, 1000, 2345, 1 << 20])
def test_runs_of_equal_batches_respect_the_limits(max_records, max_bytes):
    batches = [([(b"k%03d" % i, b"v" * 9, None, 0, 5)], True, CODEC_NONE, 0) for i in range(100)]
    buf, where = build_segment(batches)
    length = where[1][0] - where[0][0]
    run = scan_small_run(buf, HEADER_SIZE, len(buf), max_records, max_bytes)
    expected = min(max(max_records, 2), max_bytes // length, 100)
    if expected < 2:
        assert run is None
    else:
        assert run is not None and len(run) == expected
        assert run.end == HEADER_SIZE + expected * length
    decoded = fast(buf, max_records, max_bytes)
    assert records_of([b for b, _ in decoded]) == records_of(columnar(buf))


def test_a_run_whose_lengths_only_average_out_is_not_taken_for_one_of_equal_batches():
    # first and last batch of one length and the total a multiple of it, the middle not
    sizes = [4, 6, 2, 4, 4]
    records = [(b"k%d" % i, b"x" * size, None, 0, 5) for i, size in enumerate(sizes)]
    buf, _where = build_segment([([r], True, CODEC_NONE, 0) for r in records])
    decoded = fast(buf, 1 << 20, 1 << 20)
    assert [b.stored_batches for b, _ in decoded] == [5]
    assert records_of([b for b, _ in decoded]) == records_of(columnar(buf))


def test_runs_of_alternating_and_equal_lengths_decode_like_the_columnar_path():
    records = []
    for i in range(300):
        size = 5 if (i // 40) % 2 else 1 + i % 3  # stretches of equal and of varied sizes
        records.append((b"k%d" % i, b"x" * size, None, 0, 5))
    buf, _where = build_segment([([r], True, CODEC_NONE, 0) for r in records])
    decoded = fast(buf, 1 << 20, 1 << 20)
    assert len(decoded) == 1
    assert records_of([b for b, _ in decoded]) == records_of(columnar(buf))


def test_a_run_stops_before_a_batch_with_a_bad_header_field():
    batches = [([(b"k%d" % i, b"v", None, 0, 5)], True, CODEC_NONE, 0) for i in range(6)]
    buf, where = build_segment(batches)
    damaged = bytearray(buf)
    pos = where[3][0]
    damaged[pos + 10] |= 0x80  # an unknown flag, with a CRC that matches it
    with_valid_crc(damaged, pos)
    run = scan_small_run(bytes(damaged), HEADER_SIZE, len(damaged))
    assert run is not None and run.end == pos and len(run) == 3
    header, reason = check_batch(bytes(damaged), pos, len(damaged))
    assert header is None and reason.startswith("unknown batch flags")


def with_valid_crc(data: bytearray, pos: int) -> None:
    length = struct.unpack_from("<I", data, pos)[0]
    body_crc = crc32c(bytes(data[pos + BATCH_HEADER.size : pos + length]))
    crc = crc32c(bytes(data[pos + CRC_START : pos + BATCH_HEADER.size]), body_crc)
    struct.pack_into("<I", data, pos + 4, crc)


@pytest.mark.parametrize("compression", [CODEC_NONE, CODEC_ZSTD])
def test_an_undecodable_batch_inside_a_run_is_reported_at_its_position(tmp_path, compression):
    from compactlog.storage.filenames import segment_name

    batches = [([(b"k%d" % i, b"v" * 5, None, 0, 5)], True, compression, 0) for i in range(12)]
    buf, where = build_segment(batches)
    damaged = bytearray(buf)
    pos = where[6][0]
    if compression == CODEC_NONE:
        struct.pack_into("<i", damaged, pos + BATCH_HEADER.size, 99)  # a key longer than the body
    else:
        damaged[pos + BATCH_HEADER.size + 2] ^= 0xFF  # a zstd frame that does not decode
    with_valid_crc(damaged, pos)
    (tmp_path / segment_name(0)).write_bytes(bytes(damaged))
    reader = SegmentReader(str(tmp_path), 0, last_segment=False)
    with reader, pytest.raises(CorruptLogError) as caught:
        list(reader.runs(HEADER_SIZE))
    assert caught.value.position == pos
    assert "undecodable batch" in str(caught.value)


def test_a_run_starts_at_a_small_batch_and_goes_on_through_large_ones():
    big = [(b"k%d" % i, b"v", None, 0, 5) for i in range(SMALL_BATCH_RECORDS + 1)]
    buf, where = build_segment(
        [(big, True, CODEC_NONE, 0), ([big[0]], True, CODEC_NONE, 0), (big, True, CODEC_NONE, 0)]
    )
    assert scan_small_run(buf, where[0][0], len(buf)) is None  # no run starts at a large batch
    run = scan_small_run(buf, where[1][0], len(buf))
    assert run is not None and run.positions.tolist() == [where[1][0], where[2][0]]
    assert run.end == len(buf)
    # ... unless its records would pass max_records: the second batch counts in full
    assert scan_small_run(buf, where[1][0], len(buf), max_records=SMALL_BATCH_RECORDS) is None
    assert scan_small_run(buf, where[2][0], len(buf)) is None  # nor of one batch


# -- through the log ---------------------------------------------------------------------------


def single_appends(log, count: int, *, keys: int = 50, headers_every: int = 3) -> dict:
    """``count`` single appends (some with headers, some tombstones, distinct timestamps);
    returns offset -> Record as written."""
    written = {}
    for i in range(count):
        key = b"key-%03d" % (i % keys)
        value = None if i % 11 == 5 else b"value-%d-" % i * (1 + i % 4)
        headers = {"seq": b"%d" % i} if i % headers_every == 0 else None
        ts = 1_700_000_000_000 + i * 7
        offset = log.append(key, value, timestamp_ms=ts, headers=headers)
        written[offset] = Record(offset, key, value, ts, headers)
    return written


def stored_batches(directory) -> int:
    """Batches stored in the closed segments (the cleaner never touches the active one)."""
    count = 0
    for base in list_segments(str(directory))[:-1]:
        with SegmentReader(str(directory), base, last_segment=False) as reader:
            count += sum(1 for _ in reader.batches(HEADER_SIZE))
    return count


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_read_and_read_batches_of_single_appends_match_what_was_written(log_dir, compression):
    config = dict(segment_bytes=8192, compression=compression, cleanup_policy="delete")
    with compactlog.open(log_dir, **config) as log:
        written = single_appends(log, 400)
        log.append(None, b"keyless", timestamp_ms=9)  # no key: allowed when not compacted
        expected = [*written.values()]
        got = list(log.read())
        assert got[: len(expected)] == expected
        assert got[-1] == Record(len(expected), None, b"keyless", 9, None)
        batches = list(log.read_batches())
        assert any(b.stored_batches > 1 for b in batches)
        assert records_of(batches) == got
        # cut anywhere, runs included
        assert list(log.read(start=123, end=321)) == expected[123:321]


def test_a_corrupt_batch_inside_a_run_is_reported_at_its_own_position(log_dir):
    with compactlog.open(log_dir, segment_bytes=4096) as log:
        single_appends(log, 200)
        first = segment_files(log_dir)[0]
        pos, _length = batch_positions(first)[7]
        flip_bit(first, body_position(pos))
        with pytest.raises(CorruptLogError) as caught:
            list(log.read())
        assert caught.value.position == pos
        assert "CRC" in str(caught.value)


def test_subscribers_poll_across_runs_exactly_once(log_dir):
    with compactlog.open(log_dir, segment_bytes=8192) as log:
        written = single_appends(log, 600)
        expected = list(written.values())
        for max_records in (1, 2, 7, 100, 1000):
            sub = log.subscribe(f"~t{max_records}", start=0)
            got = []
            while True:
                records = sub.poll(max_records=max_records)
                if not records:
                    break
                assert len(records) <= max_records
                got.extend(records)
            assert got == expected
            sub.close()
        sub = log.subscribe("bytes-bound", start=0)
        got = []
        while batches := sub.poll_batches(max_records=50, max_bytes=700):
            got.extend(records_of(batches))
        assert got == expected


def test_subscribers_cut_runs_of_multi_record_batches_and_resume_inside_them(log_dir):
    with compactlog.open(log_dir, segment_bytes=4096) as log:
        expected = []
        for i in range(120):  # small batches of 3 records: polls end inside them
            pairs = [(b"key-%d-%d" % (i, j), b"v" * (i % 7)) for j in range(3)]
            offsets = log.append_batch(pairs, timestamp_ms=1000 + i)
            for offset, (key, value) in zip(offsets, pairs, strict=True):
                expected.append(Record(offset, key, value, 1000 + i, None))
        for max_records in (1, 4, 5, 50):
            sub = log.subscribe(f"~cut{max_records}", start=0)
            got = []
            while records := sub.poll(max_records=max_records):
                assert len(records) <= max_records
                got.extend(records)
            assert got == expected
            sub.close()


# -- compaction merges small batches -------------------------------------------------------------


def test_compaction_merges_single_appends_and_keeps_every_field(log_dir, clock):
    config = dict(segment_bytes=32 * 1024, segment_ms=None, retention_ms=None, sync="os")
    with compactlog.open(log_dir, clock=clock, **config) as log:
        model = Model()
        written = single_appends(log, 3000, keys=200)
        for offset, record in written.items():
            model.add(offset, record.key, record.value)
        before_batches = stored_batches(log_dir)
        before_bytes = sum(p.stat().st_size for p in segment_files(log_dir)[:-1])
        sub = log.subscribe("reader", start=0)
        first_half = sub.poll(max_records=1234)
        sub.commit()
        sub.close()
        stats = log.compact(force=True)
        assert stats.cleaned and stats.batches_merged > 0
        records = check_log(log, model)
        for record in records:  # offsets, timestamps and headers exactly as written
            assert record == written[record.offset]
        after_batches = stored_batches(log_dir)
        after_bytes = sum(p.stat().st_size for p in segment_files(log_dir)[:-1])
        assert after_batches < before_batches / 20
        assert after_bytes < before_bytes
        # a subscriber resumes in the middle of what is now a merged batch
        sub = log.subscribe("reader")
        rest = []
        while batch := sub.poll(max_records=97):
            rest.extend(batch)
        assert [r.offset for r in first_half] == list(range(1234))
        assert all(r.offset >= 1234 for r in rest)
        assert [r for r in records if r.offset >= 1234] == rest
        # large batches that lose nothing are copied byte for byte on the next pass (the
        # segments may be grouped anew: compare their batches, not their files)
        stored = closed_batch_bytes(log_dir)
        again = log.compact(force=True)
        assert again.batches_merged == 0 and again.batches_rewritten == 0
        assert closed_batch_bytes(log_dir) == stored


def closed_batch_bytes(directory) -> bytes:
    return b"".join(p.read_bytes()[HEADER_SIZE:] for p in segment_files(directory)[:-1])


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_merged_batches_respect_cleaner_merge_batch_bytes(log_dir, compression):
    config = dict(
        segment_bytes=64 * 1024,
        segment_ms=None,
        retention_ms=None,
        sync="os",
        compression=compression,
        cleaner_merge_batch_bytes=2048,
    )
    with compactlog.open(log_dir, **config) as log:
        written = single_appends(log, 1500, keys=1500)  # every key once: nothing superseded
        stats = log.compact(force=True)
        assert stats.batches_merged > 0
        assert list(log.read()) == list(written.values())
        for base in list_segments(str(log_dir))[:-1]:
            with SegmentReader(str(log_dir), base, last_segment=False) as reader:
                sizes = [b.size_bytes for b in reader.batches(HEADER_SIZE)]
            assert max(sizes) <= 2048
            assert len(sizes) < 1500 / 5


def test_cleaner_merge_batch_bytes_zero_keeps_small_batches_as_they_are(log_dir):
    config = dict(segment_bytes=16 * 1024, segment_ms=None, sync="os")
    with compactlog.open(log_dir, cleaner_merge_batch_bytes=0, **config) as log:
        written = single_appends(log, 600, keys=600)
        files = {p.name: p.read_bytes() for p in segment_files(log_dir)[:-1]}
        stats = log.compact(force=True)
        assert stats.batches_merged == 0
        assert {p.name: p.read_bytes() for p in segment_files(log_dir)[:-1]} == files
        assert list(log.read()) == list(written.values())


@pytest.mark.parametrize("bad", [-1, True, 1.5, "1MiB", (256 << 20) + 1])
def test_cleaner_merge_batch_bytes_is_validated(log_dir, bad):
    with pytest.raises(ConfigError, match="cleaner_merge_batch_bytes"):
        compactlog.open(log_dir, cleaner_merge_batch_bytes=bad)


def test_cleaner_merge_batch_bytes_defaults_to_one_mib(log_dir):
    with compactlog.open(log_dir) as log:
        assert log.config.cleaner_merge_batch_bytes == 1 << 20


def test_readback_benchmark_reads_back_what_it_wrote(tmp_path):
    from benchmarks import bench_readback

    result = bench_readback.run(records=3000, repeat=1, root=str(tmp_path))
    assert result["as_written"]["read_records_per_s"] > 0
    assert result["after_one_compaction"]["batches_merged"] > 0
    assert result["shrink"] < 1
    assert list(tmp_path.iterdir()) == []  # its scratch directory is gone
