"""A log's settings: stored ones change only on purpose, per-process ones never stick.

Issue 18, item 1: an application's ``open`` once merged its settings into ``meta`` on every
open, silently undoing an operator's ``compactlog config set``. Settings given to ``open``
now apply when it creates the log; on an existing log a differing stored setting is ignored
with a :class:`SettingIgnoredWarning`, and ``update_config=True`` stores changes through the
same ``config.check_change`` as the CLI. The CLI runs as the installed script.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings

import pytest

import compactlog
from compactlog import ConfigError, UnsafeChangeError

from .test_cli import run


def test_an_application_reopen_never_changes_a_setting_the_operator_set(log_dir):
    compactlog.open(log_dir, segment_bytes=64 * 1024).close()
    run("config", "set", log_dir, "segment_bytes=128KiB")
    app = textwrap.dedent(
        """
        import sys, compactlog
        with compactlog.open(sys.argv[1], segment_bytes=64 * 1024) as log:
            log.append(b"k", b"v")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", app, str(log_dir)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert run("config", "get", log_dir, "segment_bytes").stdout.strip() == "131072"
    assert "segment_bytes=65536 ignored: the log stores segment_bytes=131072" in done.stderr


def test_update_config_stores_a_safe_change(log_dir):
    compactlog.open(log_dir, retention_ms=1000).close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with compactlog.open(log_dir, update_config=True, retention_ms=2000) as log:
            assert log.config.retention_ms == 2000
    with compactlog.open(log_dir, read_only=True) as log:
        assert log.config.retention_ms == 2000


def test_update_config_refuses_what_config_set_refuses(log_dir):
    compactlog.open(log_dir).close()
    with pytest.raises(UnsafeChangeError) as raised:
        compactlog.open(log_dir, update_config=True, cleanup_policy="delete")
    cli = run("config", "set", log_dir, "cleanup_policy=delete", check=1)
    assert cli.returncode == 1
    assert cli.stderr.strip() == f"compactlog: error: {raised.value}"
    with compactlog.open(log_dir, read_only=True) as log:
        assert log.config.cleanup_policy == "compact"


def test_update_config_refuses_a_setting_writers_cache_while_another_writer_is_open(log_dir):
    with compactlog.open(log_dir) as writer:
        with pytest.raises(UnsafeChangeError, match="another process has the log open"):
            compactlog.open(log_dir, update_config=True, segment_bytes=8192)
        with compactlog.open(log_dir, update_config=True, retention_ms=5) as log:
            assert log.config.retention_ms == 5  # read afresh by every pass: safe
        assert writer.config.segment_bytes == 64 * 1024 * 1024


def test_per_process_settings_apply_to_this_open_only(log_dir):
    compactlog.open(log_dir).close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # never warned about
        with compactlog.open(log_dir, sync="always", linger_ms=0, batch_records=7) as log:
            assert (log.config.sync, log.config.batch_records) == ("always", 7)
            assert log.writer.config.sync == "always"
            assert log.meta.config.sync == "interval"
    with compactlog.open(log_dir, read_only=True) as log:
        assert (log.config.sync, log.config.batch_records) == ("interval", 1000)  # not stored


def test_per_process_settings_given_at_creation_become_the_defaults(log_dir):
    compactlog.open(log_dir, sync="always", segment_bytes=4096).close()
    meta = json.loads((log_dir / "meta").read_bytes())
    assert (meta["config"]["sync"], meta["config"]["segment_bytes"]) == ("always", 4096)
    with compactlog.open(log_dir) as log:
        assert log.writer.config.sync == "always"


def test_update_config_stores_a_per_process_default(log_dir):
    compactlog.open(log_dir).close()
    compactlog.open(log_dir, update_config=True, sync="os").close()
    with compactlog.open(log_dir) as log:
        assert log.config.sync == "os"  # the default of opens that pass none


def test_per_process_setting_must_fit_the_stored_config(log_dir):
    compactlog.open(log_dir, update_config=True, precommit_bytes=4096).close()
    with pytest.raises(ConfigError, match="linger_ms and precommit_bytes"):
        compactlog.open(log_dir, linger_ms=5)


def test_unknown_and_bad_settings_are_refused_on_reopen_too(log_dir):
    compactlog.open(log_dir).close()
    with pytest.raises(ConfigError, match="segment_byte"):
        compactlog.open(log_dir, segment_byte=4096)
    with pytest.raises(ConfigError, match="segment_bytes must be at least"):
        compactlog.open(log_dir, segment_bytes=1)


def test_read_only_open_with_update_config_is_refused(log_dir):
    compactlog.open(log_dir).close()
    with pytest.raises(ConfigError, match="read_only"):
        compactlog.open(log_dir, read_only=True, update_config=True, retention_ms=5)
