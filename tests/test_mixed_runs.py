"""Logs of single appends mixed with batches: one run, one read of every shape.

A writer that appends single records and now and then a batch (``append_batch`` of 2 to
1,000 records) stores small batches interrupted by large ones. The small-run scanner
(``small_runs.scan_small_run``) starts a run at a small batch and goes on through the
large ones, so that such a log reads in runs as long as a log of single appends does
(issue 24: it read 13-45x slower when each large batch cut the run). Every read path must
give exactly what was written, across read-chunk boundaries, with and without zstd, and
damage inside a mixed run is still reported at its own position.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import compactlog
from compactlog.encoding.batch_decode import Record
from compactlog.errors import CorruptLogError
from compactlog.storage import segment

from .helpers import batch_positions, body_position, flip_bit, segment_files

TS = 1_700_000_000_000

value_sizes = st.sampled_from([0, 1, 7, 100, 100, 100, 300, 1500])
single = st.tuples(st.just(1), value_sizes, st.booleans())  # (records, value size, headers)
batch = st.tuples(
    st.one_of(st.integers(2, 12), st.sampled_from([50, 200, 1000])), value_sizes, st.booleans()
)
appends = st.lists(st.one_of(single, single, single, batch), min_size=1, max_size=60)


def write(log, plan, *, vary: bool = True) -> list[Record]:
    """Append ``plan`` (``(records, value size, with headers)`` each: 1 is a single append,
    more a batch); returns the records as written, in offset order."""
    written = []
    i = 0
    for count, size, with_headers in plan:
        items = []
        for _ in range(count):
            key = b"key-%06d" % (i % 97)
            value = None if i % 13 == 6 else bytes([i % 251]) * (size + vary * (i % 3))
            headers = {"n": b"%d" % i} if with_headers and i % 2 else None
            items.append((key, value, headers))
            i += 1
        # batches of an odd size give each record its own timestamp (a timestamp column)
        stamps = [TS + len(written) + j * (count % 2) for j in range(count)]
        if count == 1:
            key, value, headers = items[0]
            offsets = [log.append(key, value, timestamp_ms=stamps[0], headers=headers)]
        else:
            pairs = [(k, v) for k, v, _h in items]
            offsets = log.append_batch(
                pairs, timestamps_ms=stamps, headers=[h for _k, _v, h in items]
            )
        written += [
            Record(o, k, v, ts, h) for o, (k, v, h), ts in zip(offsets, items, stamps, strict=True)
        ]
    return written


def latest_of(records: list[Record]) -> dict[bytes, Record]:
    last: dict[bytes, Record] = {}
    for record in records:
        last[record.key] = record
    return {k: r for k, r in last.items() if r.value is not None}


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    plan=appends,
    compression=st.sampled_from(["none", "zstd"]),
    segment_bytes=st.sampled_from([4096, 65536, 1 << 24]),
    chunk=st.sampled_from([4096, 10_000, 1 << 22]),
    cut=st.tuples(st.integers(0, 5000), st.integers(0, 5000)),
)
def test_a_mixed_log_reads_exactly_what_was_written_through_every_path(
    tmp_path_factory, monkeypatch, plan, compression, segment_bytes, chunk, cut
):
    # the newest segment is read in chunks of this many bytes: runs and batches straddle them
    monkeypatch.setattr(segment, "READ_CHUNK", chunk)
    directory = tmp_path_factory.mktemp("mixed")
    config = dict(segment_bytes=segment_bytes, compression=compression, cleanup_policy="delete")
    with compactlog.open(directory / "log", **config) as log:
        written = write(log, plan)
        log.flush()
        assert list(log.read()) == written
        batches = list(log.read_batches())
        assert [r for b in batches for r in b.records()] == written
        for b in batches:  # columns agree with the records they hold
            assert b.offsets.tolist() == [r.offset for r in b.records()]
        start, end = sorted(cut)
        assert list(log.read(start=start, end=end)) == written[start:end]
        expected = latest_of(written)
        got = {r.key: r for r in log.latest(raw=True)}
        assert got == expected


@pytest.mark.parametrize("every", [1, 2, 16, 100])
@pytest.mark.parametrize("batch_size", [2, 10, 1000])
def test_batches_among_single_appends_do_not_cut_the_run(log_dir, every, batch_size):
    """A log of single appends with a batch every ``every`` of them reads in runs as long
    as the log of single appends alone (issue 24: each batch cut the run, and the log read
    30 times slower)."""
    plan = []
    records = 0
    while records < 30_000:
        plan += [(1, 100, False)] * every + [(batch_size, 100, False)]
        records += every + batch_size
    with compactlog.open(log_dir, segment_bytes=64 << 20) as log:
        written = write(log, plan)
        batches = list(log.read_batches())
        assert [r for b in batches for r in b.records()] == written
        stored = sum(b.stored_batches for b in batches)
        assert stored == len(plan)
        # a run ends only at the run limits or the read chunk (about 4 MiB of these)
        assert len(batches) <= 2 + 3 * sum(b.size_bytes for b in batches) // segment.RUN_BYTES


@pytest.mark.parametrize("which", ["batch", "single after a batch", "single before a batch"])
@pytest.mark.parametrize("closed", [True, False])
def test_damage_inside_a_mixed_run_is_reported_at_its_own_position(log_dir, which, closed):
    plan = [(1, 40, False)] * 5 + [(10, 40, False)] + [(1, 40, False)] * 5
    with compactlog.open(log_dir, segment_bytes=4096 if closed else 1 << 24) as log:
        write(log, plan * 8)
        log.flush()
        path = segment_files(log_dir)[0]
        found = batch_positions(path)
        # the second group of the plan: 5 singles, the batch, 5 singles
        index = {"batch": 16, "single after a batch": 17, "single before a batch": 15}[which]
        pos = found[index][0]
        flip_bit(path, body_position(pos) + 3)
        with pytest.raises(CorruptLogError) as caught:
            list(log.read())
        assert caught.value.position == pos
        assert "CRC" in str(caught.value)
        with pytest.raises(CorruptLogError):
            list(log.read_batches())
        with pytest.raises(CorruptLogError):
            list(log.latest())


@pytest.mark.parametrize("which", ["single", "batch"])
def test_damage_among_single_appends_of_one_size_in_a_mixed_run(log_dir, which):
    """The single appends of one size in a mixed run have their CRCs computed as rows of
    one length (``small_runs._varied_crcs``): damage to one of them, or to a batch among
    them, is still reported at its own position."""
    plan = ([(1, 40, False)] * 30 + [(10, 40, False)]) * 8
    with compactlog.open(log_dir, segment_bytes=1 << 24) as log:
        written = write(log, plan, vary=False)
        log.flush()  # (damage past the sync point ends the data like a torn tail: head.py)
        assert [r for b in log.read_batches() for r in b.records()] == written
        path = segment_files(log_dir)[0]
        index = 31 * 4 + (30 if which == "batch" else 17)
        pos = batch_positions(path)[index][0]
        flip_bit(path, body_position(pos) + 2)
        with pytest.raises(CorruptLogError) as caught:
            list(log.read_batches())
        assert caught.value.position == pos
