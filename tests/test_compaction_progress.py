"""Compaction progress events, a throttle shared between threads, and partial passes that
read only about what their map covers (issue 8, parts 3 and 4)."""

from __future__ import annotations

import itertools
import threading

import pytest

import compactlog
from compactlog.compaction import CompactionProgress, Throttler, compact_log, progress

from .compaction_helpers import Model, check_log
from .helpers import FakeClock


def _log(path, **config):
    defaults = dict(segment_bytes=2048, sync="os", segment_ms=None, retention_ms=None)
    defaults.update(config)
    return compactlog.open(path, clock=FakeClock(1_700_000_000_000), **defaults)


def _fill(log, model, records, keys, batch=10, value=b"v" * 64):
    for start in range(0, records, batch):
        model.append_batch(
            log, [(b"key-%06d" % (i % keys), value) for i in range(start, start + batch)]
        )
    log.flush()


# -- progress ------------------------------------------------------------------------------------


def test_progress_reports_each_phase_from_zero_to_its_plan(tmp_path, monkeypatch):
    monkeypatch.setattr(progress, "PROGRESS_EVERY_BYTES", 4096)
    model = Model()
    events: list[CompactionProgress] = []
    with _log(tmp_path / "log", segment_bytes=16384) as log:
        _fill(log, model, records=3000, keys=400)
        stats = log.compact(force=True, progress=events.append)
        check_log(log, model)
    phases = [e.phase for e in events]
    order = [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p]
    assert order in (["map", "rewrite"], ["map", "verify", "rewrite"])
    for phase in order:
        mine = [e for e in events if e.phase == phase]
        assert mine[0].bytes_done == 0 and mine[0].bytes_planned > 0
        assert mine[-1].bytes_done == mine[-1].bytes_planned  # the last event closes it
        done = [e.bytes_done for e in mine]
        assert done == sorted(done)
        assert all(e.bytes_done <= e.bytes_planned for e in mine)
        # between two events at most the reporting interval plus one batch (< 1 KiB here)
        assert max(b - a for a, b in itertools.pairwise(done)) <= 4096 + 1024
        assert len(mine) > 3, "a multi-interval phase reports on the way"
    assert [e for e in events if e.phase == "map"][-1].bytes_done == stats.map_bytes_read
    assert [e for e in events if e.phase == "rewrite"][-1].bytes_done == stats.bytes_read
    assert events[-1].fraction == 1.0


def test_a_map_smaller_than_the_keys_plans_and_reads_the_range_once(tmp_path, monkeypatch):
    """The map phase plans the segments to clean and reads them once, however many spill
    partitions their keys need (a progress bar runs once to 100%)."""
    monkeypatch.setattr(progress, "PROGRESS_EVERY_BYTES", 1024)
    model = Model()
    events: list[CompactionProgress] = []
    with _log(tmp_path / "log", cleaner_buffer_bytes=4096) as log:
        _fill(log, model, records=2000, keys=1000)
        stats = compact_log(log, force=True, progress=events.append)
        check_log(log, model)
    assert not stats.map_full and stats.partitions > 1
    mapped = [e for e in events if e.phase == "map"]
    assert mapped[0].bytes_planned == stats.clean_bytes + stats.dirty_bytes
    assert mapped[-1].bytes_done == mapped[-1].bytes_planned == stats.map_bytes_read


def test_an_exception_from_the_progress_callback_stops_the_pass_cleanly(tmp_path):
    model = Model()

    def fail_in_rewrite(event: CompactionProgress) -> None:
        if event.phase == "rewrite" and event.bytes_done > 0:
            raise KeyboardInterrupt

    with _log(tmp_path / "log") as log:
        _fill(log, model, records=600, keys=50)
        with pytest.raises(KeyboardInterrupt):
            log.compact(force=True, progress=fail_in_rewrite)
        assert not any(p.name.endswith(".rw") for p in (tmp_path / "log").iterdir())
        check_log(log, model)
        assert log.compact(force=True).cleaned
        check_log(log, model)


def test_the_progress_event_is_a_small_frozen_value():
    event = CompactionProgress("rewrite", 5, 10)
    assert event.fraction == 0.5
    assert event.to_dict() == {"phase": "rewrite", "bytes_done": 5, "bytes_planned": 10}
    assert CompactionProgress("map", 0, 0).fraction == 1.0
    with pytest.raises(AttributeError):
        event.bytes_done = 6  # type: ignore[misc]


# -- a throttle shared by several workers ---------------------------------------------------


def test_one_throttler_shared_by_threads_caps_their_sum():
    """Four workers account 100 KB each against one 1 MB/s cap: no byte is lost to a race,
    and the (fake) time that passes covers the sum at the cap."""
    now = [0.0]
    lock = threading.Lock()

    def clock() -> float:
        with lock:
            return now[0]

    def sleep(seconds: float) -> None:
        with lock:
            now[0] += seconds

    throttle = Throttler(1_000_000, clock=clock, sleep=sleep)
    own: list[float] = []

    def worker() -> None:
        for _ in range(1000):
            throttle.account(100)
        own.append(throttle.slept_here())

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert throttle.bytes == 400_000
    assert now[0] >= 0.4 - 0.001  # 400 KB at 1 MB/s
    assert sum(own) == pytest.approx(throttle.slept)
    assert throttle.slept_here() == 0.0  # this thread never waited


def test_a_pass_reports_only_its_own_throttled_time(tmp_path):
    throttle = Throttler(10**12)  # a cap that never bites: nothing slept
    with _log(tmp_path / "log") as log:
        _fill(log, Model(), records=300, keys=30)
        stats = compact_log(log, force=True, throttler=throttle)
    assert stats.throttled_seconds == 0.0
