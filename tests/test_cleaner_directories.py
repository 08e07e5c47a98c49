"""What ``compactlog-cleaner`` refuses before it runs, as an operator meets it: the installed
script as a subprocess (issue 18, items 2 and 3).

An ``[[override]]`` goes through the rules of ``compactlog config set``: one that would
change a log's ``cleanup_policy`` is a configuration error at ``--check`` and at start,
naming the rule and the log, and nothing is stored. A root that is itself a log is refused
and the service writes nothing into it; a root holding no log fails ``--once``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import compactlog

SCRIPT = str(Path(sys.executable).with_name("compactlog-cleaner"))


def cleaner(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SCRIPT, "--no-metrics", *map(str, args)], capture_output=True, text=True, timeout=120
    )


def make_log(path: Path) -> None:
    with compactlog.open(path, segment_bytes=1024) as log:
        for i in range(200):
            log.append(b"k%d" % (i % 4), b"v" * 40)


def unsafe_override(tmp_path: Path) -> Path:
    make_log(tmp_path / "root" / "orders")
    config = tmp_path / "cleaner.toml"
    config.write_text('roots = ["root"]\n[[override]]\nmatch = "*"\ncleanup_policy = "delete"\n')
    return config


def assert_refused_override(done: subprocess.CompletedProcess[str], tmp_path: Path) -> None:
    assert done.returncode == 2, done.stderr
    line = done.stderr.strip()
    assert line.startswith("compactlog-cleaner: configuration error:")
    assert "override[0]" in line and "(match '*') on log orders" in line
    assert "refusing to change cleanup_policy" in line
    with compactlog.open(tmp_path / "root" / "orders", read_only=True) as log:
        assert log.config.cleanup_policy == "compact"


def test_an_unsafe_override_is_refused_at_check(tmp_path):
    assert_refused_override(cleaner("--config", unsafe_override(tmp_path), "--check"), tmp_path)


def test_an_unsafe_override_is_refused_at_start(tmp_path):
    config = unsafe_override(tmp_path)
    assert_refused_override(cleaner("--config", config, "--once"), tmp_path)
    assert not (tmp_path / "root" / ".compactlog-cleaner.json").exists()  # it never ran


def test_a_safe_override_passes_check(tmp_path):
    make_log(tmp_path / "root" / "orders")
    config = tmp_path / "cleaner.toml"
    config.write_text('roots = ["root"]\n[[override]]\nmatch = "*"\nretention_ms = 1000\n')
    done = cleaner("--config", config, "--check")
    assert done.returncode == 0, done.stderr


def test_a_root_that_is_a_log_is_refused_and_nothing_is_written_into_it(tmp_path):
    log = tmp_path / "orders"
    make_log(log)
    before = sorted(os.listdir(log))
    for mode in ("--once", "--check"):
        done = cleaner("--root", log, mode)
        assert done.returncode == 2, done.stderr
        assert f"{log} is itself a log (it has a meta file)" in done.stderr
        assert f"--log {log}" in done.stderr  # what to do instead
    assert sorted(os.listdir(log)) == before


def test_a_state_file_inside_a_log_is_refused(tmp_path):
    log = tmp_path / "orders"
    make_log(log)
    before = sorted(os.listdir(log))
    done = cleaner("--log", log, "--state-file", log / "state.json", "--once")
    assert done.returncode == 2, done.stderr
    assert "never writes into a log directory" in done.stderr
    assert sorted(os.listdir(log)) == before


def test_a_root_holding_no_log_fails_once_and_warns_at_check(tmp_path):
    root = tmp_path / "root"
    (root / "not-a-log").mkdir(parents=True)
    done = cleaner("--root", root, "--once")
    assert done.returncode == 2, done.stderr
    assert f"{root} holds no log (1 entries, none a log directory" in done.stderr
    checked = cleaner("--root", root, "--check")  # a service picks up logs created later
    assert checked.returncode == 0, checked.stderr
    assert "warning:" in checked.stderr and "holds no log" in checked.stderr
