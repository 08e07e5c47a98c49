"""Ranking: which logs a round cleans and in which order, decided from small files and file
sizes only (a property test of the order, unit tests of each reason, a probe that never opens
a segment)."""

from __future__ import annotations

import builtins
import itertools
import os

from compactlog.cleaner.discovery import LogFacts, LogRef, discover, probe
from compactlog.cleaner.ranking import Candidate, judge, rank
from hypothesis import given, settings
from hypothesis import strategies as st

import compactlog
from compactlog.config import LogConfig

NOW = 1_800_000_000_000


def facts(
    name: str,
    *,
    ratio: float = 0.0,
    dirty: int = 0,
    age_ms: int | None = None,
    config: LogConfig | None = None,
    uncleanable: str | None = None,
) -> LogFacts:
    f = LogFacts(LogRef(name, "/logs/" + name), config=config or LogConfig())
    f.segments = 3
    f.dirty_ratio = ratio
    f.dirty_bytes = dirty
    f.total_bytes = dirty * 2 + 100
    f.first_closed_next_base = 10
    f.oldest_dirty_mtime_ms = None if age_ms is None else NOW - age_ms
    f.uncleanable = uncleanable
    return f


log_facts = st.builds(
    lambda i, ratio, dirty, lag, age: facts(
        f"log{i}",
        ratio=ratio,
        dirty=dirty,
        age_ms=age,
        config=LogConfig(min_cleanable_dirty_ratio=0.5, max_compaction_lag_ms=lag),
    ),
    st.integers(0, 10_000),
    st.floats(0, 1, allow_nan=False),
    st.integers(1, 10**9),
    st.one_of(st.none(), st.integers(0, 10**6)),
    st.one_of(st.none(), st.integers(0, 10**7)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(log_facts, max_size=30, unique_by=lambda f: f.ref.path))
def test_the_queue_puts_overdue_logs_first_then_dirtiest_then_largest(items):
    queue = rank(items, NOW)
    order = [c for c in queue]
    due = [f for f in items if judge(f, NOW) is not None]
    assert sorted(c.facts.ref.path for c in order) == sorted(f.ref.path for f in due)
    for before, after in itertools.pairwise(order):
        if before.past_max_lag != after.past_max_lag:
            assert before.past_max_lag  # every overdue log comes before every other
            continue
        a, b = before.facts, after.facts
        assert a.dirty_ratio >= b.dirty_ratio
        if a.dirty_ratio == b.dirty_ratio:
            assert a.dirty_bytes >= b.dirty_bytes
    popped = [queue.pop().facts.ref.path for _ in range(len(queue))]
    assert popped == [c.facts.ref.path for c in order]


def test_a_log_below_the_ratio_is_not_due_unless_past_the_lag():
    config = LogConfig(min_cleanable_dirty_ratio=0.5, max_compaction_lag_ms=60_000)
    assert judge(facts("a", ratio=0.2, dirty=100, config=config), NOW) is None
    overdue = judge(facts("a", ratio=0.2, dirty=100, age_ms=61_000, config=config), NOW)
    assert overdue is not None and overdue.past_max_lag
    assert judge(facts("a", ratio=0.6, dirty=100, config=config), NOW) is not None


def test_an_uncleanable_log_and_one_without_closed_segments_are_never_due():
    assert judge(facts("a", ratio=1.0, dirty=100, uncleanable="corrupt"), NOW) is None
    lone = facts("b", ratio=1.0, dirty=100)
    lone.first_closed_next_base = None
    assert judge(lone, NOW) is None


def test_retention_makes_a_delete_log_due():
    config = LogConfig(cleanup_policy="delete", retention_bytes=100)
    f = facts("d", config=config)
    f.total_bytes, f.first_closed_size = 500, 200
    candidate = judge(f, NOW)
    assert isinstance(candidate, Candidate) and "retention" in candidate.reasons
    f.total_bytes = 250
    assert judge(f, NOW) is None


def test_expired_tombstones_make_a_log_due():
    f = facts("t")
    f.tombstones_due = True
    candidate = judge(f, NOW)
    assert candidate is not None and "tombstones due to expire" in candidate.reasons


def test_probe_matches_the_cleaner_and_never_opens_a_segment(tmp_path, monkeypatch):
    path = tmp_path / "root" / "orders"
    with compactlog.open(path, segment_bytes=1024, sync="os") as log:
        for i in range(300):
            log.append(b"k%d" % (i % 5), b"x" * 30)
        log.flush()
        sub = log.subscribe("billing")
        sub.poll(max_records=100)
        sub.commit()
    opened: list[str] = []
    real_open, real_os_open = builtins.open, os.open

    def spy_open(file, *args, **kwargs):
        opened.append(os.fspath(file))
        return real_open(file, *args, **kwargs)

    def spy_os_open(file, *args, **kwargs):
        opened.append(os.fspath(file))
        return real_os_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy_open)
    monkeypatch.setattr(os, "open", spy_os_open)
    (ref,) = discover((str(tmp_path / "root"),), ())
    found = probe(ref, NOW)
    monkeypatch.undo()
    assert not [p for p in opened if p.endswith((".log", ".idx"))], opened
    assert found.error is None and ref.name == "orders"
    assert found.end_offset == 300 and found.subscriber_lag == {"billing": 200}
    assert found.dirty_ratio == 1.0 and found.segments > 2
    with compactlog.open(path) as log:
        stats = log.compact()
    assert stats.dirty_bytes == found.dirty_bytes  # the cleaner's own selection agrees
    after = probe(ref, NOW)
    assert after.dirty_ratio == 0.0 and judge(after, NOW) is None


def test_discovery_finds_logs_skips_other_directories_and_names_duplicates_by_path(tmp_path):
    for root in ("r1", "r2"):
        with compactlog.open(tmp_path / root / "same"):
            pass
    (tmp_path / "r1" / "not-a-log").mkdir()
    (tmp_path / "r1" / "file.txt").write_text("x")
    with compactlog.open(tmp_path / "alone"):
        pass
    refs = discover((str(tmp_path / "r1"), str(tmp_path / "r2")), (str(tmp_path / "alone"),))
    names = {r.name for r in refs}
    assert names == {"alone", str(tmp_path / "r1" / "same"), str(tmp_path / "r2" / "same")}
    assert discover((str(tmp_path / "missing"),), ()) == []


def test_probe_reports_an_unreadable_meta_instead_of_raising(tmp_path):
    path = tmp_path / "broken"
    with compactlog.open(path):
        pass
    (path / "meta").write_text("{not json")
    found = probe(LogRef("broken", str(path)), NOW)
    assert found.error is not None and "JSON" in found.error
    assert judge(found, NOW) is None


def test_discovery_finds_the_logs_of_a_partitioned_directory_and_skips_snapshots(tmp_path):
    root = tmp_path / "root"
    for partition in range(3):  # one log per partition, as a Kafka topic has partitions
        with compactlog.open(root / "orders" / str(partition)) as log:
            log.append(b"k", b"v")
    with compactlog.open(root / "users") as log:
        log.append(b"k", b"v")
        log.snapshot(str(root / "users-snapshot"))  # a frozen copy: never cleaned
        log.snapshot(str(root / "orders" / "snap"))
    refs = discover((str(root),), ())
    assert sorted(r.name for r in refs) == ["orders/0", "orders/1", "orders/2", "users"]
    assert all(not os.path.exists(os.path.join(r.path, "snapshot.json")) for r in refs)
