"""Status and figures an operator can trust (issue 18, item 4), through the installed CLI and
daemon as an operator runs them.

- ``compactlog cleaner status`` after ``compactlog-cleaner --once`` (cron) reports that
  round's result and the figures after it, and exits 0 when it succeeded, 1 when it failed;
- ``meta``, ``stats``, ``compact --if-due`` and the service give one dirty ratio, with the
  active segment's bytes apart;
- ``compact`` prints Kafka's short summary, not every statistic, and a first pass leaves no
  empty segment behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import compactlog
from compactlog.storage.segment import HEADER_SIZE

from .helpers import flip_bit, segment_files

BIN = Path(sys.executable).parent
SMALL = {"segment_bytes": 16 * 1024, "min_cleanable_dirty_ratio": 0.5}


def run(program: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / program), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


def fill(path: Path, rounds: int = 4, keys: int = 200, **config: Any) -> None:
    """``rounds`` updates of every key: all but the last round superseded."""
    with compactlog.open(str(path), **{**SMALL, **config}) as log:
        for _ in range(rounds):
            for k in range(keys):
                log.append(f"key-{k:05d}".encode(), b"v" * 40)


def as_json(done: subprocess.CompletedProcess) -> Any:
    assert done.stdout, done.stderr
    return json.loads(done.stdout)


def test_cleaner_status_after_a_successful_once_run_exits_0_with_that_rounds_figures(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    fill(root / "orders")
    before = as_json(run("compactlog", "meta", str(root / "orders"), "--json"))
    assert before["dirty_ratio"] > 0.5
    once = run("compactlog-cleaner", "--root", str(root), "--once")
    assert once.returncode == 0, once.stderr
    done = run("compactlog", "cleaner", "status", str(root))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "--once run finished" in done.stdout and "1 cleaned" in done.stdout
    document = as_json(run("compactlog", "cleaner", "status", str(root), "--json"))
    assert document["last_round"]["ok"] and document["last_round"]["cleaned"] == 1
    (state,) = document["logs"].values()
    after = as_json(run("compactlog", "meta", str(root / "orders"), "--json"))
    # the figures after the pass, the same as meta's (one dirty ratio)
    assert state["dirty_ratio"] == after["dirty_ratio"] == 0.0
    assert state["segments"] == after["segments"] < before["segments"]


def test_cleaner_status_after_a_failed_once_run_exits_1_and_names_the_log(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    fill(root / "broken")
    first = segment_files(root / "broken")[0]
    flip_bit(first, HEADER_SIZE + 40)  # a damaged batch in a closed segment
    once = run("compactlog-cleaner", "--root", str(root), "--once")
    assert once.returncode == 1
    done = run("compactlog", "cleaner", "status", str(root))
    assert done.returncode == 1
    assert "failed: broken" in done.stdout


def test_meta_stats_and_compact_if_due_give_one_dirty_ratio(tmp_path):
    """Once the closed segments are clean, only the active segment holds new records: it is
    in no ratio (the cleaner never touches it), so every tool says 0.000 and the pass is not
    due, while the active segment's bytes are shown apart."""
    path = tmp_path / "log"
    fill(path, rounds=4)
    assert run("compactlog", "compact", str(path), "--progress", "none").returncode == 0
    with compactlog.open(str(path)) as log:  # new records, all in the active segment
        for k in range(60):
            log.append(f"key-{k:05d}".encode(), b"w" * 40)
    meta = as_json(run("compactlog", "meta", str(path), "--json"))
    stats = as_json(run("compactlog", "stats", str(path), "--json"))
    due = as_json(run("compactlog", "compact", str(path), "--if-due", "--json"))
    assert meta["dirty_ratio"] == stats["dirty_ratio"] == round(due["stats"]["dirty_ratio"], 4)
    assert meta["dirty_ratio"] == 0.0 and due["stats"]["cleaned"] is False
    assert meta["active_segment_bytes"] == stats["active_segment_bytes"] > HEADER_SIZE
    assert due["stats"]["active_segment_bytes"] == meta["active_segment_bytes"]
    text = run("compactlog", "meta", str(path)).stdout
    assert "0.000 (" in text and "active segment" in text and "not counted" in text


def test_compact_prints_kafkas_summary_lines_unwrapped_and_json_keeps_every_statistic(tmp_path):
    path = tmp_path / "log"
    fill(path)
    done = run("compactlog", "compact", str(path), "--progress", "none")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"{path}: compaction done in ")  # one line, not wrapped
    assert lines[1].startswith(f"Cleaner cleaned {path} (dirty section = [0, ")
    assert any("size reduction" in line for line in lines)
    assert len(lines) <= 12  # the summary, not every statistic
    assert not any(line.startswith("map_capacity") for line in lines)
    fill(tmp_path / "again")
    document = as_json(run("compactlog", "compact", str(tmp_path / "again"), "--json"))
    assert {"map_capacity", "batches_merged", "segments_after"} <= document["stats"].keys()


def test_a_first_pass_leaves_no_empty_segment_and_changes_no_offset(tmp_path):
    """Segments whose every record a later one supersedes used to stay behind as 16-byte
    files: a segment filled to within 16 bytes of segment_bytes closed its group at once,
    whatever the group's (empty) output held. This workload left three such files."""
    path = tmp_path / "log"
    with compactlog.open(str(path), segment_bytes=64 * 1024) as log:
        for i in range(40_000):
            log.append(f"k{i % 500}".encode(), b"v" * 20)
    with compactlog.open(str(path), read_only=True) as log:
        latest = {r.key: r.offset for r in log.read()}
        end = log.end_offset
    assert run("compactlog", "compact", str(path), "--progress", "none").returncode == 0
    sizes = [f.stat().st_size for f in segment_files(path)]
    assert all(size > HEADER_SIZE for size in sizes), sizes
    with compactlog.open(str(path), read_only=True) as log:
        assert {r.key: r.offset for r in log.read()} == latest
        assert log.end_offset == end
    assert run("compactlog", "verify", str(path)).returncode == 0
