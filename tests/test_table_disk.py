"""The disk store (``store="disk"``): the same table, a committed offset, restarts that
replay only the tail, rebuilds that say why, and ``kill -9`` while committing."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import compactlog
from compactlog.engine.latest import latest_dict
from compactlog.errors import ConfigError, LogLockedError
from compactlog.table.table import Table

SMALL = {"segment_bytes": 1024, "index_interval_bytes": 128}


def _restored_records(path, state_dir) -> tuple[dict, int]:
    seen = []
    with Table(path, store="disk", state_dir=state_dir, follow=False, progress=seen.append) as t:
        state = dict(t)
    return state, (seen[-1].records if seen else 0)


def test_a_disk_table_reads_like_a_memory_table(tmp_path):
    with compactlog.open(tmp_path / "log") as log:
        log.append_batch([(b"b", b"1"), (b"a", b"1"), (b"c", b"1"), (b"b", b"2")])
        log.append(b"c", None)
        with log.table(store="disk", state_dir=tmp_path / "state", value_deserializer=int) as t:
            assert dict(t) == {b"a": 1, b"b": 2}
            assert len(t) == 2 and b"a" in t and b"c" not in t and t.get(b"c") is None
            assert list(t.items(prefix=b"b")) == [(b"b", 2)]
            assert list(t.items(b"a", b"b")) == [(b"a", 1)]
            changes = []
            t.on_change(lambda *change: changes.append(change))
            offset = log.append(b"a", b"7")
            t.wait_for(offset, timeout=5)
            assert t[b"a"] == 7 and changes == [(b"a", 1, 7, offset)]


def test_a_restart_replays_only_what_was_appended_since(tmp_path):
    state_dir = tmp_path / "state"
    with compactlog.open(tmp_path / "log") as log:
        log.append_batch([(b"k%d" % i, b"v") for i in range(500)])
        assert _restored_records(log.path, state_dir)[1] == 500
        log.append_batch([(b"k%d" % i, b"w") for i in range(10)])
        state, replayed = _restored_records(log.path, state_dir)
        assert replayed == 10
        assert state == latest_dict(log)
        assert _restored_records(log.path, state_dir)[1] == 0


def test_retention_past_the_committed_offset_rebuilds_and_says_so(tmp_path, caplog):
    state_dir = tmp_path / "state"
    with compactlog.open(tmp_path / "log", cleanup_policy="compact,delete", **SMALL) as log:
        log.append(b"old", b"1")
        _restored_records(log.path, state_dir)
        log.append_batch([(b"k%d" % i, b"v" * 60) for i in range(40)])
        log.append(b"roll", b"x" * 1000)
        log.enforce_retention(now_ms=1 << 50)
        state, _ = _restored_records(log.path, state_dir)
        assert "retention removed offsets 1..40" in caplog.text
        assert state == latest_dict(log) == {b"roll": b"x" * 1000}


def test_a_recreated_log_rebuilds_and_says_so(tmp_path, caplog):
    state_dir = tmp_path / "state"
    with compactlog.open(tmp_path / "log") as log:
        log.append_batch([(b"a%d" % i, b"1") for i in range(20)])
    _restored_records(tmp_path / "log", state_dir)
    shutil.rmtree(tmp_path / "log")
    with compactlog.open(tmp_path / "log") as log:
        log.append_batch([(b"b%d" % i, b"2") for i in range(30)])
    state, _ = _restored_records(tmp_path / "log", state_dir)
    assert "rebuilding the table" in caplog.text
    assert state == {b"b%d" % i: b"2" for i in range(30)}


def test_one_table_per_state_directory(tmp_path):
    with (
        compactlog.open(tmp_path / "log") as log,
        log.table(store="disk", state_dir=tmp_path / "state"),
        pytest.raises(LogLockedError, match=f"pid {os.getpid()}"),
    ):
        log.table(store="disk", state_dir=tmp_path / "state")


def test_disk_options_are_checked(tmp_path):
    with compactlog.open(tmp_path / "log") as log:
        with pytest.raises(ConfigError, match="state_dir"):
            log.table(store="disk")
        with pytest.raises(ConfigError, match="key_deserializer"):
            log.table(store="disk", state_dir=tmp_path / "s", key_deserializer=bytes.decode)
        with pytest.raises(ConfigError, match="'memory' or 'disk'"):
            log.table(store="rocks")


FOLLOWER = """
import sys, compactlog
table = compactlog.Table(sys.argv[1], store="disk", state_dir=sys.argv[2])
print("ready", flush=True)
sys.stdin.read()
"""


def test_kill_9_while_the_table_commits_then_a_correct_restart(tmp_path):
    """A process follows a log into a disk table while this one appends as fast as it can
    (each poll is one commit); it is killed with SIGKILL at several moments. Every restart
    gives exactly the log's latest state."""
    state_dir = tmp_path / "state"
    with compactlog.open(tmp_path / "log") as log:
        log.append(b"seed", b"0")
        for round_ in range(4):
            child = subprocess.Popen(
                [sys.executable, "-c", FOLLOWER, log.path, str(state_dir)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            assert child.stdout is not None and child.stdout.readline() == b"ready\n"
            deadline = time.monotonic() + 0.2 + 0.1 * round_
            i = 0
            while time.monotonic() < deadline:
                log.append_batch(
                    [(b"k%d" % ((i + j) % 300), b"%d-%d" % (round_, i)) for j in range(5)]
                )
                if i % 7 == 0:
                    log.append(b"k%d" % (i % 300), None)
                i += 1
            child.send_signal(signal.SIGKILL)
            child.wait()
            state, _ = _restored_records(log.path, state_dir)
            assert state == latest_dict(log)
