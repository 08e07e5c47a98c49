"""The service's parts in-process: the shared I/O budget, rounds with failing logs backing off
while the others go on, the state file protocol, the service lock, metrics and health."""

from __future__ import annotations

import errno
import os
import stat
import threading
import urllib.error
import urllib.request

import pytest
from compactlog.cleaner import passes
from compactlog.cleaner.config import ServiceConfig
from compactlog.cleaner.metrics import HealthServer, Metrics
from compactlog.cleaner.process import AlreadyRunningError, ServiceLock, acquire_all
from compactlog.cleaner.scheduler import Cleaner
from compactlog.cleaner.state import read_state, remove_stray_temps, write_state
from compactlog.cleaner.throttle import SharedThrottle

import compactlog


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.mark.parametrize("rate", [1_000_000, 10_000_000])
def test_the_shared_budget_holds_every_worker_together_to_the_rate(rate):
    fake = FakeTime()
    shared = SharedThrottle(rate, clock=fake.clock, sleep=fake.sleep, burst_seconds=0.0)
    passes_ = [shared.for_pass() for _ in range(3)]
    start = fake.now
    for i in range(3000):
        passes_[i % 3].account(4096)
    total = 3000 * 4096
    assert fake.now - start == pytest.approx(total / rate, rel=0.01)
    assert sum(p.bytes for p in passes_) == total
    assert sum(p.slept for p in passes_) == pytest.approx(total / rate, rel=0.01)
    # compact_log reports slept_here() as the pass's throttled_seconds
    assert [p.slept_here() for p in passes_] == [p.slept for p in passes_]


def test_an_unthrottled_budget_never_sleeps():
    shared = SharedThrottle(0, sleep=lambda s: pytest.fail("slept"))
    view = shared.for_pass()
    view.account(1 << 30)
    assert view.slept == 0


def test_a_throttled_wait_ends_when_the_service_stops():
    stop = threading.Event()
    shared = SharedThrottle(1, stop=stop)  # one byte a second: a 1 MB charge waits days
    stop.set()
    assert shared.for_pass().account(1 << 20) is None  # returns at once


def make_logs(root, names, *, dirty=True):
    for name in names:
        with compactlog.open(root / name, segment_bytes=1024, sync="os") as log:
            for i in range(200 if dirty else 10):
                log.append(b"k%d" % (i % 4), b"v" * 40)


def cleaner_for(tmp_path, **overrides) -> Cleaner:
    config = ServiceConfig(
        roots=(str(tmp_path / "root"),),
        backoff_initial_seconds=60,
        backoff_max_seconds=600,
        **overrides,
    )
    return Cleaner(
        config,
        metrics=Metrics(),
        stop=threading.Event(),
        state_path=str(tmp_path / "state.json"),
    )


def test_a_failing_log_backs_off_while_the_others_are_cleaned(tmp_path, monkeypatch):
    make_logs(tmp_path / "root", ["good", "full"])
    real = passes.compact_log

    def flaky(log, **kwargs):
        if log.directory.endswith("full"):
            raise OSError(errno.ENOSPC, "No space left on device", log.directory)
        return real(log, **kwargs)

    monkeypatch.setattr(passes, "compact_log", flaky)
    cleaner = cleaner_for(tmp_path)
    outcomes = {o.ref.name: o for o in cleaner.round()}
    assert outcomes["good"].status == "cleaned"
    assert outcomes["full"].status == "failed" and "No space left" in outcomes["full"].reason
    status = cleaner.logs[str(tmp_path / "root" / "full")]
    assert status.failures == 1 and status.retry_at > 0
    assert cleaner.round() == []  # backing off: not tried again, the good log is clean
    status.retry_at = 0  # the backoff has run out
    assert [o.status for o in cleaner.round()] == ["failed"]
    assert status.failures == 2  # the wait doubles (60 s, then 120 s)
    document = read_state(str(tmp_path / "state.json"))
    assert document["logs"][status.ref.path]["failures"] == 2
    assert "No space left" in document["logs"][status.ref.path]["last_error"]
    monkeypatch.setattr(passes, "compact_log", real)
    status.retry_at = 0
    assert [o.status for o in cleaner.round()] == ["cleaned"]
    assert status.failures == 0
    cleaner.close()


def test_a_busy_log_is_skipped_not_waited_on(tmp_path):
    make_logs(tmp_path / "root", ["busy"])
    cleaner = cleaner_for(tmp_path)
    with compactlog.open(tmp_path / "root" / "busy") as log, log.cleaner_lock(wait=False):
        (outcome,) = cleaner.round()
    assert outcome.status == "busy"
    assert cleaner.logs[outcome.ref.path].failures == 0  # busy is no failure
    (outcome,) = cleaner.round()
    assert outcome.status == "cleaned"
    cleaner.close()


def test_overrides_apply_to_the_service_passes_and_are_never_stored(tmp_path):
    from compactlog.cleaner.config import Override

    make_logs(tmp_path / "root", ["orders-1", "users"])
    lag = {"min_compaction_lag_ms": 10 * 86_400_000}  # nothing is old enough to clean
    cleaner = cleaner_for(tmp_path, overrides=(Override("users", lag),))
    outcomes = {o.ref.name: o for o in cleaner.round(force=True)}
    assert outcomes["orders-1"].status == "cleaned"
    assert outcomes["users"].status == "skipped"  # the pass ran with the override
    for name in ("orders-1", "users"):
        with compactlog.open(tmp_path / "root" / name, read_only=True) as log:
            assert log.config.min_compaction_lag_ms == 0  # never written into meta
    cleaner.close()


def test_a_log_found_later_with_a_refused_override_is_reported_and_skipped(tmp_path):
    from compactlog.cleaner.config import Override

    make_logs(tmp_path / "root", ["orders", "users"])
    cleaner = cleaner_for(tmp_path, overrides=(Override("users", {"cleanup_policy": "delete"}),))
    outcomes = cleaner.round()
    assert [o.ref.name for o in outcomes] == ["orders"]
    error = cleaner.logs[str(tmp_path / "root" / "users")].last_error
    assert "override[0]" in error and "(match 'users') on log users" in error
    assert "refusing to change cleanup_policy" in error
    with compactlog.open(tmp_path / "root" / "users", read_only=True) as log:
        assert log.config.cleanup_policy == "compact"
    cleaner.close()


def test_the_retention_window_runs_retention_on_deleting_logs(tmp_path):
    root = tmp_path / "root"
    with compactlog.open(root / "events", segment_bytes=1024, cleanup_policy="delete") as log:
        for i in range(100):
            log.append(b"k%d" % i, b"v" * 40, timestamp_ms=1000 + i)  # long expired
    make_logs(root, ["table"])
    cleaner = cleaner_for(tmp_path)
    outcomes = cleaner.round(retention_only=True)
    assert [o.ref.name for o in outcomes] == ["events"]
    assert outcomes[0].stats.retention.segments_deleted
    with compactlog.open(root / "events", read_only=True) as log:
        assert log.start_offset > 0
    cleaner.close()


def test_the_state_file_is_replaced_whole_and_strays_are_removed(tmp_path):
    path = str(tmp_path / "state.json")
    write_state(path, {"version": 1, "pid": 1, "logs": {}})
    (tmp_path / "state.json.999.tmp").write_text("half a docu")  # a service killed mid-write
    assert read_state(path)["pid"] == 1
    assert remove_stray_temps(path) == [str(tmp_path / "state.json.999.tmp")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_a_failed_directory_fsync_of_the_state_file_is_an_error(tmp_path, monkeypatch):
    real_fsync = os.fsync

    def fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EIO, "directory fsync failed")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError, match="directory fsync failed"):
        write_state(str(tmp_path / "state.json"), {"version": 1, "pid": 1, "logs": {}})


def test_a_second_service_lock_names_the_holder(tmp_path):
    first = acquire_all([str(tmp_path / "a.lock"), str(tmp_path / "b.lock")])
    with pytest.raises(AlreadyRunningError, match=r"pid \d+"):
        ServiceLock(str(tmp_path / "b.lock")).acquire()
    for lock in first:
        lock.release()
    again = ServiceLock(str(tmp_path / "b.lock"))
    again.acquire()
    again.release()


def test_health_endpoints_and_metrics(tmp_path):
    metrics = Metrics()
    problem: list[str | None] = [None]
    server = HealthServer(metrics, "127.0.0.1", 0, lambda: problem[0])
    server.start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert urllib.request.urlopen(base + "/healthz", timeout=10).status == 200
        assert urllib.request.urlopen(base + "/readyz", timeout=10).status == 200
        problem[0] = "root /x is not a readable directory"
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(base + "/readyz", timeout=10)
        assert caught.value.code == 503 and b"/x" in caught.value.read()
        body = urllib.request.urlopen(base + "/metrics", timeout=10).read().decode()
        assert "compactlog_cleaner_uptime_seconds" in body
        assert "compactlog_cleaner_rounds_total" in body
    finally:
        server.stop()
    assert server.address == "127.0.0.1"  # binds loopback unless told otherwise


def test_the_schedule_has_an_interval_round_and_the_cron_windows_without_overlap(tmp_path):
    from apscheduler.triggers.cron import CronTrigger
    from apscheduler.triggers.interval import IntervalTrigger
    from compactlog.cleaner.scheduler import build_scheduler

    (tmp_path / "root").mkdir()
    cleaner = cleaner_for(
        tmp_path,
        interval_seconds=5,
        misfire_grace_seconds=7,
        forced_cron="0 3 * * *",
        retention_cron="15 * * * *",
    )
    scheduler = build_scheduler(cleaner, cleaner.config)
    scheduler.start(paused=True)
    try:
        jobs = {job.id: job for job in scheduler.get_jobs()}
        assert set(jobs) == {"clean", "forced", "retention"}
        assert isinstance(jobs["clean"].trigger, IntervalTrigger)
        assert jobs["clean"].trigger.interval.total_seconds() == 5
        assert isinstance(jobs["forced"].trigger, CronTrigger)
        assert jobs["forced"].kwargs == {"force": True}
        assert jobs["retention"].kwargs == {"retention_only": True}
        for job in jobs.values():
            assert job.coalesce is True and job.max_instances == 1
            assert job.misfire_grace_time == 7
        assert scheduler._executors["default"]._pool._max_workers == 1  # rounds never overlap
    finally:
        scheduler.shutdown(wait=False)
        cleaner.close()
