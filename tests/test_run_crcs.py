"""CRCs of a run of equal-length small batches, computed at once (``row_crcs.rows_crcs``).

A log of single appends of records of one size is rows of one length; ``scan_small_run``
checks their CRCs together (one ``crc32c`` call, then a table lookup per varying byte
column). Every stored batch's CRC must still be checked exactly: each row's value must be
bit for bit what ``check_batch`` computes for that batch alone (``crc32c`` of the body
continued over header bytes [8, 48)), and damage to any byte of any batch must stop the run
there, with the same error position as the batch-by-batch path.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactlog.encoding import row_crcs as fmt
from compactlog.encoding.format import BATCH_HEADER, CODEC_NONE, CRC_START, check_batch, crc32c
from compactlog.encoding.row_crcs import rows_crcs
from compactlog.encoding.small_runs import scan_small_run
from compactlog.storage.segment import HEADER_SIZE

from .test_small_batches import build_segment, columnar, fast, records_of


def stored_crc(row: bytes) -> int:
    """What ``check_batch`` compares a batch's CRC field with."""
    return crc32c(row[CRC_START : BATCH_HEADER.size], crc32c(row[BATCH_HEADER.size :]))


@st.composite
def row_blocks(draw):
    """Rows of one length where a drawn set of byte columns varies and the rest is shared
    (as single appends of records of one size are), sometimes every column varying."""
    n = draw(st.integers(2, 40))
    length = draw(st.integers(BATCH_HEADER.size + 1, 300))
    shared = np.frombuffer(draw(st.binary(min_size=length, max_size=length)), dtype=np.uint8)
    rows = np.tile(shared, (n, 1))
    if draw(st.booleans()):
        varying = list(range(length))
    else:
        varying = draw(st.lists(st.integers(0, length - 1), max_size=12, unique=True))
    seed = draw(st.integers(0, 2**32 - 1))
    noise = np.random.default_rng(seed).integers(0, 256, size=(n, len(varying)), dtype=np.uint8)
    rows[:, varying] = noise
    return rows


@settings(max_examples=150, deadline=None)
@given(rows=row_blocks())
def test_every_row_crc_equals_crc32c_of_that_batch_alone(rows):
    # with the varying-column limit lifted, every row block takes the table path
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fmt, "_ROWS_CRC_MAX_VARYING", 1 << 20)
        got = fmt._rows_crcs_by_table(rows)
    assert got is not None
    assert got.dtype == np.uint32
    assert got.tolist() == [stored_crc(row.tobytes()) for row in rows]


@settings(max_examples=60, deadline=None)
@given(rows=row_blocks())
def test_with_the_default_limits_the_crcs_are_the_same(rows):
    assert rows_crcs(rows).tolist() == [stored_crc(row.tobytes()) for row in rows]


def test_rows_of_random_bytes_are_left_to_one_crc32c_call_each():
    rows = np.random.default_rng(7).integers(0, 256, size=(100, 172), dtype=np.uint8)
    assert fmt._rows_crcs_by_table(rows) is None
    assert rows_crcs(rows).tolist() == [stored_crc(row.tobytes()) for row in rows]


def equal_batches(count: int = 40) -> tuple[bytes, list[tuple[int, int]]]:
    """Single appends of one size, as a segment's bytes (varying keys and timestamps)."""
    batches = [
        (
            [(b"key-%06d" % i, b"value-%03d" % (i % 7), None, 0, 1_700_000_000_000 + i)],
            True,
            CODEC_NONE,
            0,
        )
        for i in range(count)
    ]
    return build_segment(batches)


def test_equal_batches_take_the_table_path():
    buf, where = equal_batches()
    length = where[1][0] - where[0][0]
    rows = np.frombuffer(buf, dtype=np.uint8, offset=HEADER_SIZE).reshape(-1, length)
    got = fmt._rows_crcs_by_table(rows)
    assert got is not None
    assert got.tolist() == [int.from_bytes(row[4:8].tobytes(), "little") for row in rows]


def test_damage_to_any_byte_of_a_batch_ends_the_run_before_it():
    buf, where = equal_batches(12)
    length = where[1][0] - where[0][0]
    victim = 7
    pos = where[victim][0]
    for at in range(pos, pos + length):
        for mask in (1, 0x80):
            damaged = bytearray(buf)
            damaged[at] ^= mask
            run = scan_small_run(bytes(damaged), HEADER_SIZE, len(damaged))
            assert run is not None, at
            assert run.end == pos, (at - pos, mask)
            assert run.positions.tolist() == [p for p, _ in where[:victim]]
            assert check_batch(bytes(damaged), pos, len(damaged))[0] is None


def test_a_batch_differing_only_in_a_column_constant_elsewhere_is_checked():
    # the one varying column of the run is in a single batch: its CRC still must match
    buf, where = equal_batches(30)
    damaged = bytearray(buf)
    pos = where[20][0]
    damaged[pos + BATCH_HEADER.size + 8] ^= 0x10  # first key byte, "k" in every other batch
    run = scan_small_run(bytes(damaged), HEADER_SIZE, len(damaged))
    assert run is not None and run.end == pos and len(run) == 20


def test_a_run_of_equal_batches_decodes_like_the_columnar_path():
    buf, _where = equal_batches(200)
    decoded = fast(buf, 1 << 20, 1 << 20)
    assert [b.stored_batches for b, _ in decoded] == [200]
    assert records_of([b for b, _ in decoded]) == records_of(columnar(buf))


def test_readback_benchmark_with_random_values_reads_back_what_it_wrote(tmp_path):
    from benchmarks import bench_readback

    result = bench_readback.run(records=2000, repeat=1, root=str(tmp_path), random_values=True)
    assert result["setup"]["values"] == "random bytes"
    assert result["as_written"]["read_batches_records_per_s"] > 0
    assert result["after_one_compaction"]["read_records_per_s"] > 0
