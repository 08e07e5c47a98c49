"""The archiver never makes a cleaning pass fail: its capture holds ``.cleaner.lock`` as a
*brief* holder, and a pass that meets a brief holder waits for it (``CleanerLock``) where
it is refused at once by any other holder."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import compactlog
from compactlog.errors import LogLockedError
from compactlog.storage import cleaner_lock as cleaner_lock_module

REPO = Path(__file__).resolve().parents[2]


def dirty_log(path: Path) -> compactlog.Log:
    log = compactlog.open(path, segment_bytes=4096, min_compaction_lag_ms=0)
    for round_ in range(5):
        log.append_batch([(b"k%03d" % k, b"v%d" % round_) for k in range(200)])
    log.flush()
    return log


def hold(log: compactlog.Log, seconds: float, *, brief: bool) -> threading.Thread:
    """A thread holding the cleaner lock for ``seconds``; returns once it holds it."""
    taken = threading.Event()

    def run() -> None:
        with log.cleaner_lock(brief=brief):
            taken.set()
            time.sleep(seconds)

    thread = threading.Thread(target=run)
    thread.start()
    assert taken.wait(10)
    return thread


def test_a_pass_waits_for_a_brief_holder_instead_of_failing(tmp_path):
    with dirty_log(tmp_path / "log") as log:
        holder = hold(log, 0.3, brief=True)
        started = time.monotonic()
        stats = log.compact(force=True)
        waited = time.monotonic() - started
        holder.join()
        assert stats.cleaned
        assert waited >= 0.2  # it waited for the holder rather than running beside it


def test_a_pass_is_refused_at_once_by_any_other_holder(tmp_path):
    with dirty_log(tmp_path / "log") as log:
        holder = hold(log, 1.0, brief=False)
        started = time.monotonic()
        with pytest.raises(LogLockedError, match=f"another cleaner.*pid {os.getpid()}"):
            log.compact(force=True)
        assert time.monotonic() - started < 0.5
        holder.join()


def test_a_brief_holder_that_stays_is_named_once_patience_runs_out(tmp_path, monkeypatch):
    monkeypatch.setattr(cleaner_lock_module, "BRIEF_PATIENCE_S", 0.2)
    with dirty_log(tmp_path / "log") as log:
        holder = hold(log, 1.0, brief=True)
        with pytest.raises(LogLockedError, match=f"pid {os.getpid()} brief"):
            log.compact(force=True)
        holder.join()


ARCHIVER = textwrap.dedent(
    """
    import sys, time
    import compactlog
    from compactlog.archive import open_store
    from compactlog.archive.push import Archiver
    from compactlog.errors import LogLockedError

    path, url, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    with compactlog.open(path, read_only=True) as log:
        archiver = Archiver(log, open_store(url))
        archiver.start()
        rounds, deadline = 0, time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                archiver.push()
            except LogLockedError:  # a pass held the lock for over a second: as archive
                continue            # run does, the next round tries again
            rounds += 1
        archiver.stop()
    print(rounds)
    """
)


def test_compaction_beside_a_busy_archiver_never_fails(tmp_path):
    """Real processes: an archiver pushing round after round (each capture takes the
    cleaner lock) while this process appends and compacts over and over. The archiver
    may find a pass running and skip a round; a pass must never fail."""
    path = tmp_path / "log"
    log = dirty_log(path)
    archiver = subprocess.Popen(
        [sys.executable, "-c", ARCHIVER, str(path), f"file://{tmp_path}/archive", "6"],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    passes = 0
    try:
        with log:
            while archiver.poll() is None:
                log.append_batch([(b"k%03d" % k, b"w%d" % passes) for k in range(200)])
                log.flush()
                log.compact(force=True)  # a LogLockedError here fails the test
                passes += 1
                time.sleep(0.005)  # (a gap between passes, or the archiver may starve)
    finally:
        out, _ = archiver.communicate(timeout=60)
    assert archiver.returncode == 0
    assert passes >= 5 and int(out.strip()) >= 5
