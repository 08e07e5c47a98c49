"""Runs of batches alike (single appends of records of one size): the fast checks and
decoding of ``small_runs._check_alike`` and ``small_runs._decode_alike``, and the CRCs of
``row_crcs._messages_crcs`` through the per-thread scratch buffer.

These paths skip per-batch work when every batch of a run has the first one's length,
magic, codec, flags, count and last delta. Each test here would fail on an implementation
that trusted the first batch for the others: runs are built alike, then single fields of
single batches are changed (with the CRC made valid again, so that only the field checks
can catch it), and the run found must be exactly what checking every batch on its own
(``check_batch``, offsets, limits) gives, decoded exactly as the general path decodes it.
"""

from __future__ import annotations

import dataclasses
import struct
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from compactlog.encoding import format as fmt
from compactlog.encoding import row_crcs, small_runs
from compactlog.encoding.batch_decode import concat_batches
from compactlog.encoding.format import (
    BATCH_HEADER,
    CODEC_NONE,
    CODEC_ZSTD,
    CRC_START,
    check_batch,
    crc32c,
)
from compactlog.encoding.small_runs import SMALL_BATCH_RECORDS, decode_small_run, scan_small_run
from compactlog.storage.segment import HEADER_SIZE

from .helpers import decode_columns
from .test_small_batches import build_segment

# (name, position in the batch, struct format) of the fields a damaged batch gets changed
FIELDS = [
    ("length", 0, "<I"),
    ("crc", 4, "<I"),
    ("magic", 8, "<B"),
    ("codec", 9, "<B"),
    ("flags", 10, "<H"),
    ("base_offset", 12, "<q"),
    ("count", 20, "<I"),
    ("last_delta", 24, "<I"),
    ("first_ts", 28, "<q"),
    ("max_ts", 36, "<q"),
    ("body_length", 44, "<I"),
    ("first body word", 48, "<i"),  # a length column (the key's, or the timestamps')
    ("second body word", 52, "<i"),
]
SMALL_VALUES = st.one_of(st.integers(0, 9), st.sampled_from([0xFF, 0xFFFF, 2**31 - 1]))


def reference_run(buf: bytes, pos: int, end: int, max_records: int, max_bytes: int):
    """The run ``scan_small_run`` must find, from ``check_batch`` of each batch alone:
    ``(positions, end)`` or ``None``."""
    stop = min(end, pos + max_bytes)
    found = []
    counts = []
    previous = None
    while len(found) < max(max_records, 2):
        header, _reason = check_batch(buf, pos, stop)
        if header is None or (not found and header.count > SMALL_BATCH_RECORDS):
            break  # (a run starts at a small batch; the batches after it may be of any size)
        if previous is not None and header.base_offset <= previous.last_offset:
            break
        found.append(pos)
        counts.append(header.count)
        previous = header
        pos += header.length
    if len(found) >= 2:
        limit = max(max_records, counts[0] + min(counts[1], SMALL_BATCH_RECORDS))
        total = np.cumsum(counts)
        keep = int(np.searchsorted(total, limit, side="right"))
        if keep < len(found):
            found = found[:keep]
    if len(found) < 2:
        return None
    end_of_run = found[-1] + struct.unpack_from("<I", buf, found[-1])[0]
    return found, end_of_run


def with_valid_crc(data: bytearray, pos: int) -> None:
    length = struct.unpack_from("<I", data, pos)[0]
    if pos + length > len(data) or length < BATCH_HEADER.size:
        return  # a length field pointing elsewhere: no CRC to make valid
    body_crc = crc32c(bytes(data[pos + BATCH_HEADER.size : pos + length]))
    crc = crc32c(bytes(data[pos + CRC_START : pos + BATCH_HEADER.size]), body_crc)
    struct.pack_into("<I", data, pos + 4, crc)


@st.composite
def alike_segments(draw):
    """A segment of batches alike, as single appends of one record size write them (or,
    drawn, with a field every batch shares that makes them not simple: zstd bodies,
    headers, tombstones, two records per batch, offsets left by compaction)."""
    n = draw(st.integers(2, 40))
    key_size = draw(st.integers(0, 12))
    value_size = draw(st.one_of(st.none(), st.integers(0, 30)))
    headers = draw(st.sampled_from([None, {"h": b"xy"}]))
    codec = draw(st.sampled_from([CODEC_NONE, CODEC_NONE, CODEC_ZSTD]))
    per_batch = draw(st.sampled_from([1, 1, 1, 2]))
    slack = draw(st.sampled_from([0, 0, 0, 1]))  # offsets after the last record
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    batches = []
    for i in range(n):
        records = []
        for j in range(per_batch):
            key = rng.integers(0, 256, key_size, dtype=np.uint8).tobytes()
            value = (
                None
                if value_size is None
                else rng.integers(0, 256, value_size, dtype=np.uint8).tobytes()
            )
            records.append((key, value, headers, 0, 1_700_000_000_000 + 3 * i + j))
        batches.append((records, True, codec, slack))
    return build_segment(batches)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    segment=alike_segments(),
    damage=st.lists(
        st.tuples(
            st.integers(0, 39),  # the batch (modulo the run's length)
            st.sampled_from(FIELDS),
            SMALL_VALUES,
            st.booleans(),  # make the CRC valid again
        ),
        max_size=3,
    ),
    max_records=st.sampled_from([1, 3, 7, 16, 1 << 20]),
    max_bytes=st.sampled_from([300, 2000, 1 << 20]),
)
def test_runs_of_batches_alike_are_checked_as_every_batch_alone(
    segment, damage, max_records, max_bytes
):
    buf, where = segment
    data = bytearray(buf)
    for index, (_name, at, form), value, fix in damage:
        pos = where[index % len(where)][0]
        if form[-1].isupper():  # unsigned: what fits
            value &= (1 << (8 * struct.calcsize(form))) - 1
        struct.pack_into(form, data, pos + at, value)
        if fix:
            with_valid_crc(data, pos)
    buf = bytes(data)
    run = check_against_reference(buf, max_records, max_bytes)
    if run is None:
        event("no run")
        return
    event(f"run: alike {bool(run.length)}, simple {run.simple}")
    assert run.headers.tolist() == [BATCH_HEADER.unpack_from(buf, p) for p in run.positions]
    try:
        batch = decode_small_run(buf, run)
    except Exception:  # (check_against_reference saw the general path raise it too)
        return
    # ... and decoded as each stored batch decodes alone
    alone = [decode_columns(buf, p, check_batch(buf, p, len(buf))[0]) for p in run.positions]
    assert_same_batch(batch, concat_batches(alone))


def assert_same_batch(batch, reference) -> None:
    assert batch.header == reference.header
    assert batch.position == reference.position
    assert batch.stored_batches == reference.stored_batches
    for name in ("offsets", "timestamps", "key_lengths", "value_lengths"):
        got, want = getattr(batch, name), getattr(reference, name)
        assert got.dtype == want.dtype, name
        assert got.tolist() == want.tolist(), name
    assert bytes(batch.keys_blob) == bytes(reference.keys_blob)
    assert bytes(batch.values_blob) == bytes(reference.values_blob)
    assert (batch.header_lengths is None) == (reference.header_lengths is None)
    if batch.header_lengths is not None:
        assert batch.header_lengths.tolist() == reference.header_lengths.tolist()
        assert bytes(batch.headers_blob) == bytes(reference.headers_blob)


def check_against_reference(buf: bytes, max_records: int = 1 << 20, max_bytes: int = 1 << 20):
    """:func:`scan_small_run` and :func:`decode_small_run` from the start of ``buf``
    against the references (as the property test above does); returns the run."""
    expected = reference_run(buf, HEADER_SIZE, len(buf), max_records, max_bytes)
    run = scan_small_run(buf, HEADER_SIZE, len(buf), max_records, max_bytes)
    if expected is None:
        assert run is None
        return None
    assert run is not None
    assert (run.positions.tolist(), run.end) == expected
    general = dataclasses.replace(run, length=0, simple=False)
    try:
        reference = decode_small_run(buf, general)
    except Exception as error:  # any error: the fast path must raise it too
        with pytest.raises(type(error)):
            decode_small_run(buf, run)
        return run
    assert_same_batch(decode_small_run(buf, run), reference)
    return run


def single_appends(count: int = 30, per_batch: int = 1, value: bytes | None = b"v" * 9):
    """A segment of ``count`` batches alike (keys and timestamps differ)."""
    return build_segment(
        [
            (
                [(b"k%03d" % i, value, None, 0, 5 + i) for _ in range(per_batch)],
                True,
                CODEC_NONE,
                0,
            )
            for i in range(count)
        ]
    )


@pytest.mark.parametrize("name, at, form", FIELDS, ids=[f[0] for f in FIELDS])
@pytest.mark.parametrize("victim", [0, 1, 2, 9, 29])
@pytest.mark.parametrize("value", [0, 1, 2, 9, 0x80, 0xFFFF, 2**31 - 1])
def test_one_field_of_one_batch_changed_with_a_valid_crc(name, at, form, victim, value):
    buf, where = single_appends()
    data = bytearray(buf)
    pos = where[victim][0]
    if form[-1].isupper():
        value &= (1 << (8 * struct.calcsize(form))) - 1
    struct.pack_into(form, data, pos + at, value)
    with_valid_crc(data, pos)
    check_against_reference(bytes(data))


@pytest.mark.parametrize("name, at, form", FIELDS[2:], ids=[f[0] for f in FIELDS[2:]])
@pytest.mark.parametrize("value", [0, 1, 2, 9, 0x80, 0x100, 0x8000, 0xFFFF])
def test_one_field_of_every_batch_changed_alike_with_valid_crcs(name, at, form, value):
    # every batch shares the change (so the batches are still alike): the first batch's
    # fields must be checked as every batch's are
    buf, where = single_appends()
    data = bytearray(buf)
    if form[-1].isupper():
        value &= (1 << (8 * struct.calcsize(form))) - 1
    for pos, _base in where:
        struct.pack_into(form, data, pos + at, value)
        with_valid_crc(data, pos)
    check_against_reference(bytes(data))


@pytest.mark.parametrize(
    "key_length, value_length, flags",
    [
        (7, -1, None),  # a tombstone whose key length makes up for its -1
        (-1, 7, None),  # no key, and a value length that makes up for its -1
        (5, 1, fmt.FLAG_HEADERS),  # a headers column claimed, its bytes read as the key
    ],
)
def test_length_columns_that_add_up_only_when_misread_are_refused(key_length, value_length, flags):
    # every batch alike (4-byte key, 2-byte value: 14 body bytes) and CRC-valid, with
    # length columns whose sum is the body's only as the fast decoder would read them
    buf, where = single_appends(value=b"vv")
    data = bytearray(buf)
    for pos, _base in where:
        if flags is not None:
            struct.pack_into("<H", data, pos + 10, fmt.FLAG_SINGLE_TIMESTAMP | flags | 2)
        struct.pack_into("<ii", data, pos + 48, key_length, value_length)
        with_valid_crc(data, pos)
    run = check_against_reference(bytes(data))
    assert run is not None
    with pytest.raises(ValueError):
        decode_small_run(bytes(data), run)


@pytest.mark.parametrize("victim", [1, 2, 9, 20])
@pytest.mark.parametrize("shift", [-1, 0, 2])
def test_a_batch_whose_offsets_do_not_follow_ends_the_run(victim, shift):
    # its base offset the previous batch's last offset (shift 0), one below, or a gap above
    buf, where = single_appends(per_batch=1)
    data = bytearray(buf)
    pos = where[victim][0]
    struct.pack_into("<q", data, pos + 12, where[victim - 1][1] + shift)
    with_valid_crc(data, pos)
    run = check_against_reference(bytes(data))
    if shift <= 0:
        assert run is None if victim < 2 else run.end == pos


@pytest.mark.parametrize("per_batch", [1, 2, 3, 8])
@pytest.mark.parametrize("max_records", [1, 2, 3, 5, 16, 17, 30, 1000])
def test_runs_of_batches_alike_respect_the_record_limit(per_batch, max_records):
    buf, _where = single_appends(per_batch=per_batch)
    run = check_against_reference(buf, max_records=max_records)
    if run is not None:
        records = int(run.headers["count"].sum())
        assert records <= max(max_records, 2 * per_batch)


def test_single_appends_of_one_size_take_the_fast_paths(monkeypatch):
    buf, where = build_segment(
        [([(b"key-%04d" % i, b"v" * 30, None, 0, 7 + i)], True, CODEC_NONE, 0) for i in range(50)]
    )
    taken = []
    alike = small_runs._decode_alike

    def spy(*args):
        batch = alike(*args)
        taken.append(batch is not None)
        return batch

    monkeypatch.setattr(small_runs, "_decode_alike", spy)
    run = scan_small_run(buf, HEADER_SIZE, len(buf))
    assert run is not None and run.simple and run.length == where[1][0] - where[0][0]
    batch = decode_small_run(buf, run)
    assert taken == [True]
    assert batch.keys() == [b"key-%04d" % i for i in range(50)]
    assert batch.timestamps.tolist() == [7 + i for i in range(50)]


def test_a_batch_whose_flags_differ_with_a_valid_crc_ends_the_run_there():
    buf, where = build_segment(
        [([(b"k%03d" % i, b"v" * 9, None, 0, 5)], True, CODEC_NONE, 0) for i in range(30)]
    )
    for field, at, value in [("codec", 9, 7), ("flags", 10, 0x80), ("magic", 8, 2)]:
        data = bytearray(buf)
        pos = where[20][0]
        data[at + pos] = value
        with_valid_crc(data, pos)
        run = scan_small_run(bytes(data), HEADER_SIZE, len(data))
        assert run is not None and run.end == pos and len(run) == 20, field


# -- CRCs through the scratch buffer -------------------------------------------------------


def stored_crc(row: bytes) -> int:
    return crc32c(row[CRC_START : BATCH_HEADER.size], crc32c(row[BATCH_HEADER.size :]))


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(1, 200),
    lengths=st.lists(st.integers(BATCH_HEADER.size, 700), min_size=1, max_size=7),
    scratch_bytes=st.sampled_from([128, 1000, 4096, 1 << 18]),
    seed=st.integers(0, 2**32 - 1),
)
def test_messages_crcs_equal_crc32c_of_each_batch_alone(n, lengths, scratch_bytes, seed):
    # a small scratch: many blocks per call, some rows longer than half of it (no scratch),
    # and more lengths than a thread keeps views for
    rng = np.random.default_rng(seed)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(row_crcs, "_CRC_SCRATCH_BYTES", scratch_bytes)
        patch.setattr(row_crcs, "_crc_scratch", row_crcs._CrcScratch())
        for length in lengths:
            rows = rng.integers(0, 256, size=(n, length), dtype=np.uint8)
            got = row_crcs._messages_crcs(rows)
            assert got.dtype == np.uint32
            assert got.tolist() == [stored_crc(row.tobytes()) for row in rows]


def test_a_call_made_while_the_scratch_is_in_use_does_not_touch_it():
    rows = np.random.default_rng(3).integers(0, 256, size=(50, 100), dtype=np.uint8)
    scratch = row_crcs._crc_scratch
    block, _views = scratch.block(100 - CRC_START)
    before = block.copy()
    scratch.busy = True
    try:
        got = row_crcs._messages_crcs(rows)
    finally:
        scratch.busy = False
    assert got.tolist() == [stored_crc(row.tobytes()) for row in rows]
    assert np.array_equal(block, before)


def test_a_reentrant_call_does_not_overwrite_the_scratch_in_use(monkeypatch):
    # (a signal handler reading a log in the middle of a scan)
    rng = np.random.default_rng(4)
    outer = rng.integers(0, 256, size=(300, 172), dtype=np.uint8)
    inner = rng.integers(0, 256, size=(300, 172), dtype=np.uint8)
    inner_crcs = []
    entered = []
    real = row_crcs.crc32c

    def crc(data, *args):
        if not entered:
            entered.append(True)
            inner_crcs.append(row_crcs._messages_crcs(inner).tolist())
        return real(data, *args)

    monkeypatch.setattr(row_crcs, "crc32c", crc)
    assert row_crcs._messages_crcs(outer).tolist() == [stored_crc(r.tobytes()) for r in outer]
    assert inner_crcs == [[stored_crc(r.tobytes()) for r in inner]]


def test_threads_have_their_own_scratch():
    failures = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(30):
            rows = rng.integers(0, 256, size=(500, 172), dtype=np.uint8)
            if row_crcs._messages_crcs(rows).tolist() != [stored_crc(r.tobytes()) for r in rows]:
                failures.append(seed)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
