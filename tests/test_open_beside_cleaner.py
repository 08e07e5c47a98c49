"""Opening a log for writing while another process cleans it (the cleaner service's normal
case: applications restart while it compacts their logs).

Regression tests for two races found by running exactly that: open-time recovery listed
closed segments while a cleaner swapped them (``FileNotFoundError`` or a false "missing
segment" from recovery), and removed the cleaner's in-progress ``cleaner.checkpoint`` temp
file as if it were stray (the pass then failed to rename it into place).
"""

from __future__ import annotations

import multiprocessing
import os
import time

import compactlog
from compactlog.compaction import compact_log
from compactlog.errors import LogLockedError
from compactlog.storage import filenames

RECORDS = [(b"k%d" % (i % 50), b"v" * 50) for i in range(200)]


def reopen_and_append(path: str, seconds: float, results) -> None:
    opens, errors = 0, []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with compactlog.open(path) as log:
                log.append_batch(RECORDS)
            opens += 1
        except Exception as error:  # every failure is the finding: report, not raise
            errors.append(repr(error))
    results.put((opens, errors))


def test_writers_reopen_while_another_process_cleans_without_errors(tmp_path):
    path = str(tmp_path / "log")
    with compactlog.open(path, segment_bytes=4096, min_cleanable_dirty_ratio=0.01) as log:
        log.append_batch(RECORDS * 10)
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=reopen_and_append, args=(path, 4.0, results), daemon=True)
    child.start()
    passes, pass_errors = 0, []
    with compactlog.open(path, read_only=True) as log:  # as the cleaner service opens it
        while child.is_alive():
            try:
                compact_log(log, force=True)
                passes += 1
            except LogLockedError:
                pass  # the child's recovery held the cleaner lock for a moment
            except Exception as error:
                pass_errors.append(repr(error))
    opens, open_errors = results.get(timeout=30)
    child.join(timeout=30)
    assert open_errors == [] and pass_errors == []
    assert opens > 10 and passes > 10  # the two really overlapped
    with compactlog.open(path, read_only=True) as log:
        assert log.end_offset == 2000 + 200 * opens  # every acknowledged record is there
        latest = {r.key: r.value for r in log.latest()}
    assert latest == dict(RECORDS)


def test_recovery_leaves_a_live_process_temp_file_and_removes_a_dead_one(tmp_path):
    path = tmp_path / "log"
    with compactlog.open(path) as log:
        log.append(b"k", b"v")
    live = filenames.temp_name(filenames.CLEANER_CHECKPOINT)  # this process: alive
    dead_pid = 2**22 + 1  # above the default pid_max: never a live process
    dead = f"{filenames.CLEANER_CHECKPOINT}.{dead_pid}.7.tmp"
    legacy = "meta.tmp"  # no pid in the name: an older version's, removed as before
    for name in (live, dead, legacy):
        (path / name).write_bytes(b"{")
    with compactlog.open(path):
        pass
    assert (path / live).exists()
    assert not (path / dead).exists() and not (path / legacy).exists()
    assert filenames.temp_owner_pid(live) == os.getpid()
    assert filenames.temp_owner_pid("meta.tmp") is None
