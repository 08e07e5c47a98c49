"""Subscribers: names, start positions, polling, commits, seeking, lag, waiting, skipping."""

from __future__ import annotations

import logging
import os
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import compactlog
from compactlog import SubscriberError
from compactlog.encoding.batch_decode import RecordBatch
from compactlog.encoding.format import SEGMENT_FILE_HEADER
from compactlog.engine.subscriber import (
    SkipEvent,
    Subscriber,
    backlog,
    lag_report,
    validate_name,
)
from compactlog.errors import LogClosedError
from compactlog.storage import filenames
from compactlog.storage.fsio import FileSystem
from compactlog.storage.segment import list_segments, segment_path, write_index
from compactlog.storage.state_files import list_checkpoints, write_checkpoint
from compactlog.storage.swap import replace_segments

from .helpers import encode_record_batch

SMALL = dict(segment_bytes=1024, sync="os")


def fill(log, count, *, per_batch=10, prefix=b"k"):
    """Append ``count`` records in batches; returns their offsets."""
    offsets = []
    while len(offsets) < count:
        n = min(per_batch, count - len(offsets))
        first = len(offsets)
        pairs = [(prefix + b"%d" % (first + i), b"v%d" % (first + i)) for i in range(n)]
        offsets.extend(log.append_batch(pairs))
    return offsets


def drain(sub, **kwargs):
    """Offsets of every record the subscriber polls until none is left."""
    seen = []
    while True:
        records = sub.poll(**kwargs)
        if not records:
            return seen
        seen.extend(r.offset for r in records)


# -- names ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["", b"bytes", 7, None, "\ud800", "x" * 256, "é" * 128, "~" + "x" * 255],
    ids=["empty", "bytes", "int", "none", "surrogate", "256-ascii", "256-utf8", "long-transient"],
)
def test_invalid_subscriber_names_are_refused_with_a_clear_error(log_dir, name):
    with compactlog.open(log_dir) as log:
        with pytest.raises(SubscriberError, match="subscriber name"):
            log.subscribe(name)
        assert log.subscribers() == {}


@pytest.mark.parametrize("name", ["a", "x" * 255, "é" * 127, "名前", "with space/and:colon", "~t"])
def test_any_non_empty_utf8_name_up_to_255_bytes_is_accepted(log_dir, name):
    assert validate_name(name) == name
    with compactlog.open(log_dir) as log:
        fill(log, 5)
        sub = log.subscribe(name)
        assert [r.offset for r in sub.poll()] == ([] if name.startswith("~") else [0, 1, 2, 3, 4])


def test_a_name_too_long_for_a_hex_file_name_gets_a_hashed_checkpoint_that_round_trips(log_dir):
    name = "ü" * 127  # 254 bytes of UTF-8: "cp." + 508 hex digits would be too long
    with compactlog.open(log_dir) as log:
        fill(log, 20)
        sub = log.subscribe(name)
        sub.poll(max_records=7)
        sub.commit()
        assert filenames.checkpoint_name(name).startswith("cp.h.")
        assert os.path.exists(log_dir / filenames.checkpoint_name(name))
        assert log.subscribers() == {name: 7}
        sub.close()  # one consumer per name: the next one may start only now
        assert log.subscribe(name).position == 7
        log.remove_subscriber(name, force=True)  # the one just made is still open
        assert log.subscribers() == {}


# -- where a subscriber starts -------------------------------------------------------------


def test_a_new_durable_subscriber_starts_at_the_log_start_and_is_listed_at_once(log_dir):
    with compactlog.open(log_dir) as log:
        fill(log, 30)
        sub = log.subscribe("reader")
        assert sub.position == 0 and sub.committed == 0 and sub.durable
        assert log.subscribers() == {"reader": 0}  # holds consumed retention from now on
        assert drain(sub) == list(range(30))


def test_a_transient_subscriber_starts_at_the_end_and_keeps_no_checkpoint(log_dir):
    with compactlog.open(log_dir) as log:
        fill(log, 30)
        sub = log.subscribe("~live")
        assert sub.position == 30 and sub.committed is None and not sub.durable
        assert sub.poll() == []
        fill(log, 3, prefix=b"new")
        assert [r.key for r in sub.poll()] == [b"new0", b"new1", b"new2"]
        sub.commit()  # a no-op
        assert log.subscribers() == {}
        assert not [n for n in os.listdir(log_dir) if n.startswith("cp.")]
        with pytest.raises(SubscriberError, match="transient"):
            log.remove_subscriber("~live")


def test_start_places_a_new_subscriber_but_an_existing_checkpoint_wins(log_dir):
    with compactlog.open(log_dir) as log:
        fill(log, 30)
        sub = log.subscribe("s", start=12)
        assert sub.position == 12 and log.subscribers() == {"s": 12}
        assert sub.poll(max_records=3)[0].offset == 12
        sub.commit()
        sub.close()
        again = log.subscribe("s", start=0)
        assert again.position == 15  # resumes where it committed; use seek() to move it
        assert log.subscribe("~t", start=5).position == 5


def test_start_beyond_the_end_or_not_an_offset_is_refused(log_dir):
    with compactlog.open(log_dir) as log:
        fill(log, 10)
        with pytest.raises(SubscriberError, match="beyond the end"):
            log.subscribe("s", start=11)
        for bad in (-1, 1.5, "3", True):
            with pytest.raises(SubscriberError, match="start must be"):
                log.subscribe("s", start=bad)
        assert log.subscribers() == {}
        assert log.subscribe("s", start=10).poll() == []


# -- polling -----------------------------------------------------------------------------


def test_poll_returns_records_in_offset_order_across_segments(log_dir):
    with compactlog.open(log_dir, **SMALL) as log:
        fill(log, 500, per_batch=7)
        assert len(list_segments(str(log_dir))) > 5
        sub = log.subscribe("s")
        seen = []
        while records := sub.poll(max_records=33):
            assert len(records) <= 33
            seen.extend(records)
        assert [r.offset for r in seen] == list(range(500))
        assert [r.key for r in seen] == [b"k%d" % i for i in range(500)]
        assert [r.value for r in seen] == [b"v%d" % i for i in range(500)]
        assert sub.position == 500 and sub.lag == 0


def test_poll_keeps_timestamps_headers_and_tombstones(log_dir, clock):
    with compactlog.open(log_dir, clock=clock) as log:
        log.append(b"a", b"1", headers={"h": b"x"})
        log.append(b"a", None, timestamp_ms=123)
        records = log.subscribe("s").poll()
        assert records[0].headers == {"h": b"x"} and records[0].timestamp == clock.now
        assert records[1].is_tombstone and records[1].timestamp == 123


def test_poll_max_bytes_returns_whole_batches_and_at_least_one_record(log_dir):
    with compactlog.open(log_dir) as log:
        for _ in range(10):
            log.append_batch([(b"k", b"x" * 100)] * 10)  # ten batches of ~1 KiB
        sub = log.subscribe("s")
        first = sub.poll_batches(max_bytes=1)
        assert [len(b) for b in first] == [10]
        batches = sub.poll_batches(max_bytes=2500)
        assert len(batches) == 3  # stops once the limit is reached
        assert sub.position == 40


def test_poll_batches_is_columnar_and_cut_at_the_position_and_limit(log_dir):
    with compactlog.open(log_dir) as log:
        for _ in range(3):
            log.append_batch([(b"k%d" % i, b"v") for i in range(10)])
        sub = log.subscribe("s", start=4)
        batches = sub.poll_batches(max_records=12)
        assert all(isinstance(b, RecordBatch) for b in batches)
        assert [b.offsets.tolist() for b in batches] == [list(range(4, 10)), list(range(10, 16))]
        assert isinstance(batches[0].offsets, np.ndarray)
        assert sub.position == 16
        assert [b.offsets.tolist() for b in sub.poll_batches()] == [
            list(range(16, 20)),
            list(range(20, 30)),
        ]


def test_poll_does_not_see_precommit_records_until_flush(log_dir):
    with compactlog.open(log_dir, precommit_bytes=1 << 16, sync_interval_ms=3_600_000) as log:
        sub = log.subscribe("~t")
        log.append(b"a", b"1")
        assert sub.poll() == []  # JLog: readers do not see the precommit buffer
        log.flush()
        assert [r.key for r in sub.poll()] == [b"a"]


def test_arguments_are_checked(log_dir):
    with compactlog.open(log_dir) as log:
        sub = log.subscribe("s")
        for kwargs in (
            {"max_records": 0},
            {"max_records": 1.0},
            {"max_bytes": 0},
            {"timeout_s": -1},
            {"timeout_s": "1"},
        ):
            with pytest.raises(SubscriberError):
                sub.poll(**kwargs)


# -- committing ----------------------------------------------------------------------------


def test_commit_persists_and_a_restart_redelivers_only_what_was_not_committed(log_dir):
    with compactlog.open(log_dir, **SMALL) as log:
        fill(log, 100)
        sub = log.subscribe("s")
        assert len(sub.poll(max_records=40)) == 40
        sub.commit()
        assert sub.committed == 40 and log.subscribers() == {"s": 40}
        assert len(sub.poll(max_records=25)) == 25  # polled, never committed
        sub.close()  # "crash"
    with compactlog.open(log_dir, read_only=True) as log:  # another process, read-only
        again = log.subscribe("s")
        assert again.position == 40
        assert drain(again) == list(range(40, 100))
        again.commit()
        assert list_checkpoints(str(log_dir)) == {"s": 100}


def test_commit_of_an_explicit_offset_must_not_pass_the_position(log_dir):
    with compactlog.open(log_dir) as log:
        fill(log, 10)
        sub = log.subscribe("s")
        sub.poll(max_records=6)
        sub.commit(3)
        assert log.subscribers() == {"s": 3}
        with pytest.raises(SubscriberError, match="beyond the position"):
            sub.commit(7)


class StopAt(FileSystem):
    """Dies (raises) at the ``step``-th call of the checkpoint protocol."""

    class Died(Exception):
        pass

    def __init__(self, step: str) -> None:
        self.step = step

    def _maybe(self, step):
        if step == self.step:
            raise self.Died(step)

    def write(self, fd, data):
        self._maybe("write")
        if self.step == "torn-write":
            super().write(fd, data[: len(data) // 2])
            raise self.Died("torn-write")
        super().write(fd, data)

    def fsync(self, fd):
        self._maybe("fsync")
        super().fsync(fd)

    def rename(self, source, target):
        self._maybe("rename")
        super().rename(source, target)

    def fsync_dir(self, directory):
        self._maybe("fsync_dir")
        super().fsync_dir(directory)


@pytest.mark.parametrize("step", ["write", "torn-write", "fsync", "rename", "fsync_dir"])
def test_a_death_at_any_step_of_commit_leaves_the_old_or_the_new_checkpoint(log_dir, step):
    with compactlog.open(log_dir) as log:
        fill(log, 20)
        sub = log.subscribe("s")
        sub.poll(max_records=5)
        sub.commit()
        sub.poll(max_records=5)
        log.fs = StopAt(step)
        with pytest.raises(StopAt.Died):
            sub.commit()
        log.fs = FileSystem()
        committed = list_checkpoints(str(log_dir))["s"]
        assert committed == (10 if step == "fsync_dir" else 5)
        sub.close()
        assert log.subscribe("s").position == committed
    # The death was simulated in this (live) process, so its temporary file names a live pid:
    # an open leaves it (it could be a commit in progress in another thread) ...
    strays = [n for n in os.listdir(log_dir) if n.endswith(".tmp")]
    with compactlog.open(log_dir) as log:
        assert sorted(n for n in os.listdir(log_dir) if n.endswith(".tmp")) == sorted(strays)
    # ... and once its process is gone, the next read-write open removes it.
    dead_pid = 2**22 + 1  # above the default pid_max: never a live process
    for name in strays:
        stem, _pid, counter, suffix = name.rsplit(".", 3)
        os.rename(log_dir / name, log_dir / f"{stem}.{dead_pid}.{counter}.{suffix}")
    with compactlog.open(log_dir) as log:
        assert not [n for n in os.listdir(log_dir) if n.endswith(".tmp")]
        assert log.subscribers() == {"s": committed}


class RemoveTempOnce(FileSystem):
    """Another process opening the log removes our ``.tmp`` right before the rename."""

    removed = 0

    def rename(self, source, target):
        if not self.removed and source.endswith(".tmp"):
            self.removed += 1
            os.remove(source)
        super().rename(source, target)


def test_commit_retries_when_a_concurrent_open_removed_its_temporary_file(log_dir):
    with compactlog.open(log_dir) as log:
        fill(log, 5)
        sub = log.subscribe("s")
        sub.poll()
        log.fs = RemoveTempOnce()
        sub.commit()
        assert log.fs.removed == 1 and log.subscribers() == {"s": 5}


# -- seeking, lag, removal -----------------------------------------------------------------


def test_seek_moves_the_position_without_committing(log_dir):
    with compactlog.open(log_dir, **SMALL) as log:
        fill(log, 200)
        sub = log.subscribe("s")
        sub.seek(150)
        assert sub.poll(max_records=1)[0].offset == 150
        sub.seek(3)
        assert sub.poll(max_records=2)[0].offset == 3
        assert log.subscribers() == {"s": 0}
        with pytest.raises(SubscriberError, match="beyond the end"):
            sub.seek(201)
        sub.seek(200)
        assert sub.poll() == [] and sub.lag == 0


def test_lag_in_records_bytes_and_segments(log_dir):
    with compactlog.open(log_dir, **SMALL) as log:
        fill(log, 300)
        segments = list_segments(str(log_dir))
        total = sum(os.path.getsize(segment_path(str(log_dir), b)) for b in segments)
        data = total - len(SEGMENT_FILE_HEADER) * len(segments)
        sub = log.subscribe("s")
        assert sub.lag == 300
        assert sub.lag_segments == len(segments)
        assert sub.lag_bytes == data
        drain(sub, max_records=40)
        assert (sub.lag, sub.lag_bytes, sub.lag_segments) == (0, 0, 0)
        sub.seek(segments[-2])  # the last closed segment and the active one are unread
        assert sub.lag == 300 - segments[-2]
        assert sub.lag_segments == 2
        assert backlog(log, segments[-2]) == (sub.lag_bytes, 2)


def test_lag_report_shows_every_durable_subscriber_slowest_first(log_dir):
    with compactlog.open(log_dir, cleanup_policy="consumed", **SMALL) as log:
        fill(log, 300)
        fast, slow = log.subscribe("fast"), log.subscribe("slow")
        log.subscribe("~transient")
        drain(fast)
        fast.commit()
        slow.poll(max_records=10)
        slow.commit()
        report = lag_report(log)
        assert [r.name for r in report] == ["slow", "fast"]
        assert report[0].committed == 10 and report[0].lag_records == 290
        assert report[0].pending_segments == len(list_segments(str(log_dir))) - 1
        assert report[0].lag_bytes > 0 and report[0].lag_segments > 1
        assert report[1].lag_records == 0 and report[1].pending_segments == 0
        assert not any(r.below_log_start for r in report)


def test_remove_subscriber_forgets_it_and_unknown_names_are_an_error(log_dir):
    with compactlog.open(log_dir) as log:
        log.subscribe("a")
        log.subscribe("b")
        log.remove_subscriber("a")
        assert log.subscribers() == {"b": 0}
        with pytest.raises(SubscriberError, match="no durable subscriber"):
            log.remove_subscriber("a")
        with pytest.raises(SubscriberError, match="subscriber name"):
            log.remove_subscriber("")
        assert log.subscribe("a").position == 0  # a new one, from the log start


def test_a_closed_subscriber_or_log_refuses_to_poll(log_dir):
    log = compactlog.open(log_dir)
    sub = log.subscribe("s")
    other = log.subscribe("t")
    sub.close()
    with pytest.raises(LogClosedError):
        sub.poll()
    log.close()
    with pytest.raises(LogClosedError):
        other.poll()
    with pytest.raises(LogClosedError):
        other.commit()


# -- waiting -------------------------------------------------------------------------------


def test_poll_with_a_timeout_returns_nothing_once_the_timeout_passes(log_dir):
    with compactlog.open(log_dir) as log:
        sub = log.subscribe("s")
        started = time.monotonic()
        assert sub.poll(timeout_s=0.05) == []
        assert 0.05 <= time.monotonic() - started < 1.0


@pytest.mark.parametrize("inotify", [True, False], ids=["inotify", "sleep-polling"])
def test_poll_with_a_timeout_wakes_up_when_another_thread_appends(log_dir, inotify):
    with compactlog.open(log_dir) as log:
        sub = log.subscribe("~t")
        sub._watcher().reliable = inotify
        timer = threading.Timer(0.05, lambda: (log.append(b"k", b"v"), log.flush()))
        started = time.monotonic()
        timer.start()
        records = sub.poll(timeout_s=5)
        elapsed = time.monotonic() - started
        timer.join()
        assert [r.key for r in records] == [b"k"]
        assert elapsed < 2.0


@pytest.mark.parametrize("inotify", [True, False], ids=["inotify", "sleep-polling"])
def test_waiting_does_not_busy_spin(log_dir, inotify):
    with compactlog.open(log_dir) as log:
        sub = log.subscribe("~t")
        sub._watcher().reliable = inotify
        cpu = time.process_time()
        assert sub.poll(timeout_s=0.3) == []
        assert time.process_time() - cpu < 0.1  # mostly asleep (a spin would use ~0.3 s)


def test_a_subscriber_in_another_thread_sees_every_record_once_in_order(log_dir):
    with compactlog.open(log_dir, **SMALL) as log:
        sub = log.subscribe("~t")
        total = 2000
        seen: list[int] = []

        def consume():
            while len(seen) < total:
                seen.extend(r.offset for r in sub.poll(max_records=97, timeout_s=5))

        thread = threading.Thread(target=consume)
        thread.start()
        fill(log, total, per_batch=13)
        thread.join(30)
        assert seen == list(range(total))


# -- falling behind the log start ------------------------------------------------------------


def test_a_checkpoint_below_the_log_start_resumes_at_the_log_start_and_is_reported(
    log_dir, clock, caplog
):
    config = dict(cleanup_policy="delete", retention_bytes=2048, **SMALL)
    with compactlog.open(log_dir, clock=clock, **config) as log:
        fill(log, 300)
        log.subscribe("late")  # committed at 0
        result = log.enforce_retention()
        start = log.start_offset
        assert result.segments_deleted and start > 0
        with caplog.at_level(logging.WARNING, logger="compactlog.subscriber"):
            sub = log.subscribe("late")
        assert sub.position == start
        assert sub.skipped == [SkipEvent("late", 0, start, clock.now)]
        assert sub.skipped[0].offsets_skipped == start
        assert "below the log start" in caplog.text and "'late'" in caplog.text
        assert drain(sub) == list(range(start, 300))
        assert [r.below_log_start for r in lag_report(log)] == [True]


def test_a_subscriber_that_has_not_read_yet_follows_the_log_start_silently(log_dir):
    config = dict(cleanup_policy="delete", retention_bytes=2048, **SMALL)
    with compactlog.open(log_dir, **config) as log:
        fill(log, 300)
        fresh = log.subscribe("fresh")  # "from the log start": whatever that is when it reads
        placed = log.subscribe("~placed", start=3)
        log.enforce_retention()
        start = log.start_offset
        assert drain(fresh) == drain(placed) == list(range(start, 300))
        assert fresh.skipped == placed.skipped == []


def test_retention_overtaking_a_reading_subscriber_is_reported_not_stalled(log_dir, caplog):
    config = dict(cleanup_policy="delete", retention_bytes=2048, **SMALL)
    with compactlog.open(log_dir, **config) as log:
        fill(log, 300)
        sub = log.subscribe("~reader", start=0)
        first = [r.offset for r in sub.poll(max_records=5)]
        log.enforce_retention()
        start = log.start_offset
        with caplog.at_level(logging.WARNING, logger="compactlog.subscriber"):
            rest = drain(sub, max_records=50)
        seen = first + rest
        # the segment it was reading stays readable through its descriptor; then it jumps
        assert seen == sorted(set(seen))
        assert seen[-(300 - start) :] == list(range(start, 300))
        assert len(sub.skipped) == 1 and sub.skipped[0].to_offset == start
        assert set(range(sub.skipped[0].from_offset, start)).isdisjoint(seen)


def test_repair_fixes_a_checkpoint_below_the_log_start(log_dir):
    with compactlog.open(log_dir, cleanup_policy="delete", retention_bytes=2048, **SMALL) as log:
        fill(log, 300)
        log.subscribe("late")
        log.enforce_retention()
        start = log.start_offset
    report = compactlog.repair(log_dir)
    assert any("late" in fix for fix in report.fixes)
    with compactlog.open(log_dir) as log:
        assert log.subscribers() == {"late": start}
        assert log.subscribe("late").skipped == []


# -- offsets survive rewrites ----------------------------------------------------------------


def rewrite_closed_segments(directory, keep):
    """What the cleaner does: merge all closed segments into the first, keeping the records
    for which ``keep(offset)`` holds, with their offsets, then swap the files in."""
    bases = list_segments(directory)
    closed = bases[:-1]
    batches = []
    with compactlog.open(directory, read_only=True) as log:
        for batch in log.read_batches(closed[0], bases[-1]):
            mask = np.array([keep(int(o)) for o in batch.offsets], dtype=bool)
            kept = batch.select(mask)
            if len(kept):
                last = int(batch.offsets[-1]) - int(kept.offsets[0])
                batches.append(encode_record_batch(kept, int(kept.offsets[0]), last, 0, 0))
    first = closed[0]
    with open(segment_path(directory, first) + ".rw", "wb") as handle:
        handle.write(SEGMENT_FILE_HEADER + b"".join(batches))
    write_index(FileSystem(), directory, first, [], temp=True)
    replace_segments(FileSystem(), directory, first, closed[1:])


def test_a_subscriber_keeps_its_position_when_the_segments_it_reads_are_rewritten(log_dir):
    with compactlog.open(log_dir, **SMALL) as log:
        fill(log, 400)
        end = log.end_offset
        sub = log.subscribe("s")
        head = [r.offset for r in sub.poll(max_records=30)]  # the cursor is on segment 0
        stale = log.subscribe("t", start=250)
        rewrite_closed_segments(str(log_dir), keep=lambda o: o % 3 == 0)
        active = list_segments(str(log_dir))[-1]
        rest = drain(sub, max_records=41)
        seen = head + rest
        # the old file it was reading is read to its end, then the rewrite takes over:
        # never a record twice, never out of order, every surviving record present
        assert seen == sorted(set(seen))
        survivors = [o for o in range(end) if o % 3 == 0 or o >= active]
        assert set(survivors) <= set(seen)
        assert set(seen) <= set(range(end))
        assert drain(stale) == [o for o in survivors if o >= 250]


# -- properties ------------------------------------------------------------------------------


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    operations=st.lists(
        st.one_of(
            st.tuples(st.just("append"), st.integers(1, 60)),
            st.tuples(st.just("poll"), st.integers(1, 80)),
            st.tuples(st.just("commit"), st.just(0)),
            st.tuples(st.just("restart"), st.just(0)),
        ),
        max_size=40,
    )
)
def test_property_commits_give_exactly_once_and_restarts_at_least_once(
    tmp_path_factory, operations
):
    """Against a model: every record is delivered in order; a restart resumes at the last
    commit (re-delivering only uncommitted records); the committed prefixes of all runs
    together are every record exactly once."""
    directory = tmp_path_factory.mktemp("prop")
    with compactlog.open(directory / "log", **SMALL) as log:
        sub = log.subscribe("s")
        appended = 0
        run: list[int] = []  # deliveries since the subscriber (re)started
        committed_runs: list[int] = []
        committed = 0
        for op, n in [*operations, ("append", 1), ("drain", 0), ("commit", 0)]:
            if op == "append":
                appended += len(fill(log, n, per_batch=7))
            elif op in ("poll", "drain"):
                got = [r.offset for r in sub.poll(max_records=n)] if op == "poll" else drain(sub)
                expected_start = run[-1] + 1 if run else committed
                assert got == list(range(expected_start, expected_start + len(got)))
                run.extend(got)
            elif op == "commit":
                sub.commit()
                committed_runs.extend(o for o in run if o >= committed)
                committed = sub.position
                run = [o for o in run if o >= committed]
            else:
                sub.close()
                sub = log.subscribe("s")
                assert sub.position == committed
                run = []
        assert sub.position == appended
        assert committed_runs == list(range(appended))


@settings(max_examples=30, deadline=None)
@given(
    batch_sizes=st.lists(st.integers(1, 40), min_size=1, max_size=20),
    limits=st.lists(
        st.tuples(st.integers(1, 50), st.one_of(st.none(), st.integers(1, 3000))), min_size=1
    ),
    start=st.integers(0, 100),
)
def test_property_poll_batches_and_poll_deliver_the_same_records(
    tmp_path_factory, batch_sizes, limits, start
):
    directory = tmp_path_factory.mktemp("batches")
    with compactlog.open(directory / "log", **SMALL) as log:
        for size in batch_sizes:
            fill(log, size, per_batch=size)
        end = log.end_offset
        start = min(start, end)
        columnar = log.subscribe("~a", start=start)
        rows = log.subscribe("~b", start=start)
        got_columnar: list[int] = []
        got_rows: list[int] = []
        i = 0
        while True:
            max_records, max_bytes = limits[i % len(limits)]
            i += 1
            batches = columnar.poll_batches(max_records=max_records, max_bytes=max_bytes)
            records = rows.poll(max_records=max_records, max_bytes=max_bytes)
            offsets = [o for b in batches for o in b.offsets.tolist()]
            assert offsets == [r.offset for r in records]
            assert len(offsets) <= max_records
            if not offsets:
                break
            got_columnar.extend(offsets)
            got_rows.extend(r.offset for r in records)
        assert got_columnar == got_rows == list(range(start, end))


# -- without a head --------------------------------------------------------------------------


def test_a_subscriber_reads_on_when_the_head_in_the_lock_file_is_invalid(log_dir):
    with compactlog.open(log_dir, **SMALL) as log:
        fill(log, 120)
    with open(log_dir / filenames.WRITER_LOCK, "r+b") as handle:
        handle.write(b"\0" * 36)  # what repair leaves for the next writer to revalidate
    with compactlog.open(log_dir, read_only=True) as log:
        sub = log.subscribe("s")
        assert drain(sub, max_records=50) == list(range(120))
        assert sub.poll(timeout_s=0.01) == []


def test_subscriber_is_usable_as_a_context_manager(log_dir):
    with compactlog.open(log_dir) as log:
        fill(log, 3)
        with log.subscribe("s") as sub:
            assert isinstance(sub, Subscriber) and len(sub.poll()) == 3
        assert sub.closed
        write_checkpoint(FileSystem(), str(log_dir), "s", 2)
        assert log.subscribe("s").position == 2


def test_polling_a_large_batch_a_little_at_a_time_decodes_it_once(log_dir, monkeypatch):
    """Issue 24: ``poll(1000)`` over one 100,000-record batch decoded the whole batch on
    every call (quadratic); the subscriber now keeps the decoded rest for its next polls."""
    from compactlog.encoding import batch_decode
    from compactlog.engine import subscriber
    from compactlog.storage import segment

    decodes = []
    original = batch_decode.decode_batch

    def counting(*args, **kwargs):
        decodes.append(1)
        return original(*args, **kwargs)

    for module in (segment, subscriber):  # whichever decodes for the subscriber
        if hasattr(module, "decode_batch"):
            monkeypatch.setattr(module, "decode_batch", counting)
    with compactlog.open(log_dir) as log:
        log.append_batch([(b"k%d" % i, b"v%d" % i) for i in range(20_000)])
        sub = log.subscribe("~t", start=0)
        got = []
        while records := sub.poll(max_records=100):
            got.extend(records)
        assert [r.offset for r in got] == list(range(20_000))
        assert got[12_345].value == b"v12345"
        assert len(decodes) == 1


def test_a_corrupt_batch_stops_a_subscriber_with_an_error_at_every_poll(log_dir):
    """Corruption (valid data after it) is reported by every poll that reaches it, never
    taken for the end of the data on a retry."""
    from compactlog.errors import CorruptLogError

    from .helpers import batch_positions, body_position, flip_bit, segment_files

    with compactlog.open(log_dir, segment_bytes=4096) as log:
        for i in range(100):
            log.append_batch([(b"k%d" % i, b"v" * 50)] * 3)
        first = segment_files(log_dir)[0]
        pos, _length = batch_positions(first)[5]
        flip_bit(first, body_position(pos))
        sub = log.subscribe("~t", start=0)
        assert len(sub.poll(max_records=15)) == 15  # the five batches before it
        for _attempt in range(2):
            with pytest.raises(CorruptLogError) as caught:
                sub.poll()
            assert caught.value.position == pos
        assert sub.position == 15
