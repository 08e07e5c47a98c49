"""Every shape a log takes, read back by every API (issue 24 part 1).

A test that writes records of one size tests one shape: the subscriber once parsed a batch
header that straddled its 1 MiB read chunk and died, for 130-byte values but not for 100 or
200. Here the read chunk (``segment.READ_CHUNK``) is lowered to a few hundred bytes, and
hypothesis draws record sizes from empty to several chunks, single appends mixed with
batches, headers, tombstones, compression and segment sizes that roll often or never; the
same data is then read with ``read``, ``read_batches``, ``poll``, ``poll_batches``, a
durable subscriber that commits and resumes, ``async for``, a ``Table`` that restores, a
``Table`` that follows, and ``latest``: each must equal the model (the records written, in
order).
"""

from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import compactlog
from compactlog.encoding.batch_decode import Record
from compactlog.log import Log
from compactlog.storage import segment
from compactlog.table.table import Table

CHUNK = 256  # the read chunk in these tests: batches and their headers straddle it

sizes = st.one_of(
    st.integers(0, 3 * CHUNK),  # around the chunk, often
    st.integers(3 * CHUNK, 5 * CHUNK),  # several chunks: one batch read whole
    st.sampled_from([0, 1, CHUNK - 48, CHUNK - 1, CHUNK, CHUNK + 1]),
)
records = st.tuples(
    st.integers(0, 12),  # key number: few keys, so that latest and tables replace values
    st.one_of(sizes, st.just(-1)),  # value length; -1: a tombstone
    st.booleans(),  # with headers
)
steps = st.one_of(
    st.tuples(st.just("append"), records),
    st.tuples(st.just("batch"), st.lists(records, min_size=1, max_size=25)),
    st.tuples(st.just("poll"), st.integers(1, 40)),  # the tailing readers read some
)


class Model:
    """What was written, record by record, and the log it was written to."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.records: list[Record] = []
        self.seq = itertools.count()

    def _record(self, spec: tuple[int, int, bool]) -> tuple[bytes, bytes | None, int, dict]:
        number, length, with_headers = spec
        n = next(self.seq)
        value = None if length < 0 else (b"%d." % n * (length // 2 + 1))[:length]
        headers = {"h": b"%d" % n} if with_headers else None
        return b"key-%d" % number, value, 1_700_000_000_000 + n, headers

    def append(self, spec: tuple[int, int, bool]) -> None:
        key, value, ts, headers = self._record(spec)
        offset = self.log.append(key, value, timestamp_ms=ts, headers=headers)
        self.records.append(Record(offset, key, value, ts, headers))

    def append_batch(self, specs: list[tuple[int, int, bool]]) -> None:
        made = [self._record(spec) for spec in specs]
        with_headers = any(h for *_rest, h in made)
        offsets = self.log.append_batch(
            [(key, value) for key, value, _ts, _h in made],
            timestamps_ms=[ts for _k, _v, ts, _h in made],
            headers=[h for *_rest, h in made] if with_headers else None,
        )
        for offset, (key, value, ts, headers) in zip(offsets, made, strict=True):
            self.records.append(Record(offset, key, value, ts, headers))

    def latest(self) -> dict[bytes, bytes]:
        state: dict[bytes, bytes] = {}
        for record in self.records:
            if record.value is None:
                state.pop(record.key, None)
            else:
                state[record.key] = record.value
        return state


class Tailing:
    """The subscribers reading while the log is written, each with its own limits."""

    def __init__(self, log: Log, max_bytes: int | None) -> None:
        self.log = log
        self.max_bytes = max_bytes
        self.rows = log.subscribe("~rows", start=0)
        self.columns = log.subscribe("~columns", start=0)
        self.durable = log.subscribe("durable")
        self.got_rows: list[Record] = []
        self.got_columns: list[Record] = []
        self.got_durable: list[Record] = []

    def poll(self, count: int) -> int:
        rows = self.rows.poll(max_records=count)
        self.got_rows.extend(rows)
        batches = self.columns.poll_batches(max_records=count, max_bytes=self.max_bytes)
        self.got_columns.extend(r for b in batches for r in b.records())
        durable = self.durable.poll(max_records=count + 3)
        self.got_durable.extend(durable)
        self.durable.commit()
        if len(durable) % 2:  # now and then a durable consumer stops and another resumes
            self.durable.close()
            self.durable = self.log.subscribe("durable")
        return len(rows) + len(batches) + len(durable)

    def drain(self, count: int) -> None:
        while self.poll(count):
            pass


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    plan=st.lists(steps, min_size=1, max_size=30),
    segment_bytes=st.sampled_from([1024, 4096, 64 << 20]),
    compression=st.sampled_from(["none", "zstd"]),
    max_bytes=st.one_of(st.none(), st.integers(1, 4 * CHUNK)),
    cut=st.tuples(st.floats(0, 1), st.floats(0, 1)),
)
def test_every_api_reads_every_shape_as_written(
    tmp_path_factory, plan, segment_bytes, compression, max_bytes, cut
):
    directory = tmp_path_factory.mktemp("shapes") / "log"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(segment, "READ_CHUNK", CHUNK)
        config = dict(segment_bytes=segment_bytes, compression=compression)
        with compactlog.open(directory, **config) as log:
            model = Model(log)
            follower = Table(log.directory, follow=False, raw=True)  # follows by refresh()
            tailing = Tailing(log, max_bytes)
            for step, arg in plan:
                if step == "append":
                    model.append(arg)
                elif step == "batch":
                    model.append_batch(arg)
                else:
                    tailing.poll(arg)
            expected = model.records
            tailing.drain(7)
            assert tailing.got_rows == expected
            assert tailing.got_columns == expected
            assert tailing.got_durable == expected

            assert list(log.read()) == expected
            assert [r for b in log.read_batches() for r in b.records()] == expected
            end = log.end_offset
            start, stop = sorted(int(f * end) for f in cut)
            assert list(log.read(start, stop)) == [r for r in expected if start <= r.offset < stop]
            assert list(_async_records(log, len(expected))) == expected

            latest = model.latest()
            assert {r.key: r.value for r in log.latest(raw=True)} == latest
            follower.refresh()
            assert dict(follower) == latest
            follower.close()
            with Table(log.directory, follow=False, raw=True) as restored:
                assert dict(restored) == latest


def _async_records(log: Log, count: int) -> list[Record]:
    async def consume() -> list[Record]:
        got: list[Record] = []
        if not count:
            return got
        async for record in log.subscribe("~async", start=0):
            got.append(record)
            if len(got) == count:
                break
        return got

    return asyncio.run(consume())


def test_a_subscriber_reads_past_a_batch_header_straddling_its_read_chunk(tmp_path):
    """Issue 24: 20,000 single appends of 130-byte values put a batch header across the
    subscriber's 1 MiB chunk; ``poll_batches`` raised ``struct.error`` there, for good."""
    with compactlog.open(tmp_path / "log") as log:
        for i in range(20_000):
            log.append(b"k%06d" % i, b"x" * 130)
        batches = log.subscribe("~t", start=0).poll_batches(65536)
        assert [o for b in batches for o in b.offsets.tolist()] == list(range(20_000))
