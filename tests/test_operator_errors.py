"""Errors that say what to do (issue 18, item 5; the Spark ones are in
``tests/spark/test_spark_errors.py``), with the installed CLI and daemon run as an operator
runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import compactlog

BIN = Path(sys.executable).parent


def run(program: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTLOG_CLEANER_")}
    return subprocess.run(
        [str(BIN / program), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**environ, **(env or {})},
    )


# -- the cleaner service's configuration ---------------------------------------------------


def test_the_cleaners_configuration_reports_every_problem_at_once_with_suggestions(tmp_path):
    config = tmp_path / "cleaner.toml"
    config.write_text(
        'root = ["logs"]\nworkers = 0\n[schedule]\ninterval_second = 3\n'
        '[[override]]\nmatch = "*"\nmin_cleanable_dirty_ration = 0.2\n'
    )
    done = run(
        "compactlog-cleaner",
        "--config",
        str(config),
        "--check",
        env={"COMPACTLOG_CLEANER_WORKRS": "3"},
    )
    assert done.returncode == 2
    err = done.stderr
    assert "5 problems" in err
    assert f"{config}: root: unknown key" in err and "did you mean roots?" in err
    assert (
        "schedule.interval_second: unknown key" in err and "did you mean interval_seconds?" in err
    )
    assert f"{config}: workers: must be at least 1, not 0" in err
    assert "override[0].min_cleanable_dirty_ration" in err
    assert "did you mean min_cleanable_dirty_ratio?" in err
    assert "environment variable COMPACTLOG_CLEANER_WORKRS: unknown variable" in err
    assert "did you mean COMPACTLOG_CLEANER_WORKERS?" in err


def test_an_error_from_a_flag_names_the_flag(tmp_path):
    done = run("compactlog-cleaner", "--root", str(tmp_path / "missing"), "--check")
    assert done.returncode == 2
    assert f"flag --root: {tmp_path / 'missing'} is not a directory" in done.stderr
    assert "defaults" not in done.stderr


def test_once_serves_no_metrics_unless_asked_and_says_one_round(tmp_path):
    compactlog.open(str(tmp_path / "log")).close()  # (a root holding no log fails --once)
    done = run("compactlog-cleaner", "--root", str(tmp_path), "--once")
    assert done.returncode == 0, done.stderr
    (started,) = [line for line in done.stderr.splitlines() if " started: " in line]
    assert "one round" in started and "every" not in started and "metrics off" in started
    asked = run("compactlog-cleaner", "--root", str(tmp_path), "--once", "--metrics-port", "0")
    assert asked.returncode == 0, asked.stderr
    assert "metrics http://127.0.0.1:" in asked.stderr


def test_the_cleaner_says_its_version():
    done = run("compactlog-cleaner", "--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"compactlog-cleaner {compactlog.__version__}"


# -- the library and the CLI ---------------------------------------------------------------


def test_a_misspelled_setting_gets_did_you_mean_in_the_library_and_the_cli(tmp_path):
    with pytest.raises(compactlog.ConfigError, match="did you mean segment_bytes"):
        compactlog.open(str(tmp_path / "log"), segment_byte=4096)
    with compactlog.open(str(tmp_path / "log")):
        pass
    for args in (
        ("config", "set", str(tmp_path / "log"), "segment_byte=64KiB"),
        ("config", "get", str(tmp_path / "log"), "segment_byte"),
        ("create", str(tmp_path / "other"), "-c", "segment_byte=64KiB"),
    ):
        done = run("compactlog", *args)
        assert done.returncode == 2, args
        assert "did you mean segment_bytes?" in done.stderr, args


def test_a_bad_single_append_names_the_log_and_the_key(tmp_path):
    path = str(tmp_path / "log")
    with compactlog.open(path) as log:
        with pytest.raises(compactlog.InvalidRecordError) as caught:
            log.append("k", b"v")
        assert str(caught.value) == f"{path}: key must be bytes, not str"
        assert caught.value.path == path
        with pytest.raises(compactlog.InvalidRecordError, match=f"^{path}: a key of None"):
            log.append(None, b"v")
        with pytest.raises(compactlog.InvalidRecordError, match=f"^{path}: value must be"):
            log.append(b"k", "v")
        with pytest.raises(compactlog.InvalidRecordError, match=f"^{path}: record 1: key must"):
            log.append_batch([(b"a", b"1"), ("b", b"2")])  # a batch still says which record
        assert log.end_offset == 0  # nothing was written


def test_read_with_a_str_offset_raises_our_type_error_naming_the_argument(tmp_path):
    path = str(tmp_path / "log")
    with compactlog.open(path) as log:
        log.append(b"k", b"v")
        with pytest.raises(compactlog.InvalidArgumentError) as caught:
            log.read(start="0")
        assert isinstance(caught.value, TypeError)
        assert str(caught.value) == f"{path}: start must be an int offset or None, not str '0'"
        with pytest.raises(TypeError, match="end must be an int offset"):
            log.read_batches(end=1.5)
        assert [r.key for r in log.read(start=0)] == [b"k"]
