"""Snapshots: a consistent, read-only, point-in-time copy of a live log.

A snapshot holds exactly the log's records below its end offset, hard-links closed
segments, copies the active one up to a batch boundary, survives any later compaction of
the source unchanged, and is checked by ``compactlog verify`` against its manifest.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import compactlog
from compactlog.engine.snapshot import (
    MANIFEST,
    SnapshotError,
    file_crc,
    read_manifest,
    verify_manifest,
)
from compactlog.errors import LogLockedError, ReadOnlyLogError

from .helpers import flip_bit


def _fill(log, count, keys=40, start=0, tombstone_every=0):
    model = {}
    for i in range(start, start + count):
        key = b"key-%03d" % (i % keys)
        if tombstone_every and i % tombstone_every == 0:
            log.append(key, None)
            model.pop(key, None)
        else:
            value = b"value-%d" % i
            log.append(key, value)
            model[key] = value
    log.flush()
    return model


def _records(log, end=None):
    return [(r.offset, r.key, r.value, r.timestamp, r.headers) for r in log.read(end=end)]


def _latest(log, end=None):
    return {r.key: r.value for r in log.latest(end)}


def test_snapshot_holds_exactly_the_records_below_its_end_offset(tmp_path):
    with compactlog.open(tmp_path / "log", segment_bytes=2048) as log:
        _fill(log, 500, tombstone_every=7)
        snap = log.snapshot(tmp_path / "snap")
        _fill(log, 200, start=500)  # after the snapshot: not in it
        assert snap.end_offset == 500
        with compactlog.open(tmp_path / "snap", read_only=True) as copy:
            assert copy.end_offset == 500
            assert _records(copy) == _records(log, end=500)
            assert _latest(copy) == _latest(log, 500)


def test_closed_segments_are_hard_linked_and_the_active_one_copied(tmp_path):
    with compactlog.open(tmp_path / "log", segment_bytes=2048) as log:
        _fill(log, 300)
        snap = log.snapshot(tmp_path / "snap")
        bases = log.get_segments()
    linked = {f.name for f in snap.files if f.linked}
    closed = {f"{b:020d}.log" for b in bases[:-1]}
    assert linked == closed and closed
    for name in closed:
        assert os.stat(tmp_path / "snap" / name).st_ino == os.stat(tmp_path / "log" / name).st_ino
    active = f"{bases[-1]:020d}.log"
    assert os.stat(tmp_path / "snap" / active).st_ino != os.stat(tmp_path / "log" / active).st_ino


def test_manifest_records_end_offset_sizes_crcs_and_format_version(tmp_path):
    with compactlog.open(tmp_path / "log", segment_bytes=2048) as log:
        _fill(log, 300)
        log.snapshot(tmp_path / "snap")
    manifest = read_manifest(tmp_path / "snap")
    document = json.loads((tmp_path / "snap" / MANIFEST).read_bytes())
    assert document["manifest_version"] == 1 and document["format_version"] == 1
    assert manifest.end_offset == 300 and manifest.source == str(tmp_path / "log")
    assert manifest.created_ms > 0
    for entry in manifest.files:
        assert file_crc(str(tmp_path / "snap" / entry.name)) == (entry.size, entry.crc32c)
    assert {"meta"} <= {f.name for f in manifest.files}


def test_compaction_never_changes_a_file_the_snapshot_links_to(tmp_path):
    with compactlog.open(
        tmp_path / "log", segment_bytes=2048, min_compaction_lag_ms=0, delete_retention_ms=0
    ) as log:
        _fill(log, 600, tombstone_every=5)
        snap = log.snapshot(tmp_path / "snap")
        before = {f.name: file_crc(str(tmp_path / "snap" / f.name)) for f in snap.files}
        with compactlog.open(tmp_path / "snap", read_only=True) as copy:
            records = _records(copy)
        _fill(log, 400, start=600, tombstone_every=3)
        for _ in range(3):
            stats = log.compact(force=True)
            assert stats.groups_swapped >= 0
        # the live log really changed under the snapshot's names
        assert any(
            not os.path.exists(tmp_path / "log" / name)
            or os.stat(tmp_path / "log" / name).st_ino != os.stat(tmp_path / "snap" / name).st_ino
            for name in before
            if name.endswith(".log")
        )
    after = {name: file_crc(str(tmp_path / "snap" / name)) for name in before}
    assert after == before
    assert verify_manifest(tmp_path / "snap") == []
    with compactlog.open(tmp_path / "snap", read_only=True) as copy:
        assert _records(copy) == records


def test_snapshot_keeps_the_cleaner_point_of_the_source(tmp_path):
    with compactlog.open(tmp_path / "log", segment_bytes=2048, min_compaction_lag_ms=0) as log:
        _fill(log, 500)
        log.compact(force=True)
        _fill(log, 100, start=500)
        snap = log.snapshot(tmp_path / "snap")
    point = json.loads((tmp_path / "log" / "cleaner.checkpoint").read_bytes())
    assert snap.cleaner_point == point["first_dirty_offset"] > 0


def test_a_snapshot_opens_read_only_and_refuses_writes(tmp_path):
    with compactlog.open(tmp_path / "log") as log:
        _fill(log, 10)
        log.snapshot(tmp_path / "snap")
    with compactlog.open(tmp_path / "snap", read_only=True) as copy:
        with pytest.raises(ReadOnlyLogError):
            copy.append(b"k", b"v")
        assert len(list(copy.read())) == 10


def test_snapshot_of_a_read_only_open_and_of_an_empty_log(tmp_path):
    with compactlog.open(tmp_path / "log") as log:
        snap = log.snapshot(tmp_path / "empty")
        assert snap.end_offset == 0
        _fill(log, 5)
    with compactlog.open(tmp_path / "log", read_only=True) as reader:
        assert reader.snapshot(tmp_path / "snap").end_offset == 5
    with compactlog.open(tmp_path / "empty", read_only=True) as copy:
        assert list(copy.read()) == []


def test_existing_destination_is_refused_and_a_stale_partial_is_replaced(tmp_path):
    with compactlog.open(tmp_path / "log") as log:
        _fill(log, 10)
        (tmp_path / "taken").mkdir()
        with pytest.raises(SnapshotError, match="already exists"):
            log.snapshot(tmp_path / "taken")
        with pytest.raises(SnapshotError, match="parent"):
            log.snapshot(tmp_path / "no" / "such" / "dir")
        # a snapshot that died half-way left its .partial directory: the next one replaces it
        stale = tmp_path / "snap.partial"
        stale.mkdir()
        (stale / "00000000000000000000.log").write_bytes(b"junk")
        log.snapshot(tmp_path / "snap")
    assert not stale.exists()
    assert verify_manifest(tmp_path / "snap") == []


def test_verify_reports_a_snapshot_file_that_changed(tmp_path):
    from click.testing import CliRunner
    from compactlog.cli.main import cli

    with compactlog.open(tmp_path / "log", segment_bytes=2048) as log:
        _fill(log, 300)
        snap = log.snapshot(tmp_path / "snap")
    runner = CliRunner()
    result = runner.invoke(cli, ["verify", str(tmp_path / "snap")], standalone_mode=False)
    assert result.exception is None and result.return_value == 0, result.output
    assert "snapshot" in result.output
    # damage the copied (not linked) active segment's last byte: the CRC tells
    copied = next(f for f in snap.files if f.name.endswith(".log") and not f.linked)
    flip_bit(tmp_path / "snap" / copied.name, copied.size - 1)
    problems = verify_manifest(tmp_path / "snap")
    assert problems and copied.name in problems[0] and "crc32c" in problems[0]
    result = runner.invoke(cli, ["verify", str(tmp_path / "snap"), "--json"], standalone_mode=False)
    assert result.return_value == 1
    kinds = {p["kind"] for p in json.loads(result.output)["problems"]}
    assert "snapshot" in kinds


def test_cli_snapshot_json(tmp_path):
    from click.testing import CliRunner
    from compactlog.cli.main import cli

    with compactlog.open(tmp_path / "log") as log:
        _fill(log, 25)
    result = CliRunner().invoke(
        cli,
        ["snapshot", str(tmp_path / "log"), str(tmp_path / "snap"), "--json"],
        standalone_mode=False,
    )
    assert result.exception is None, result.output
    document = json.loads(result.output)
    assert document["end_offset"] == 25 and document["path"] == str(tmp_path / "snap")


APPENDER = textwrap.dedent(
    """
    import sys, compactlog
    path, count = sys.argv[1], int(sys.argv[2])
    with compactlog.open(path) as log:
        for i in range(0, count, 10):
            log.append_batch(
                [(b"k%03d" % (j % 50), None if j % 13 == 0 else b"v%d" % j)
                 for j in range(i, i + 10)]
            )
    """
)

COMPACTOR = textwrap.dedent(
    """
    import sys, time, compactlog
    from compactlog.errors import LogLockedError
    path, seconds = sys.argv[1], float(sys.argv[2])
    deadline = time.monotonic() + seconds
    with compactlog.open(path) as log:
        while time.monotonic() < deadline:
            try:
                log.compact(force=True)
            except LogLockedError:
                pass
    """
)


def _model_latest(end):
    model = {}
    for j in range(end):
        key = b"k%03d" % (j % 50)
        if j % 13 == 0:
            model.pop(key, None)
        else:
            model[key] = b"v%d" % j
    return model


def test_snapshots_taken_while_one_process_appends_and_another_compacts(tmp_path):
    path = tmp_path / "log"
    config = {"segment_bytes": 4096, "min_compaction_lag_ms": 0, "delete_retention_ms": 3600_000}
    with compactlog.open(path, **config):
        pass
    appender = subprocess.Popen([sys.executable, "-c", APPENDER, str(path), "20000"])
    compactor = subprocess.Popen([sys.executable, "-c", COMPACTOR, str(path), "60"])
    snaps = []
    try:
        with compactlog.open(path, read_only=True) as log:
            while appender.poll() is None and len(snaps) < 12:
                time.sleep(0.05)
                try:
                    snaps.append(log.snapshot(tmp_path / f"snap{len(snaps)}"))
                except LogLockedError:  # pragma: no cover - the snapshot waits instead
                    raise
        assert appender.wait(timeout=120) == 0
    finally:
        compactor.send_signal(signal.SIGKILL)
        compactor.wait()
    assert len(snaps) >= 3
    crcs = []
    for snap in snaps:
        with compactlog.open(snap.path, read_only=True) as copy:
            assert copy.end_offset == snap.end_offset
            records = list(copy.read())
            offsets = [r.offset for r in records]
            assert offsets == sorted(set(offsets)) and all(o < snap.end_offset for o in offsets)
            # every record is the one appended at its offset (one appender: offset = j)
            for r in records:
                assert r.key == b"k%03d" % (r.offset % 50)
                assert r.value == (None if r.offset % 13 == 0 else b"v%d" % r.offset)
            # the cleaner keeps every key's latest record below the snapshot end
            assert _latest(copy) == _model_latest(snap.end_offset)
        assert verify_manifest(snap.path) == []
        crcs.append({f.name: file_crc(os.path.join(snap.path, f.name)) for f in snap.files})
    with compactlog.open(path, min_compaction_lag_ms=0) as log:
        log.compact(force=True)
    for snap, before in zip(snaps, crcs, strict=True):
        assert {name: file_crc(os.path.join(snap.path, name)) for name in before} == before


SNAPSHOTTER = textwrap.dedent(
    """
    import sys, compactlog
    path, root = sys.argv[1], sys.argv[2]
    with compactlog.open(path, read_only=True) as log:
        i = 0
        while True:
            log.snapshot(f"{root}/snap{i}")
            print(i, flush=True)
            i += 1
    """
)


def test_a_snapshot_killed_mid_way_leaves_no_destination_or_a_complete_one(tmp_path):
    path = tmp_path / "log"
    with compactlog.open(path, segment_bytes=1024) as log:
        _fill(log, 3000)
    root = tmp_path / "snaps"
    root.mkdir()
    child = subprocess.Popen(
        [sys.executable, "-c", SNAPSHOTTER, str(path), str(root)], stdout=subprocess.PIPE
    )
    assert child.stdout is not None
    child.stdout.readline()  # one finished: the next is under way
    time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait()
    complete = [p for p in root.iterdir() if not p.name.endswith(".partial")]
    assert complete
    for snap in complete:
        assert verify_manifest(snap) == [], snap
        with compactlog.open(snap, read_only=True) as copy:
            assert copy.end_offset == 3000
    with compactlog.open(path, read_only=True) as log:
        for partial in root.glob("*.partial"):
            log.snapshot(str(partial)[: -len(".partial")])  # replaces the leftover
    assert not list(root.glob("*.partial"))


def test_records_in_this_process_precommit_buffer_are_in_the_snapshot(tmp_path):
    with compactlog.open(tmp_path / "log", precommit_bytes=64 * 1024, sync="os") as log:
        offsets = [log.append(b"k%d" % i, b"v%d" % i) for i in range(50)]  # buffered
        snap = log.snapshot(tmp_path / "snap")
    assert snap.end_offset == offsets[-1] + 1
    with compactlog.open(tmp_path / "snap", read_only=True) as copy:
        assert [r.value for r in copy.read()] == [b"v%d" % i for i in range(50)]


def test_a_non_durable_snapshot_is_the_same_snapshot_without_any_fsync(tmp_path, monkeypatch):
    """``durable=False`` (restore's own, short-lived snapshot) skips only the fsyncs."""
    from compactlog.engine.snapshot import take_snapshot

    with compactlog.open(tmp_path / "log", segment_bytes=2048) as log:
        _fill(log, 400, tombstone_every=9)
        calls = []
        real_fsync = os.fsync
        monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real_fsync(fd)))
        durable = take_snapshot(log, tmp_path / "durable")
        durable_fsyncs = len(calls)
        calls.clear()
        quick = take_snapshot(log, tmp_path / "quick", durable=False)
        assert durable_fsyncs > 0 and calls == []
        assert quick.end_offset == durable.end_offset == 400
        assert [(f.name, f.size, f.crc32c, f.linked) for f in quick.files] == [
            (f.name, f.size, f.crc32c, f.linked) for f in durable.files
        ]
        assert verify_manifest(tmp_path / "quick") == []
        assert not os.path.exists(str(tmp_path / "quick") + ".partial")
        with compactlog.open(tmp_path / "quick", read_only=True) as copy:
            assert _records(copy) == _records(log)
