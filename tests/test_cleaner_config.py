"""The service's configuration: a bad setting is refused with its key and where it came from
(file, environment variable or flag); the file, the environment and flags stack in that order."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from compactlog.cleaner.config import (
    CleanerConfigError,
    ServiceConfig,
    from_environment,
    load_file,
    parse_size,
)
from compactlog.cleaner.main import load_config, parse_args, run


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cleaner.toml"
    path.write_text(text)
    return path


def error_of(tmp_path: Path, text: str) -> CleanerConfigError:
    path = write(tmp_path, text)
    with pytest.raises(CleanerConfigError) as caught:
        load_file(str(path))
    assert str(path) in str(caught.value)  # every message names the file
    return caught.value


def test_a_full_file_is_read_with_relative_paths_resolved_against_it(tmp_path):
    (tmp_path / "logs").mkdir()
    path = write(
        tmp_path,
        """
        roots = ["logs"]
        logs = ["/srv/one"]
        workers = 3
        state_file = "state.json"
        log_format = "json"
        [schedule]
        interval_seconds = 2.5
        misfire_grace_seconds = 5
        forced_cron = "0 3 * * *"
        retention_cron = "15 * * * *"
        grace_seconds = 4
        [throttle]
        io_bytes_per_second = 1_000_000
        [metrics]
        address = "0.0.0.0"
        port = 9100
        [backoff]
        initial_seconds = 1
        max_seconds = 60
        [[override]]
        match = "orders-*"
        min_cleanable_dirty_ratio = 0.2
        max_compaction_lag_ms = 60000
        """,
    )
    config = load_file(str(path))
    assert config.roots == (str(tmp_path / "logs"),)
    assert config.logs == ("/srv/one",)
    assert config.workers == 3 and config.interval_seconds == 2.5
    assert config.state_path == str(tmp_path / "state.json")
    assert config.forced_cron == "0 3 * * *" and config.retention_cron == "15 * * * *"
    assert config.io_bytes_per_second == 1_000_000
    assert (config.metrics_address, config.metrics_port) == ("0.0.0.0", 9100)
    assert config.overrides_for("orders-eu", "/x/orders-eu") == {
        "min_cleanable_dirty_ratio": 0.2,
        "max_compaction_lag_ms": 60000,
    }
    assert config.overrides_for("users", "/x/users") == {}


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ("workers = 0", "workers", "at least 1"),
        ("workers = 'two'", "workers", "integer"),
        ("colour = 1", "colour", "unknown key"),
        ("[schedule]\ninterval_seconds = -1", "schedule.interval_seconds", "positive"),
        ("[schedule]\nevery = 3", "schedule.every", "unknown key"),
        ("[schedule]\nforced_cron = 'at night'", "schedule.forced_cron", "crontab"),
        ("[metrics]\nport = 70000", "metrics.port", "65535"),
        ("[metrics]\nenabled = 'yes'", "metrics.enabled", "true or false"),
        ("[throttle]\nio_bytes_per_second = -5", "throttle.io_bytes_per_second", "at least 0"),
        ("roots = '/one/path'", "roots", "list"),
        ("log_format = 'xml'", "log_format", "'text' or 'json'"),
        ("[backoff]\ninitial_seconds = 10\nmax_seconds = 5", "backoff.max_seconds", "below"),
        ("[[override]]\nmin_cleanable_dirty_ratio = 0.1", "override[0].match", "glob"),
        (
            "[[override]]\nmatch = 'a*'\nsegment_bytes = 4096",
            "override[0].segment_bytes",
            "allowed",
        ),
        (
            "[[override]]\nmatch = 'a*'\nmin_cleanable_dirty_ratio = 7",
            "override[0].min_cleanable_dirty_ratio",
            "[0, 1]",
        ),
        ("roots = [", "(syntax)", "TOML"),
    ],
)
def test_a_bad_setting_names_its_key_and_the_file(tmp_path, text, key, words):
    error = error_of(tmp_path, text)
    assert error.key == key
    assert words in str(error)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(CleanerConfigError, match="no such file") as caught:
        load_file(str(tmp_path / "nope.toml"))
    assert "nope.toml" in str(caught.value)


def test_environment_overrides_the_file_and_names_the_variable(tmp_path):
    base = ServiceConfig(roots=("/a",), workers=1, source="file.toml")
    config = from_environment(
        base,
        {
            "COMPACTLOG_CLEANER_ROOTS": "/x:/y",
            "COMPACTLOG_CLEANER_WORKERS": "4",
            "COMPACTLOG_CLEANER_IO_BYTES_PER_SECOND": "8MB",
            "COMPACTLOG_CLEANER_METRICS_ENABLED": "false",
        },
    )
    assert config.roots == ("/x", "/y") and config.workers == 4
    assert config.io_bytes_per_second == 8_000_000 and config.metrics_enabled is False
    with pytest.raises(CleanerConfigError, match="COMPACTLOG_CLEANER_WORKERS") as caught:
        from_environment(base, {"COMPACTLOG_CLEANER_WORKERS": "many"})
    assert caught.value.source == "environment"


def test_flags_override_environment_and_file(tmp_path, monkeypatch):
    (tmp_path / "r1").mkdir()
    (tmp_path / "r2").mkdir()
    path = write(
        tmp_path, f'roots = ["{tmp_path / "r1"}"]\nworkers = 1\n[schedule]\ninterval_seconds = 9'
    )
    monkeypatch.setenv("COMPACTLOG_CLEANER_WORKERS", "2")
    monkeypatch.setenv("COMPACTLOG_CLEANER_INTERVAL", "7")
    args = parse_args(["--config", str(path), "--interval", "0.5", "--root", str(tmp_path / "r2")])
    config = load_config(args)
    assert config.roots == (str(tmp_path / "r2"),)  # flag
    assert config.workers == 2  # environment
    assert config.interval_seconds == 0.5  # flag


def test_a_bad_flag_value_names_the_flag(tmp_path):
    args = parse_args(["--root", str(tmp_path), "--workers", "0"])
    with pytest.raises(CleanerConfigError, match="--workers"):
        load_config(args, environ={})


def test_no_root_and_no_log_is_refused():
    with pytest.raises(CleanerConfigError, match="nothing to clean"):
        load_config(parse_args([]), environ={})


def test_a_root_that_is_not_a_directory_is_refused(tmp_path):
    with pytest.raises(CleanerConfigError, match="not a directory"):
        load_config(parse_args(["--root", str(tmp_path / "missing")]), environ={})


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1000", 1000), ("50MB", 50_000_000), ("4MiB", 4 << 20), ("2.5kb", 2500), ("1_000", 1000)],
)
def test_sizes_accept_units(text, expected):
    assert parse_size(text) == expected


def test_check_exits_0_on_a_good_file_and_2_naming_the_key_on_a_bad_one(tmp_path, capsys):
    good = write(tmp_path, f'roots = ["{tmp_path}"]')
    assert run(["--config", str(good), "--check"]) == 0
    assert "configuration OK" in capsys.readouterr().out
    bad = tmp_path / "bad.toml"
    bad.write_text(f'roots = ["{tmp_path}"]\n[metrics]\nport = "http"')
    assert run(["--config", str(bad), "--check"]) == 2
    err = capsys.readouterr().err
    assert "metrics.port" in err and str(bad) in err


def test_the_console_script_checks_a_config(tmp_path):
    good = write(tmp_path, f'roots = ["{tmp_path}"]')
    script = Path(sys.executable).with_name("compactlog-cleaner")
    done = subprocess.run(
        [str(script), "--config", str(good), "--check"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "configuration OK" in done.stdout


def test_explicit_logs_without_a_root_need_a_state_file(tmp_path):
    with pytest.raises(CleanerConfigError, match="state_file"):
        load_config(parse_args(["--log", str(tmp_path)]), environ={})
    config = load_config(
        parse_args(["--log", str(tmp_path), "--state-file", str(tmp_path / "s.json")]), environ={}
    )
    assert config.state_path == str(tmp_path / "s.json")
