"""A stop request in the middle of a round (SIGTERM to ``archive run``, the cleaner service
stopping): no new uploads, the running ones awaited, and a manifest committed for the
complete prefix of the view only when that prefix is a consistent state of the log
(``push.Archiver.push`` step 5)."""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import threading
import time
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import compactlog
from compactlog.archive import manifest as manifests
from compactlog.archive import open_store
from compactlog.archive.push import Archiver
from compactlog.archive.restore import restore
from compactlog.archive.store import FaultyStore
from compactlog.archive.verify import verify

from ..test_cleaner_daemon import Daemon
from ..test_cli import SCRIPT, run
from .helpers import Model, new_log, records_of, state_of
from .proxy import FaultyProxy


class StopAfterPuts:
    """A ``FaultyStore`` plan that requests the stop as the ``count``-th object put starts
    (``None``: never): that put completes, none after it starts (one upload thread)."""

    def __init__(self, count: int | None) -> None:
        self.count = count
        self.puts: list[str] = []
        self.event = threading.Event()

    def __call__(self, op: str, key: str) -> None:
        if op == "put" and key.startswith(manifests.OBJECT_PREFIX):
            self.puts.append(key)
            if self.count is not None and len(self.puts) >= self.count:
                self.event.set()
        return None


def archiver_for(reader, store, *, threads: int = 1) -> Archiver:
    ticks = itertools.count(1_700_000_000_000, 1000)
    archiver = Archiver(reader, store, threads=threads, clock=lambda: next(ticks))
    archiver.start()
    return archiver


def stoppable(source, url: str, stop_after: int | None):
    """The log at ``source`` opened read-only, and an archiver of it to ``url`` whose store
    requests the stop at the ``stop_after``-th object put."""
    reader = compactlog.open(source, read_only=True)
    plan = StopAfterPuts(stop_after)
    store = FaultyStore(open_store(url), plan)
    return reader, plan, store, archiver_for(reader, store)


def check_restore(store, manifest, source_records, model, tmp_path) -> None:
    """The committed manifest restores to exactly the log's records below its end."""
    target = tmp_path / f"restored-{manifest.sequence}"
    restore(store, str(target), as_of_offset=manifest.end_offset)
    assert records_of(target) == source_records
    assert state_of(target) == model.state(manifest.end_offset)
    with compactlog.open(target) as log:  # offsets the source handed out are not reused
        assert log.append(b"next", b"value") == manifest.handed_out


def append_distinct(log, model: Model, keys: range, size: int = 200) -> None:
    batch = [(b"key-%05d" % k, bytes([k % 251]) * size) for k in keys]
    offsets = list(log.append_batch(batch))
    model.records.extend((o, k, v) for o, (k, v) in zip(offsets, batch, strict=True))


def test_a_stopped_round_commits_the_complete_prefix_and_the_next_ships_the_rest(tmp_path, any_url):
    model = Model()
    log = new_log(tmp_path / "source")
    append_distinct(log, model, range(400))  # about 20 segments of 4 KiB
    reader, plan, store, archiver = stoppable(tmp_path / "source", any_url, 5)
    try:
        result = archiver.push(plan.event.is_set)
        assert result.stopped and result.manifest is not None
        assert len(plan.puts) == 5 and result.objects == 5  # nothing after the stop
        manifest = result.manifest
        assert [s.base for s in manifest.segments] == sorted(s.base for s in manifest.segments)
        assert 0 < manifest.end_offset < log.end_offset
        assert manifest.handed_out == log.end_offset  # never reused by a restore
        assert verify(store).ok
        check_restore(
            store, manifest, records_of(tmp_path / "source", manifest.end_offset), model, tmp_path
        )
        uploaded = {o.key for o in store.inner.list(manifests.OBJECT_PREFIX)}
    finally:
        archiver.stop()
    # a new process (its first round HEADs the objects) ships the rest, not those again
    plan.count, plan.puts = None, []
    fresh = archiver_for(reader, store, threads=4)
    try:
        result = fresh.push()
    finally:
        fresh.stop()
        reader.close()
    assert not result.stopped and result.manifest is not None
    assert result.manifest.end_offset == log.end_offset
    assert not uploaded & set(plan.puts) and result.objects == len(plan.puts)
    check_restore(store, result.manifest, records_of(tmp_path / "source"), model, tmp_path)
    log.close()


def test_a_stopped_round_never_commits_a_prefix_below_the_cleaner_point(tmp_path, memory_url):
    """Every key written twice, then compacted: the first cleaned segment holds only
    second versions, so the log cut after it lacks the first versions of the keys whose
    second version lies past the cut. That prefix is not a state the log ever had."""
    model = Model()
    log = new_log(tmp_path / "source")
    append_distinct(log, model, range(300))
    append_distinct(log, model, range(300), size=201)
    append_distinct(log, model, range(300, 320))
    log.compact(force=True)
    reader, plan, store, archiver = stoppable(tmp_path / "source", memory_url, 1)
    try:
        result = archiver.push(plan.event.is_set)
        assert result.stopped and result.manifest is None  # nothing consistent to commit
        assert manifests.latest(store) is None
        plan.count = None
        result = archiver.push()  # the next round commits all of it, the object reused
    finally:
        archiver.stop()
        reader.close()
    assert result.manifest is not None and len(plan.puts) == result.objects + 1
    check_restore(store, result.manifest, records_of(tmp_path / "source"), model, tmp_path)
    log.close()


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    steps=st.lists(
        st.tuples(
            st.integers(1, 250),  # records appended
            st.booleans(),  # a compaction before the push
            st.none() | st.integers(0, 6),  # the stop comes as the k-th upload starts
        ),
        min_size=2,
        max_size=6,
    ),
    seed=st.integers(0, 1 << 16),
)
def test_partial_commits_restore_to_the_log_below_their_end(tmp_path_factory, steps, seed):
    """Appends, compactions and rounds stopped at random: every committed manifest restores
    to exactly the log's records below its end (the latest-per-key model there), the
    newest end never goes back, and the last full round leaves the whole log archived."""
    tmp_path = tmp_path_factory.mktemp("partial")
    rng = random.Random(seed)
    model = Model()
    source = tmp_path / "source"
    log = new_log(source)
    reader, plan, store, archiver = stoppable(source, f"memory://partial-{uuid.uuid4().hex}", None)
    newest_end = 0
    try:
        for count, compact, stop_after in [*steps, (1, False, None)]:
            model.append(log, rng, count, keys=60)
            if compact:
                log.compact(force=True)
            plan.count, plan.puts = stop_after, []
            plan.event.clear()
            result = archiver.push(plan.event.is_set)
            if result.manifest is None:
                continue
            manifest = result.manifest
            assert manifest.end_offset >= newest_end
            newest_end = manifest.end_offset
            assert manifest.cleaner_point <= manifest.end_offset
            check_restore(store, manifest, records_of(source, manifest.end_offset), model, tmp_path)
        assert not result.stopped and newest_end == log.end_offset
        assert verify(store).ok
    finally:
        archiver.stop()
        reader.close()
        log.close()


SLOW_BYTES_PER_SECOND = 512 << 10  # per connection: the archiver uploads 4 at a time
BACKLOG_SEGMENTS = 24


def slow_link(seaweed) -> FaultyProxy:
    """A loopback link to the S3 server that carries uploads at ``SLOW_BYTES_PER_SECOND``."""
    return FaultyProxy(
        ("127.0.0.1", seaweed.ports["s3.port"]),
        fault_rate=0.0,
        bytes_per_second=SLOW_BYTES_PER_SECOND,
    )


def backlog(path, model: Model, **config):
    """A log of ``BACKLOG_SEGMENTS`` segments of 1 MiB: a whole round over the slow link
    takes at least ``backlog_round_s()``."""
    log = new_log(path, segment_bytes=1 << 20, sync="interval", **config)
    per_segment = 1000
    for start in range(0, BACKLOG_SEGMENTS * per_segment, per_segment):
        append_distinct(log, model, range(start, start + per_segment), size=1000)
    log.flush()
    return log


def backlog_round_s() -> float:
    return BACKLOG_SEGMENTS * (1 << 20) / (4 * SLOW_BYTES_PER_SECOND)


def wait_for_objects(store, process, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not store.list(manifests.OBJECT_PREFIX):
        assert process.poll() is None, "the archiver exited before uploading anything"
        assert time.monotonic() < deadline, "no object uploaded"
        time.sleep(0.05)


def check_stopped_archive(tmp_path, store, url, source, log, model) -> None:
    """A prefix was committed: verify passes, it restores to the log below its end, and a
    second archiver ships the rest without uploading the complete objects again."""
    manifest = manifests.latest(store)
    assert manifest is not None and 0 < manifest.end_offset < log.end_offset
    run("archive", "verify", url)
    run("archive", "restore", url, tmp_path / "partial")
    assert records_of(tmp_path / "partial") == records_of(source, manifest.end_offset)
    assert state_of(tmp_path / "partial") == model.state(manifest.end_offset)
    before = {o.key for o in store.list(manifests.OBJECT_PREFIX)}
    pushed = json.loads(run("archive", "push", source, url, "--json").stdout)
    after = {o.key for o in store.list(manifests.OBJECT_PREFIX)}
    assert pushed["objects"] == len(after - before) > 0  # no complete object shipped again
    assert pushed["end_offset"] == log.end_offset
    run("archive", "restore", url, tmp_path / "whole")
    assert state_of(tmp_path / "whole") == model.state()


def test_sigterm_mid_round_exits_0_at_once_with_the_complete_prefix_committed(
    tmp_path, seaweed, s3_url
):
    model = Model()
    source = tmp_path / "source"
    log = backlog(source, model)
    link = slow_link(seaweed)
    store = open_store(s3_url)
    process = subprocess.Popen(
        [SCRIPT, "archive", "run", str(source), s3_url, "--interval", "1s", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "AWS_ENDPOINT_URL": link.endpoint},
    )
    try:
        wait_for_objects(store, process)  # mid-round (its SIGTERM handler is set by then)
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=120)
        took = time.monotonic() - signalled
    finally:
        if process.poll() is None:
            process.kill()
        link.close()
    assert process.returncode == 0, err
    assert took < min(backlog_round_s() / 2, 6.0), f"took {took:.1f}s to stop"
    events = [json.loads(line) for line in out.splitlines()]
    commits = [e for e in events if e["event"] == "commit"]
    assert commits and commits[-1]["stopped"], events
    assert events[-1]["event"] == "stopped"
    check_stopped_archive(tmp_path, store, s3_url, source, log, model)
    log.close()


def test_the_cleaner_service_stops_its_archive_job_mid_round_at_once(
    tmp_path, seaweed, s3_url, monkeypatch
):
    root = tmp_path / "root"
    root.mkdir()
    model = Model()
    # not cleaned by the service meanwhile: a stopped first round of a log cleaned up to
    # its active segment has no prefix to commit (the cleaner point is its end)
    log = backlog(root / "orders", model, min_compaction_lag_ms=3_600_000)
    link = slow_link(seaweed)
    monkeypatch.setenv("AWS_ENDPOINT_URL", link.endpoint)  # the service's, not ours
    config = tmp_path / "cleaner.toml"
    config.write_text(
        f"""
roots = ["{root}"]
[schedule]
interval_seconds = 60
grace_seconds = 30
[archive]
url = "{s3_url}"
interval_seconds = 1
"""
    )
    daemon = Daemon(tmp_path, "--config", str(config), name="archiving")
    monkeypatch.setenv("AWS_ENDPOINT_URL", seaweed.endpoint)
    url = f"{s3_url}/orders"
    store = open_store(url)
    try:
        wait_for_objects(store, daemon.proc)
        signalled = time.monotonic()
        code = daemon.stop()
        took = time.monotonic() - signalled
    finally:
        daemon.kill()
        link.close()
    assert code == 0
    assert took < min(backlog_round_s() / 2, 6.0), f"took {took:.1f}s to stop"
    check_stopped_archive(tmp_path, store, url, str(root / "orders"), log, model)
    log.close()
