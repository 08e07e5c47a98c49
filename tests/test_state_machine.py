"""A hypothesis state machine: random appends, batches, tombstones, flushes, reopens and
segment rolls against an in-memory model list; every read equals the model."""

from __future__ import annotations

import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import compactlog
from compactlog.engine.invariants import check
from compactlog.storage.segment import list_segments

from .helpers import FakeClock

KEYS = st.binary(min_size=1, max_size=12)
VALUES = st.one_of(st.none(), st.binary(max_size=300))
HEADERS = st.one_of(st.none(), st.dictionaries(st.text(max_size=5), st.binary(max_size=5)))


class LogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="compactlog-sm-")
        self.clock = FakeClock(1_000_000)
        self.config = {"segment_bytes": 1024, "segment_ms": 60_000, "index_interval_bytes": 128}
        self.model: list[tuple[bytes, bytes | None, int, dict | None]] = []
        self.log = compactlog.open(self.directory, clock=self.clock, **self.config)

    def teardown(self) -> None:
        self.log.check()
        self.log.close()
        check(self.directory, deep=True)
        shutil.rmtree(self.directory, ignore_errors=True)

    @rule(key=KEYS, value=VALUES, headers=HEADERS)
    def append(self, key, value, headers):
        offset = self.log.append(key, value, headers=headers)
        assert offset == len(self.model)
        self.model.append((key, value, self.clock.now, headers or None))

    @rule(key=KEYS)
    def tombstone(self, key):
        assert self.log.append(key, None) == len(self.model)
        self.model.append((key, None, self.clock.now, None))

    @rule(
        records=st.lists(st.tuples(KEYS, VALUES), min_size=1, max_size=40),
        per_record_time=st.booleans(),
    )
    def append_batch(self, records, per_record_time):
        stamps = [self.clock.now + i for i in range(len(records))] if per_record_time else None
        offsets = self.log.append_batch(records, timestamps_ms=stamps)
        assert offsets == range(len(self.model), len(self.model) + len(records))
        for i, (key, value) in enumerate(records):
            self.model.append((key, value, stamps[i] if stamps else self.clock.now, None))

    @rule()
    def flush(self):
        self.log.flush()

    @rule(precommit=st.booleans(), compression=st.sampled_from(["none", "zstd"]))
    def reopen(self, precommit, compression):
        self.log.close()
        self.log = compactlog.open(
            self.directory,
            clock=self.clock,
            precommit_bytes=4096 if precommit else 0,
            compression=compression,
            sync="os",
            update_config=True,
        )

    @rule(ms=st.sampled_from([1, 1000, 60_000]))
    def time_passes(self, ms):
        self.clock.advance(ms)  # 60 s rolls the segment at the next append (segment_ms)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def read_a_range(self, data):
        self.log.flush()
        n = len(self.model)
        start = data.draw(st.integers(0, n))
        end = data.draw(st.integers(start, n))
        got = [(r.offset, r.key, r.value) for r in self.log.read(start, end)]
        assert got == [(o, self.model[o][0], self.model[o][1]) for o in range(start, end)]

    @invariant()
    def everything_reads_back_in_order(self):
        self.log.flush()
        records = list(self.log.read())
        assert self.log.end_offset == len(self.model)
        assert [r.offset for r in records] == list(range(len(self.model)))
        assert [(r.key, r.value, r.timestamp, r.headers) for r in records] == self.model
        columns = sum(len(b) for b in self.log.read_batches())
        assert columns == len(self.model)
        bases = list_segments(self.directory)
        assert bases == sorted(set(bases)) and (not self.model or bases[0] == 0)
        self.log.check()


LogMachine.TestCase.settings = settings(
    max_examples=50,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLogMachine = LogMachine.TestCase
