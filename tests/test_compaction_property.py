"""Hypothesis: random appends, compactions under a controlled clock and reopens against a
model of exactly which records a pass keeps.

The model mirrors the contract, not the code: with an offset map large enough for the whole
head, after cleaned passes with cleaner point ``E`` (the last pass's), a record at offset
``o`` of key ``k`` is present iff ``o >= E``, or no later record of ``k`` lies below ``E``
and it is not a tombstone whose ``delete_retention_ms`` ran out: a tombstone expires at the
first cleaned pass at a time ``>= first_seen + delete_retention_ms`` that is not the pass
that first passed it (``first_seen`` = time of the first cleaned pass whose cleaner point
moved past it).
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import compactlog
from compactlog.engine.invariants import check

from .compaction_helpers import Model, check_log
from .helpers import FakeClock

RETENTION = 1_000

ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("append"),
            st.lists(
                st.tuples(
                    st.integers(0, 12), st.one_of(st.none(), st.binary(min_size=0, max_size=60))
                ),
                min_size=1,
                max_size=40,
            ),
        ),
        st.tuples(
            st.just("singles"),  # single appends: small batches the cleaner merges
            st.lists(
                st.tuples(
                    st.integers(0, 12), st.one_of(st.none(), st.binary(min_size=0, max_size=60))
                ),
                min_size=1,
                max_size=20,
            ),
        ),
        st.tuples(st.just("fill"), st.integers(0, 12)),
        st.tuples(st.just("fill"), st.integers(0, 12)),
        st.tuples(st.just("advance"), st.integers(0, 1_500)),
        st.tuples(st.just("compact"), st.booleans()),
        st.tuples(st.just("compact"), st.booleans()),
        st.tuples(st.just("reopen"), st.none()),
    ),
    min_size=6,
    max_size=40,
)


class Expected:
    def __init__(self) -> None:
        self.point = 0  # cleaner point after the last cleaned pass
        self.first_seen: dict[int, int] = {}  # tombstone offset -> first pass time
        self.expired: set[int] = set()

    def after_pass(self, model: Model, point: int, now: int) -> None:
        for offset, (_key, value) in model.written.items():
            if (
                value is None
                and offset < self.point
                and offset in self.first_seen
                and now >= self.first_seen[offset] + RETENTION
            ):
                self.expired.add(offset)
        for offset, (_key, value) in model.written.items():
            if value is None and offset < point and offset not in self.first_seen:
                self.first_seen[offset] = now
        self.point = point

    def present(self, model: Model) -> list[int]:
        later_below: dict[bytes, int] = {}
        for offset in sorted(model.written):
            if offset < self.point:
                later_below[model.written[offset][0]] = offset
        keep = []
        for offset in sorted(model.written):
            key = model.written[offset][0]
            if offset >= self.point or (later_below[key] == offset and offset not in self.expired):
                keep.append(offset)
        return keep


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(steps=ops)
@example(  # a tombstone passed, then expired by a pass delete_retention_ms later
    steps=[
        ("append", [(1, None), (2, b"x")]),
        ("fill", 0),
        ("fill", 3),
        ("compact", True),
        ("advance", 999),
        ("compact", True),
        ("reopen", None),
        ("advance", 1),
        ("fill", 5),
        ("compact", False),
        ("compact", True),
    ]
)
def test_random_histories_match_the_model(tmp_path_factory, steps):
    path = tmp_path_factory.mktemp("prop") / "log"
    clock = FakeClock(1_000_000)
    config = dict(
        segment_bytes=1024,
        max_record_bytes=1024,
        sync="os",
        segment_ms=None,
        retention_ms=None,
        delete_retention_ms=RETENTION,
        min_cleanable_dirty_ratio=0.3,
        cleaner_merge_batch_bytes=400,
    )
    log = compactlog.open(path, clock=clock, **config)
    model = Model()
    expected = Expected()
    try:
        for op, arg in steps:
            if op == "append":
                pairs = [(b"key%d" % k, v) for k, v in arg]
                model.append_batch(log, pairs)
                log.flush()
            elif op == "singles":
                for k, v in arg:
                    model.append(log, b"key%d" % k, v)
                log.flush()
            elif op == "fill":  # enough bytes to roll a segment or two
                pairs = [(b"key%d" % ((arg + i) % 13), b"f%d" % i * 12) for i in range(40)]
                model.append_batch(log, pairs[:20])
                model.append_batch(log, pairs[20:])
                log.flush()
            elif op == "advance":
                clock.advance(arg)
            elif op == "compact":
                stats = log.compact(force=arg)
                if stats.cleaned:
                    assert not stats.map_full
                    expected.after_pass(model, stats.new_first_dirty_offset, clock())
                    event("cleaned pass")
                    if expected.expired:
                        event("a tombstone expired")
            else:
                log.close()
                log = compactlog.open(path, clock=clock)
            records = check_log(log, model)
            log.check()

            assert [r.offset for r in records] == expected.present(model)
    finally:
        log.close()
    check(path, deep=True)
