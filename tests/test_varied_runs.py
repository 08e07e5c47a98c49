"""Runs of single appends whose record sizes vary from batch to batch.

Such a run is walked one length field at a time (``small_runs._step``), its bodies cut out by
one ``struct`` unpack (``byte_items.struct_layout``) for their CRCs, its headers' CRC part added
for all batches at once (``row_crcs.continue_crc``), and its keys and values cut out by
one ``struct`` unpack too. Everything must come out exactly as decoding every stored
batch alone does (``decode_columns``), and a damaged batch must end the run at its own
position, whatever its neighbours' sizes.
"""

from __future__ import annotations

import mmap
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import compactlog
from compactlog.encoding.batch_decode import _split
from compactlog.encoding.byte_items import struct_layout as _layout
from compactlog.encoding.format import CODEC_NONE, CODEC_ZSTD, check_batch, crc32c
from compactlog.encoding.row_crcs import continue_crc as _continue_crc
from compactlog.encoding.small_runs import SMALL_BATCH_RECORDS, _chase, _step, scan_small_run
from compactlog.errors import CorruptLogError
from compactlog.storage.segment import HEADER_SIZE

from .helpers import assert_run_matches, body_position, segment_files
from .test_small_batches import build_segment, columnar, fast, records_of

TS = 1_700_000_000_000

# one record per batch, of varied sizes; now and then an absent key, a tombstone,
# headers, a compressed body or a batch of several records
single = st.tuples(
    st.one_of(st.binary(min_size=16, max_size=16), st.binary(max_size=30), st.none()),
    st.one_of(st.binary(min_size=0, max_size=160), st.none()),
    st.one_of(st.none(), st.dictionaries(st.sampled_from("abc"), st.binary(max_size=9))),
    st.integers(0, 2),  # offset gap before the record
    st.integers(TS, TS + 3),
)


@st.composite
def varied_batches(draw, min_size=2, max_size=120):
    records = draw(st.lists(single, min_size=min_size, max_size=max_size))
    plain = draw(st.booleans())  # mostly 16-byte keys, no headers: the commonest layout
    out = []
    for key, value, headers, gap, ts in records:
        if plain:
            key = (key or b"").ljust(16, b"k")[:16]
            headers = None
        codec = draw(st.sampled_from([CODEC_NONE] * 9 + [CODEC_ZSTD]))
        extra = draw(st.sampled_from([0] * 12 + [1, SMALL_BATCH_RECORDS]))
        recs = [(key, value, headers, gap, ts)] + [(key, b"x", None, 0, ts)] * extra
        out.append((recs, True, codec, 0))
    return out


def single_appends(values, keys=None):
    keys = keys or [b"%016d" % i for i in range(len(values))]
    return [
        ([(k, v, None, 0, TS + i)], True, CODEC_NONE, 0)
        for i, (k, v) in enumerate(zip(keys, values, strict=True))
    ]


def check_same_as_columnar(buf, max_records=1 << 20, max_bytes=1 << 20):
    reference = columnar(buf)
    decoded = fast(buf, max_records, max_bytes)
    assert records_of([b for b, _ in decoded]) == records_of(reference)
    i = 0
    for batch, _pos in decoded:
        covered = reference[i : i + batch.stored_batches]
        i += batch.stored_batches
        assert_run_matches(batch, covered)
    assert i == len(reference)
    return decoded


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batches=varied_batches(),
    max_records=st.sampled_from([2, 7, 50, 1 << 20]),
    max_bytes=st.sampled_from([300, 2000, 1 << 20]),
)
def test_varied_runs_decode_exactly_what_each_batch_decodes(batches, max_records, max_bytes):
    buf, _where = build_segment(batches)
    check_same_as_columnar(buf, max_records, max_bytes)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 200), min_size=2, max_size=300), seed=st.integers(0, 99))
def test_single_appends_of_varied_sizes_are_one_run(sizes, seed):
    rng = np.random.default_rng(seed)
    values = [rng.bytes(n) for n in sizes]
    buf, where = build_segment(single_appends(values))
    decoded = check_same_as_columnar(buf)
    assert len(decoded) == 1 and decoded[0][0].stored_batches == len(sizes)
    run = scan_small_run(buf, HEADER_SIZE, len(buf))
    assert run is not None and run.positions.tolist() == [p for p, _ in where]
    # the same from a mapping, as the reader scans closed segments
    with mmap.mmap(-1, len(buf)) as mapped:
        mapped[:] = buf
        run = scan_small_run(mapped, HEADER_SIZE, len(buf))
        assert run is not None and run.positions.tolist() == [p for p, _ in where]
        del run


FIELDS = {
    "body": lambda pos: body_position(pos),
    "length": lambda pos: pos,
    "crc": lambda pos: pos + 5,
    "header": lambda pos: pos + 30,  # first timestamp: covered by the CRC
    "body_length": lambda pos: pos + 44,
    "last": lambda pos: None,  # the last byte of the batch (its value)
}


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 150), min_size=3, max_size=80),
    data=st.data(),
    field=st.sampled_from(sorted(FIELDS)),
    bit=st.integers(0, 7),
)
def test_a_damaged_batch_ends_a_varied_run_at_its_own_position(sizes, data, field, bit):
    values = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    buf, where = build_segment(single_appends(values))
    index = data.draw(st.integers(0, len(sizes) - 1))
    pos = where[index][0]
    end = where[index + 1][0] if index + 1 < len(where) else len(buf)
    at = FIELDS[field](pos)
    damaged = bytearray(buf)
    damaged[end - 1 if at is None else at] ^= 1 << bit
    damaged = bytes(damaged)
    assert check_batch(damaged, pos, len(damaged))[0] is None
    run = scan_small_run(damaged, HEADER_SIZE, len(damaged))
    assert_run_ends_before(run, where, index)


@pytest.mark.parametrize("count", [SMALL_BATCH_RECORDS, SMALL_BATCH_RECORDS + 1, 1000])
def test_a_varied_run_goes_on_through_a_batch_of_more_than_small_records(count):
    batches = single_appends([b"v" * (i % 7) for i in range(20)])
    batches[12] = ([(b"k", b"v", None, 0, TS)] * count, True, CODEC_NONE, 0)
    buf, where = build_segment(batches)
    run = scan_small_run(buf, HEADER_SIZE, len(buf))
    assert run is not None
    assert run.positions.tolist() == [p for p, _ in where]
    limited = scan_small_run(buf, HEADER_SIZE, len(buf), max_records=12 + SMALL_BATCH_RECORDS)
    assert limited is not None
    # at that limit: through a batch of up to 8 records (20 records), else stops before it
    expected = 13 if count <= SMALL_BATCH_RECORDS else 12
    assert limited.positions.tolist() == [p for p, _ in where[:expected]]
    check_same_as_columnar(buf)


def test_a_varied_run_stops_where_a_batch_would_pass_the_end():
    buf, where = build_segment(single_appends([b"v" * (i % 5) for i in range(10)]))
    for cut in (where[6][0], where[6][0] + 3, where[6][0] + 60):
        run = scan_small_run(buf, HEADER_SIZE, cut)
        assert run is not None
        assert run.positions.tolist() == [p for p, _ in where[:6]]


@settings(max_examples=100, deadline=None)
@given(
    lengths=st.lists(st.integers(-1, 12_345), max_size=40),
    offset=st.integers(0, 3),
)
def test_split_cuts_varied_lengths_and_absent_items(lengths, offset):
    array = np.array(lengths, dtype=np.int32)
    items = [None if n < 0 else bytes([n % 256]) * n for n in lengths]
    blob = b"?" * offset + b"".join(i for i in items if i is not None)
    assert _split(blob[offset:], array) == items
    assert _split(memoryview(blob)[offset:], array) == items


@settings(deadline=None)  # (its first examples compile struct layouts: slow on a loaded machine)
@given(columns=st.lists(st.lists(st.integers(0, 10**7), min_size=3, max_size=3), max_size=30))
def test_layout_writes_every_count(columns):
    counts = np.array(columns, dtype=np.int64).reshape(-1, 3)
    layout = _layout(
        (b"2", b"x"),
        (counts[:, 0], b"x"),
        (counts[:, 1], b"s"),
        (counts[:, 2], b"s"),
        count=len(counts),
    )
    expected = "".join(f"2x{a}x{b}s{c}s" for a, b, c in columns)
    assert layout.size == struct.calcsize(expected)
    data = bytes(range(256)) * (layout.size // 256 + 1)
    assert layout.unpack_from(data) == struct.unpack_from(expected, data)


@settings(max_examples=60, deadline=None)
@given(
    crcs=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=30),
    data=st.data(),
    stride=st.sampled_from([40, 41, 44, 48]),
)
def test_crcs_continued_over_rows_of_any_stride(crcs, data, stride):
    # rows of a larger array (as the headers' CRC part is), aligned to 8 bytes or not
    rows = [data.draw(st.binary(min_size=stride, max_size=stride)) for _ in crcs]
    block = np.frombuffer(b"".join(rows), dtype=np.uint8).reshape(len(rows), stride)
    messages = block[:, stride - 40 :]
    got = _continue_crc(np.array(crcs, dtype=np.uint32), messages)
    expected = [crc32c(row[stride - 40 :], crc) for row, crc in zip(rows, crcs, strict=True)]
    assert got.tolist() == expected


def test_a_log_of_varied_single_appends_reads_back_and_reports_damage(tmp_path):
    path = str(tmp_path / "log")
    rng = np.random.default_rng(5)
    values = [rng.bytes(int(n)) for n in rng.integers(50, 151, size=3000)]
    with compactlog.open(path, segment_bytes=64 << 10) as log:
        for i, value in enumerate(values):
            log.append(b"%016d" % i, value)
    with compactlog.open(path, read_only=True) as log:
        assert [r.value for r in log.read()] == values
        assert [r.key for r in log.read()] == [b"%016d" % i for i in range(3000)]
        assert sum(len(b) for b in log.read_batches()) == 3000
    first = segment_files(path)[0]
    data = bytearray(first.read_bytes())
    positions = []
    pos = HEADER_SIZE
    while pos < len(data):
        header, _reason = check_batch(bytes(data), pos, len(data))
        positions.append(pos)
        pos += header.length
    target = positions[len(positions) // 2]
    data[body_position(target) + 20] ^= 0x10
    with open(first, "r+b") as f:
        f.write(data)
    with compactlog.open(path, read_only=True) as log, pytest.raises(CorruptLogError) as error:
        sum(len(b) for b in log.read_batches())
    assert error.value.position == target


@pytest.mark.parametrize("length", [0, 1, 4, 47, 48, 49])
@pytest.mark.parametrize("index", [0, 2, 7])
def test_a_length_field_too_short_for_a_header_ends_a_varied_run_there(length, index):
    buf, where = build_segment(single_appends([b"v" * (3 * i % 11) for i in range(10)]))
    pos = where[index][0]
    damaged = bytearray(buf)
    damaged[pos : pos + 4] = length.to_bytes(4, "little")
    run = scan_small_run(bytes(damaged), HEADER_SIZE, len(damaged))
    assert_run_ends_before(run, where, index)


def assert_run_ends_before(run, where, index: int) -> None:
    """A run from the segment's start holds the batches before ``where[index]`` (none if
    fewer than two: a run is at least two batches)."""
    if index < 2:
        assert run is None
    else:
        assert run is not None
        assert run.positions.tolist() == [p for p, _ in where[:index]]
        assert run.end == where[index][0]


# -- long runs: the length fields followed along many chains at once (format._chase) ----------


def chased(buf, pos, stop, turns=1 << 30):
    parts, found = [], []
    end = _chase(buf, pos, stop, turns, parts, found)
    return [p for part in parts for p in part.tolist()] + found, end


def stepped(buf, pos, stop, turns=1 << 30):
    found = []
    return found, _step(buf, pos, stop, turns, found)


def look_alike(length):
    """Bytes that look like the start of a single append's batch (count 1, last delta 0,
    length = body length + header), to put in values."""
    fake = bytearray(48)
    fake[0:4] = length.to_bytes(4, "little")
    fake[20:28] = (1).to_bytes(8, "little")
    fake[44:48] = max(length - 48, 0).to_bytes(4, "little")
    return bytes(fake)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(0, 300), min_size=450, max_size=700),
    fakes=st.lists(st.tuples(st.integers(0, 899), st.integers(0, 400)), max_size=6),
    damage=st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), max_size=3),
    stop_back=st.integers(0, 5000),
    data=st.data(),
)
def test_chains_find_exactly_what_stepping_finds(sizes, fakes, damage, stop_back, data):
    values = [bytes([i % 251]) * n for i, n in enumerate(sizes)]
    for index, length in fakes:  # values that look like batches (of any length)
        if index < len(values):
            values[index] = look_alike(length) + values[index]
    buf, where = build_segment(single_appends(values))
    damaged = bytearray(buf)
    for at, value in damage:
        if HEADER_SIZE <= at < len(damaged):
            damaged[at] = value
    damaged = bytes(damaged)
    start = data.draw(st.sampled_from([p for p, _ in where[:5]]))
    stop = max(start, len(damaged) - stop_back)
    assert chased(damaged, start, stop) == stepped(damaged, start, stop)
    with mmap.mmap(-1, len(damaged)) as mapped:
        mapped[:] = damaged
        assert chased(mapped, start, stop) == stepped(mapped, start, stop)
    if not damage:
        positions, end = chased(buf, where[0][0], len(buf))
        assert positions == [p for p, _ in where] and end == len(buf)


@pytest.mark.parametrize("field", sorted(FIELDS))
@pytest.mark.parametrize("index", [3, 700, 1499])
def test_a_damaged_batch_ends_a_long_varied_run_at_its_own_position(field, index):
    rng = np.random.default_rng(index)
    values = [rng.bytes(int(n)) for n in rng.integers(0, 200, size=1500)]
    buf, where = build_segment(single_appends(values))
    pos = where[index][0]
    end = where[index + 1][0] if index + 1 < len(where) else len(buf)
    at = FIELDS[field](pos)
    damaged = bytearray(buf)
    damaged[end - 1 if at is None else at] ^= 0x40
    for data in (bytes(damaged), bytes(buf)):
        run = scan_small_run(data, HEADER_SIZE, len(data))
        assert run is not None
        expected = index if data != buf else len(where)
        assert run.positions.tolist() == [p for p, _ in where[:expected]]
    if field == "body" and index == 700:
        check_same_as_columnar(buf)


def test_a_long_varied_run_with_batches_that_look_alike_in_its_values():
    values = [look_alike(48 + 7 * (i % 30)) * (i % 4) + b"v" * (i % 13) for i in range(3000)]
    buf, where = build_segment(single_appends(values))
    assert chased(buf, HEADER_SIZE, len(buf)) == ([p for p, _ in where], len(buf))
    check_same_as_columnar(buf)


@pytest.mark.parametrize("length", [0, 1, 47, 48, 49])
def test_a_length_field_too_short_for_a_header_ends_a_long_varied_run_there(length):
    values = [b"v" * (7 * i % 150) for i in range(1500)]
    buf, where = build_segment(single_appends(values))
    pos = where[700][0]
    damaged = bytearray(buf)
    damaged[pos : pos + 4] = length.to_bytes(4, "little")
    damaged = bytes(damaged)
    assert chased(damaged, HEADER_SIZE, len(damaged)) == stepped(damaged, HEADER_SIZE, len(damaged))
    run = scan_small_run(damaged, HEADER_SIZE, len(damaged))
    assert run is not None and run.end == pos
    assert run.positions.tolist() == [p for p, _ in where[:700]]


@pytest.mark.parametrize("back", [-1, 0, 1, 2, 3, 47, 48, 49])
def test_a_long_varied_run_ends_where_a_batch_would_pass_the_stop(back):
    values = [b"v" * (7 * i % 150) for i in range(1500)]
    buf, where = build_segment(single_appends(values))
    stop = where[1200][0] - back
    positions, end = chased(buf, HEADER_SIZE, stop)
    assert (positions, end) == stepped(buf, HEADER_SIZE, stop)
    assert positions == [p for p, _ in where[: 1200 if back <= 0 else 1199]]
