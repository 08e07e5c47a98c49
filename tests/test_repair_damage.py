"""``repair`` is never a dead end: a damaged segment header, subscriber checkpoint, cleaner
checkpoint or ``meta`` (with ``--rebuild-meta``) is fixed, saying how, and every other
tool's error names the problem and the command that fixes it (engine/repair_state.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import compactlog
from compactlog.engine.invariants import verify_log
from compactlog.errors import CompactLogError
from compactlog.storage import filenames
from compactlog.storage.segment import list_segments
from compactlog.storage.state_files import read_meta

SCRIPT = os.path.join(os.path.dirname(sys.executable), "compactlog")


def make_log(path: Path) -> list[tuple[int, bytes]]:
    with compactlog.open(path, segment_bytes=2048, retention_ms=86_400_000, sync="os") as log:
        for i in range(300):
            log.append(f"k{i % 30}".encode(), b"v%d" % i * 4)
        subscriber = log.subscribe("billing")
        subscriber.poll(max_records=120)
        subscriber.commit()
    return records(path)


def records(path: Path) -> list[tuple[int, bytes]]:
    with compactlog.open(path, read_only=True) as log:
        return [(r.offset, r.value) for r in log.read()]


def run(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([SCRIPT, *map(str, args)], capture_output=True, text=True, timeout=60)


def test_a_zeroed_segment_header_is_rebuilt_and_every_batch_kept(tmp_path):
    path = tmp_path / "log"
    before = make_log(path)
    segment = path / filenames.segment_name(list_segments(str(path))[1])
    with open(segment, "r+b") as handle:
        handle.write(bytes(16))
    with pytest.raises(CompactLogError, match=segment.name):
        records(path)
    report = compactlog.repair(path)
    assert [f for f in report.fixes if "rebuilt a damaged file header" in f], report.fixes
    assert verify_log(str(path)).ok
    assert records(path) == before


def test_a_damaged_subscriber_checkpoint_is_named_then_restarted_at_the_log_start(tmp_path):
    path = tmp_path / "log"
    make_log(path)
    name = filenames.checkpoint_name("billing")
    (path / name).write_bytes(b'{"subscriber": "bil\x00')
    [problem] = verify_log(str(path)).problems
    assert problem.file == name and "compactlog repair" in problem.message
    report = compactlog.repair(path)
    [line] = [f for f in report.fixes if "billing" in f]
    assert "reset subscriber 'billing' to the log start 0" in line
    assert (path / filenames.quarantine_name(name, 0)).exists()
    assert verify_log(str(path)).ok
    with compactlog.open(path) as log:
        assert log.subscribers() == {"billing": 0}
        assert log.subscribe("billing").poll(max_records=1)[0].offset == 0


def test_a_damaged_cleaner_checkpoint_is_moved_aside_and_the_cleaner_starts_over(tmp_path):
    path = tmp_path / "log"
    make_log(path)
    with compactlog.open(path) as log:
        log.compact(force=True)
    (path / filenames.CLEANER_CHECKPOINT).write_bytes(b"{\x00")
    assert not verify_log(str(path)).ok
    report = compactlog.repair(path)
    assert [f for f in report.fixes if "the cleaner starts over" in f], report.fixes
    assert verify_log(str(path)).ok
    with compactlog.open(path) as log:
        log.compact(force=True)
        log.check()


def test_a_damaged_meta_is_rebuilt_with_the_settings_still_legible(tmp_path):
    path = tmp_path / "log"
    before = make_log(path)
    log_id = read_meta(str(path)).log_id
    lines = (path / "meta").read_text().splitlines(keepends=True)
    [at] = [i for i, line in enumerate(lines) if '"retention_ms"' in line]
    lines[at] = lines[at].replace('"retention_ms"', '"retent\x00on_ms"')
    (path / "meta").write_text("".join(lines))
    with pytest.raises(CompactLogError, match="--rebuild-meta"):
        compactlog.open(path, read_only=True)
    with pytest.raises(CompactLogError, match="--rebuild-meta"):
        compactlog.repair(path)
    report = compactlog.repair(path, rebuild_meta=True)
    [lost] = [f for f in report.fixes if f.startswith("settings not recovered")]
    assert lost.endswith(": retention_ms")
    meta = read_meta(str(path))
    assert meta.config.segment_bytes == 2048 and meta.config.retention_ms is not None
    assert meta.log_id == log_id
    assert verify_log(str(path)).ok
    assert records(path) == before


def test_a_deleted_meta_through_the_cli_names_the_flag_and_is_rebuilt(tmp_path):
    path = tmp_path / "log"
    before = make_log(path)
    os.remove(path / "meta")
    done = run("verify", path)
    assert done.returncode == 1 and "--rebuild-meta" in done.stdout, done
    done = run("repair", path)
    assert done.returncode == 2 and "--rebuild-meta" in done.stderr, done
    done = run("repair", path, "--rebuild-meta", "--json")
    assert done.returncode == 0, done
    fixes = json.loads(done.stdout)["fixes"]
    assert any("settings not recovered" in f for f in fixes), fixes
    assert run("verify", path).returncode == 0
    assert records(path) == before
    assert read_meta(str(path)).config.segment_bytes == compactlog.LogConfig().segment_bytes


def test_a_meta_of_a_newer_format_is_refused_not_rebuilt(tmp_path):
    path = tmp_path / "log"
    make_log(path)
    document = json.loads((path / "meta").read_text())
    document["format_version"] = 99
    (path / "meta").write_text(json.dumps(document))
    with pytest.raises(CompactLogError, match="newer"):
        compactlog.repair(path, rebuild_meta=True)
    assert json.loads((path / "meta").read_text())["format_version"] == 99


def test_a_deleted_meta_is_rebuilt_from_a_snapshot_of_the_log(tmp_path):
    path, snapshot = tmp_path / "log", tmp_path / "snap"
    before = make_log(path)
    with compactlog.open(path) as log:
        log.snapshot(snapshot)
    original = read_meta(str(path))
    os.remove(path / "meta")
    report = compactlog.repair(path, meta_from=snapshot)
    assert not [f for f in report.fixes if "not recovered" in f], report.fixes
    meta = read_meta(str(path))
    assert (meta.config, meta.log_id) == (original.config, original.log_id)
    assert verify_log(str(path)).ok
    assert records(path) == before


def test_a_damaged_log_start_never_hides_records(tmp_path):
    path = tmp_path / "log"
    before = make_log(path)
    text = (path / "meta").read_text().replace('"log_start_offset": 0', '"log_start_offset": 8')
    (path / "meta").write_text(text.replace('"magic": "compactlog"', '"magic": "compactlog\x00'))
    compactlog.repair(path, rebuild_meta=True)
    assert read_meta(str(path)).log_start_offset == 0
    assert records(path) == before
