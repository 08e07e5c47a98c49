"""``cleanup_policy="consumed"`` (JLog): a closed segment goes once every durable subscriber
has committed past its last offset, and never while one still needs it."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import compactlog
from compactlog.engine.subscriber import lag_report
from compactlog.storage.segment import list_segments

CONSUMED = dict(cleanup_policy="consumed", segment_bytes=1024, sync="os")


def fill(log, count, start=0):
    offsets = []
    for i in range(start, start + count, 10):
        n = min(10, start + count - i)
        offsets.extend(log.append_batch([(b"k%d" % (i + j), b"v" * 30) for j in range(n)]))
    return offsets


def read_offsets(log, start):
    return [r.offset for r in log.read(start)]


def test_with_no_durable_subscriber_nothing_is_deleted_and_the_reason_says_why(log_dir):
    with compactlog.open(log_dir, **CONSUMED) as log:
        fill(log, 300)
        log.subscribe("~transient").poll(max_records=300)  # transient: holds nothing back
        before = list_segments(str(log_dir))
        result = log.enforce_retention()
        assert result.segments_deleted == [] and result.bytes_deleted == 0
        assert "no durable subscriber" in result.reason
        assert list_segments(str(log_dir)) == before


def test_a_segment_goes_only_once_every_durable_subscriber_committed_past_it(log_dir):
    with compactlog.open(log_dir, **CONSUMED) as log:
        fill(log, 300)
        fast, slow = log.subscribe("fast"), log.subscribe("slow")
        bases = list_segments(str(log_dir))
        fast.poll(max_records=300)
        fast.commit()
        assert log.enforce_retention().segments_deleted == []  # "slow" is still at 0
        # "slow" commits into the middle of the third segment
        slow.poll(max_records=bases[2] + 1)
        slow.commit()
        result = log.enforce_retention()
        assert result.segments_deleted == bases[:2]
        assert log.start_offset == bases[2] <= slow.committed
        assert read_offsets(log, slow.committed) == list(range(slow.committed, 300))
        # both at the end: every closed segment goes, the active one stays
        slow.poll(max_records=300)
        slow.commit()
        log.enforce_retention()
        assert list_segments(str(log_dir)) == [bases[-1]]
        assert log.append(b"more", b"x") == 300


def test_a_new_subscriber_holds_segments_before_its_first_commit(log_dir):
    with compactlog.open(log_dir, **CONSUMED) as log:
        fill(log, 300)
        done = log.subscribe("done")
        done.poll(max_records=300)
        done.commit()
        newcomer = log.subscribe("newcomer")  # starts at the log start, checkpoint written
        assert log.enforce_retention().segments_deleted == []
        assert [r.offset for r in newcomer.poll(max_records=300)] == list(range(300))


def test_removing_the_slowest_subscriber_releases_its_segments(log_dir):
    with compactlog.open(log_dir, **CONSUMED) as log:
        fill(log, 300)
        log.subscribe("stuck")
        reader = log.subscribe("reader")
        reader.poll(max_records=300)
        reader.commit()
        report = lag_report(log)
        assert report[0].name == "stuck"
        assert report[0].pending_segments == len(list_segments(str(log_dir))) - 1
        assert log.enforce_retention().segments_deleted == []
        log.remove_subscriber("stuck")
        assert len(log.enforce_retention().segments_deleted) == report[0].pending_segments
        assert len(list_segments(str(log_dir))) == 1


def test_a_restarted_subscriber_after_consumed_retention_resumes_without_a_skip(log_dir):
    with compactlog.open(log_dir, **CONSUMED) as log:
        fill(log, 400)
        sub = log.subscribe("s")
        sub.poll(max_records=250)
        sub.commit()
        sub.poll(max_records=100)  # polled, not committed: must survive retention
        log.enforce_retention()
        assert log.start_offset <= 250
        sub.close()
        again = log.subscribe("s")
        assert again.skipped == []
        assert [r.offset for r in again.poll(max_records=400)] == list(range(250, 400))


OPS = ["append"] * 3 + ["consume"] * 3 + ["poll", "commit", "restart", "retention", "remove"]


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    operations=st.lists(
        st.tuples(st.sampled_from(OPS), st.sampled_from([0, 0, 1, 1, 2]), st.integers(1, 120)),
        max_size=60,
    )
)
def test_property_consumed_retention_never_deletes_what_a_durable_subscriber_needs(
    tmp_path_factory, operations
):
    directory = tmp_path_factory.mktemp("consumed")
    names = ["a", "b", "c"]
    with compactlog.open(directory / "log", **CONSUMED) as log:
        subs = {name: log.subscribe(name) for name in names[:2]}
        appended = 0
        tail = [("consume", who, 10_000) for who in range(3)] + [("retention", 0, 0)]
        for op, who, n in [*operations, *tail]:
            name = names[who]
            if op == "append":
                appended += len(fill(log, n, appended))
            elif op == "retention":
                before = list_segments(str(directory / "log"))
                result = log.enforce_retention()
                if not subs:  # nobody to consume: nothing may go
                    assert result.segments_deleted == []
                    assert list_segments(str(directory / "log")) == before
            elif op == "remove":
                if name in subs:
                    subs.pop(name).close()
                    log.remove_subscriber(name)
            else:
                if name not in subs:
                    subs[name] = log.subscribe(name)  # a newcomer starts at the log start
                    if op == "restart":
                        op = "nothing"
            if op == "poll":
                subs[name].poll(max_records=n)
            elif op == "commit":
                subs[name].commit()
            elif op == "consume":
                subs[name].poll(max_records=n)
                subs[name].commit()
            elif op == "restart":  # uncommitted progress is forgotten
                subs[name].close()
                subs[name] = log.subscribe(name)
            committed = log.subscribers()
            assert set(committed) == set(subs)
            # every record any durable subscriber still needs is on disk, readable
            need = min(committed.values(), default=appended)
            assert log.start_offset <= need
            assert read_offsets(log, need) == list(range(need, appended))
            for sub in subs.values():
                assert sub.skipped == []
        if subs:  # everyone consumed everything: only the active segment is left
            assert len(list_segments(str(directory / "log"))) == 1
        # a fresh run of every subscriber delivers exactly what it had not committed
        for name, sub in subs.items():
            sub.close()
            again = log.subscribe(name)
            start = committed[name]
            assert [r.offset for r in again.poll(max_records=10_000)] == list(
                range(start, appended)
            )
            assert again.skipped == []
        assert not [n for n in os.listdir(directory / "log") if n.endswith(".tmp")]
