"""JLog's precommit buffer: invisible until flushed, survives a dead process, materialized
exactly once."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import compactlog
from compactlog.storage.fsio import FileSystem
from compactlog.storage.head import read_head_file
from compactlog.storage.segment import list_segments

PRECOMMIT = {"precommit_bytes": 8192, "sync": "os", "sync_interval_ms": 3_600_000}


def keys(log):
    return [r.key for r in log.read()]


def test_appends_are_invisible_until_flushed(log_dir):
    with compactlog.open(log_dir, **PRECOMMIT) as log:
        assert [log.append(b"k%d" % i, b"v") for i in range(5)] == [0, 1, 2, 3, 4]
        assert keys(log) == []
        assert log.end_offset == 0
        log.flush()
        assert keys(log) == [b"k%d" % i for i in range(5)]
        assert log.end_offset == 5


def test_close_materializes_the_buffer(log_dir):
    with compactlog.open(log_dir, **PRECOMMIT) as log:
        log.append(b"a", b"1", headers={"h": b"x"})
        log.append(b"b", None, timestamp_ms=42)
    with compactlog.open(log_dir) as log:
        records = list(log.read())
    assert [(r.key, r.value, r.headers) for r in records] == [
        (b"a", b"1", {"h": b"x"}),
        (b"b", None, None),
    ]
    assert records[1].timestamp == 42


def test_a_full_buffer_is_materialized_and_order_is_kept(log_dir):
    with compactlog.open(log_dir, **PRECOMMIT) as log:
        for i in range(300):  # about 20 KB of entries through an 8 KB buffer
            assert log.append(b"key%04d" % i, b"v" * 30) == i
        log.flush()
        assert keys(log) == [b"key%04d" % i for i in range(300)]


def test_batches_and_records_larger_than_the_buffer_keep_their_order(log_dir):
    with compactlog.open(log_dir, **PRECOMMIT) as log:
        log.append(b"a", b"1")
        log.append(b"big", b"x" * 20_000)  # larger than the buffer: written directly
        log.append(b"b", b"2")
        assert log.append_batch([(b"c", b"3"), (b"d", b"4")]) == range(3, 5)
        log.append(b"e", b"5")
        log.flush()
        assert keys(log) == [b"a", b"big", b"b", b"c", b"d", b"e"]


DIE_WITH_PENDING = textwrap.dedent(
    """
    import os, signal, sys
    import compactlog
    log = compactlog.open(sys.argv[1], precommit_bytes=8192, sync="os",
                          sync_interval_ms=3_600_000)
    for i in range(5):
        log.append(b"k%d" % i, b"pending")
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def die_with_pending(log_dir):
    child = subprocess.run(
        [sys.executable, "-c", DIE_WITH_PENDING, str(log_dir)], capture_output=True, timeout=30
    )
    assert child.returncode == -9, child.stderr.decode()
    assert read_head_file(str(log_dir / ".lock"), any_boot=True).precommit_pending


def test_entries_of_a_killed_process_are_materialized_on_open(log_dir):
    die_with_pending(log_dir)
    with compactlog.open(log_dir, read_only=True) as log:
        assert keys(log) == []  # not yet: only a writer materializes
    with compactlog.open(log_dir) as log:
        assert any("materialized 5" in line for line in log.recovery_report)
        assert keys(log) == [b"k%d" % i for i in range(5)]
        assert log.append(b"next", b"x") == 5
    with compactlog.open(log_dir) as log:
        assert keys(log) == [b"k%d" % i for i in range(5)] + [b"next"]


def test_entries_of_a_killed_process_survive_a_repair(log_dir):
    die_with_pending(log_dir)
    compactlog.repair(log_dir)  # resets the head, and with it the pending flag
    with compactlog.open(log_dir) as log:
        assert keys(log) == [b"k%d" % i for i in range(5)]


def test_entries_already_in_the_log_are_not_written_twice(log_dir):
    """Crash after materializing wrote the batch and before it cleared the buffer."""
    with compactlog.open(log_dir, **PRECOMMIT) as log:
        log.append(b"a", b"1")
        log.append(b"b", b"2")
        shutil.copy(log_dir / "pre_commit", log_dir / "saved")
        log.flush()
        log.append(b"c", b"3")
    os.replace(log_dir / "saved", log_dir / "pre_commit")  # the buffer as before the clear
    with compactlog.open(log_dir) as log:
        assert keys(log) == [b"a", b"b", b"c"]
        assert log.append(b"d", b"4") == 3


class Crash(BaseException):
    """Stops a protocol between two steps, as a kill would."""


class CrashOnRoll(FileSystem):
    armed = False

    def open(self, path, flags, mode=0o644):
        if self.armed and path.endswith(".log") and flags & os.O_TRUNC:
            raise Crash
        return super().open(path, flags, mode)


def abandon(log):
    """What a kill -9 leaves: no cleanup, the locks gone with the descriptors."""
    log.writer._stop.set()
    os.close(log.writer.lock_fd)
    log._closed = True


def test_a_death_in_a_segment_roll_during_materializing_keeps_the_pending_entries(log_dir):
    fs = CrashOnRoll()
    log = compactlog.open(log_dir, _fs=fs, segment_bytes=1024, **PRECOMMIT)
    for i in range(3):
        log.append_batch([(b"fill%d" % i, b"x" * 250)])
    for i in range(10):
        log.append(b"k%d" % i, b"y" * 50)
    fs.armed = True
    with pytest.raises(Crash):
        log.flush()  # materializing rolls the segment; the process dies in the roll
    abandon(log)
    with compactlog.open(log_dir) as log:
        assert keys(log)[3:] == [b"k%d" % i for i in range(10)]
        assert len(list_segments(str(log_dir))) >= 2


DIE_WITH_HEADERS = textwrap.dedent(
    """
    import os, signal, sys
    import compactlog
    log = compactlog.open(sys.argv[1], precommit_bytes=8192, sync="os",
                          sync_interval_ms=3_600_000)
    for i in range(6):
        log.append(b"k%d" % i, None if i == 4 else b"v",
                   headers={"n": b"%d" % i} if i % 2 else None)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


@pytest.mark.parametrize("path", ["precommit", "precommit, killed", "linger"])
def test_headers_of_buffered_single_appends_come_back_as_appended(log_dir, path):
    """Records with and without headers (and a tombstone) through each buffered path: the
    precommit buffer's own entries, its entries parsed from the file of a killed process,
    and the linger buffer. They carry the encoded headers (``OneRecord``) to the batch."""
    expected = [
        (b"k%d" % i, None if i == 4 else b"v", {"n": b"%d" % i} if i % 2 else None)
        for i in range(6)
    ]
    if path == "precommit, killed":
        child = subprocess.run(
            [sys.executable, "-c", DIE_WITH_HEADERS, str(log_dir)],
            capture_output=True,
            timeout=30,
        )
        assert child.returncode == -9, child.stderr.decode()
    else:
        settings = PRECOMMIT if path == "precommit" else {"linger_ms": 60_000}
        with compactlog.open(log_dir, **settings) as log:
            for key, value, headers in expected:
                log.append(key, value, headers=headers)
            log.flush()
    with compactlog.open(log_dir) as log:
        assert [(r.key, r.value, r.headers) for r in log.read()] == expected
