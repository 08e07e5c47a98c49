"""A compaction pass that cannot write (issue 8): ``ENOSPC``, ``EACCES`` and ``EIO`` on
the ``.rw`` rewrite, its fsync, the swap's intent, renames and removes, and the cleaner
checkpoint.

Each fault is injected through the I/O seam (``_fs=``), either once (the rollback itself
works) or until the test lifts it (the rollback fails too and leaves what the next pass or
open resolves). Every case: the pass raises a ``CompactionWriteError`` (``DiskFullError``
for ``ENOSPC``, with the group's bytes and the free bytes) naming the path, never a bare
``OSError``; no ``.rw`` is left once the fault is gone; the log reads every record the
model says it must and takes appends; it is not marked uncleanable; and a later pass
cleans it.
"""

from __future__ import annotations

import errno
import json
import os

import pytest

import compactlog
from compactlog.errors import CompactionWriteError, CompactLogError, DiskFullError
from compactlog.storage import swap
from compactlog.storage.fsio import FileSystem
from compactlog.storage.segment import list_segments, segment_path

from .compaction_helpers import Model, check_log, rewrite_files
from .helpers import FakeClock


class FaultFS(FileSystem):
    """Fails operation ``op`` on paths for which ``hit(path)`` is true with ``code``,
    ``times`` times (``None``: until ``armed`` is cleared)."""

    def __init__(self) -> None:
        self.armed = False
        self.op = ""
        self.code = 0
        self.hit = lambda path: False
        self.times: int | None = 1
        self.failed = 0
        self.paths: dict[int, str] = {}
        self.free: int | None = None

    def arm(self, op, code, hit, times=1):
        self.op, self.code, self.hit, self.times = op, code, hit, times
        self.failed = 0
        self.armed = True

    def _check(self, op: str, path: str | None) -> None:
        if not self.armed or op != self.op or path is None or not self.hit(path):
            return
        if self.times is not None and self.failed >= self.times:
            return
        self.failed += 1
        raise OSError(self.code, os.strerror(self.code), path)

    def open(self, path, flags, mode=0o644):
        self._check("open", path)
        fd = super().open(path, flags, mode)
        self.paths[fd] = path
        return fd

    def write(self, fd, data):
        self._check("write", self.paths.get(fd))
        super().write(fd, data)

    def fsync(self, fd):
        self._check("fsync", self.paths.get(fd))
        super().fsync(fd)

    def rename(self, source, target):
        self._check("rename", source)
        super().rename(source, target)

    def remove(self, path):
        self._check("remove", path)
        super().remove(path)

    def fsync_dir(self, directory):
        self._check("fsync_dir", directory)
        super().fsync_dir(directory)

    def free_bytes(self, directory):
        return self.free if self.free is not None else super().free_bytes(directory)


def _replaced_segment(path: str) -> bool:
    return path.endswith(".log") and not path.endswith("00000000000000000000.log")


ANY = lambda path: True  # noqa: E731
CASES = {
    "open the .log.rw": ("open", errno.EACCES, lambda p: p.endswith(".log.rw")),
    "write the .log.rw (ENOSPC)": ("write", errno.ENOSPC, lambda p: p.endswith(".log.rw")),
    "write the .log.rw (EIO)": ("write", errno.EIO, lambda p: p.endswith(".log.rw")),
    "write the .idx.rw": ("write", errno.ENOSPC, lambda p: p.endswith(".idx.rw")),
    "fsync the .log.rw": ("fsync", errno.EIO, lambda p: p.endswith(".log.rw")),
    "write the swap intent": ("open", errno.ENOSPC, lambda p: swap.SWAP_INTENT in p),
    "rename the .idx.rw": ("rename", errno.EACCES, lambda p: p.endswith(".idx.rw")),
    "rename the .log.rw": ("rename", errno.EIO, lambda p: p.endswith(".log.rw")),
    "remove a replaced segment": ("remove", errno.EIO, _replaced_segment),
    "fsync the directory": ("fsync_dir", errno.EIO, ANY),
    "write the checkpoint": ("open", errno.ENOSPC, lambda p: "cleaner.checkpoint" in p),
}


def _fill(log, model: Model, rounds: int = 12, keys: int = 25, unique: bool = False) -> None:
    """``rounds`` updates of ``keys`` keys (every 11th a tombstone); ``unique``: one key per
    round written only then (its record is never superseded: losing it shows)."""
    n = 0
    for r in range(rounds):
        for k in range(keys):
            n += 1
            value = None if n % 11 == 0 else (b"%d-%d" % (r, k)).ljust(24, b".")
            model.append(log, b"key%03d" % k, value)
        if unique:
            model.append(log, b"only-%d-%d" % (log.end_offset, r), b"once")
    log.flush()


def _open(path, fs):
    return compactlog.open(
        path,
        clock=FakeClock(1_700_000_000_000),
        _fs=fs,
        segment_bytes=1024,
        sync="os",
        segment_ms=None,
        retention_ms=None,
    )


def _compact_until_stable(log) -> None:
    for _ in range(50):
        stats = log.compact(force=True)
        if stats.new_first_dirty_offset >= stats.first_uncleanable_offset:
            return
    raise AssertionError("compaction did not reach the active segment")


@pytest.mark.parametrize("persistent", [False, True], ids=["once", "until-lifted"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_pass_that_cannot_write_rolls_back_and_a_later_pass_succeeds(tmp_path, case, persistent):
    op, code, hit = CASES[case]
    fs = FaultFS()
    model = Model()
    path = tmp_path / "log"
    with _open(path, fs) as log:
        _fill(log, model)
        before = list_segments(log.directory)
        fs.arm(op, code, hit, times=None if persistent else 1)
        fs.free = 12_345
        with pytest.raises(CompactionWriteError) as caught:
            log.compact(force=True)
        assert fs.failed >= 1, "the fault never fired: the case tests nothing"
        fs.armed = False
        fs.free = None  # the space is back (appends check it too)
        error = caught.value
        assert isinstance(error, CompactLogError) and not isinstance(error, OSError)
        assert error.errno == code
        assert error.path and os.path.basename(error.path) in str(error)
        assert "rolled back" in str(error)
        if code == errno.ENOSPC:
            assert isinstance(error, DiskFullError)
            assert error.free_bytes == 12_345 and "12,345 bytes free" in str(error)
            if case != "write the checkpoint":
                assert error.needed_bytes > 0 and "needs up to" in str(error)
        else:
            assert not isinstance(error, DiskFullError)
        if not persistent:
            # the rollback ran with the fault gone: nothing is left half done
            assert rewrite_files(path) == []
            assert not os.path.exists(os.path.join(path, swap.SWAP_INTENT))
        assert not log.reload_meta().uncleanable, "a write failure is not corruption"
        check_log(log, model)  # readable at once, in the same process
        model.append(log, b"after", b"the failure")
        check_log(log, model)
        _compact_until_stable(log)  # the next pass resolves any leftover and cleans
        assert rewrite_files(path) == []
        assert not os.path.exists(os.path.join(path, swap.SWAP_INTENT))
        assert len(list_segments(log.directory)) < len(before)
        check_log(log, model)
    with _open(path, FileSystem()) as log:
        check_log(log, model)


@pytest.mark.parametrize(
    "case", ["rename the .log.rw", "write the swap intent", "fsync the .log.rw"]
)
def test_a_failed_pass_left_to_recovery_loses_nothing(tmp_path, case):
    """The fault outlives the pass and the process: reopening resolves what the rollback
    could not, from the intent and the ``.rw`` files alone."""
    op, code, hit = CASES[case]
    fs = FaultFS()
    model = Model()
    path = tmp_path / "log"
    log = _open(path, fs)
    _fill(log, model)
    fs.arm(op, code, hit, times=None)
    with pytest.raises(CompactionWriteError):
        log.compact(force=True)
    log.close()
    with _open(path, FileSystem()) as log:
        assert rewrite_files(path) == []
        assert not os.path.exists(os.path.join(path, swap.SWAP_INTENT))
        check_log(log, model)
        _compact_until_stable(log)
        check_log(log, model)


def test_an_undo_that_fails_keeps_the_rewrite_its_intent_names(tmp_path):
    """Undoing a swap must not remove the ``.log.rw`` before the intent: were it gone while
    the intent stays, the next resolve would *complete* the swap and remove segments whose
    records the old first segment does not hold. Here the swap fails at its rename and the
    undo fails at its index rebuild: the intent and the ``.log.rw`` must both stay."""

    class RenameThenIndex(FaultFS):
        def rename(self, source, target):
            if self.armed and source.endswith(".log.rw"):
                self.failed += 1
                raise OSError(errno.EIO, "injected", source)
            super().rename(source, target)

    fs = RenameThenIndex()
    model = Model()
    path = tmp_path / "log"
    log = _open(path, fs)
    _fill(log, model)
    # the index rebuild of the undo opens ``<first>.idx`` (not ``.rw``) for writing
    fs.arm("open", errno.ENOSPC, lambda p: p.endswith(".idx"), times=None)
    with pytest.raises(CompactionWriteError) as caught:
        log.compact(force=True)
    assert "could not be resolved now" in str(caught.value)
    assert os.path.exists(os.path.join(path, swap.SWAP_INTENT))
    assert any(name.endswith(".log.rw") for name in rewrite_files(path))
    check_log(log, model)
    log.close()
    with _open(path, FileSystem()) as log:
        assert any("rolled back" in line for line in log.recovery_report), log.recovery_report
        check_log(log, model)


def test_a_corrupt_batch_still_marks_the_log_uncleanable_and_a_full_disk_does_not(tmp_path):
    """The two failures differ on purpose: corruption needs an operator (``repair``); a
    full disk goes away by itself."""
    fs = FaultFS()
    model = Model()
    with _open(tmp_path / "log", fs) as log:
        _fill(log, model)
        fs.arm("write", errno.ENOSPC, lambda p: p.endswith(".log.rw"))
        with pytest.raises(DiskFullError) as caught:
            log.compact(force=True)
        assert caught.value.stats is not None and not caught.value.stats.cleaned
        assert not log.reload_meta().uncleanable
        stats = log.compact(force=True)
        assert stats.cleaned and not stats.uncleanable


def test_a_read_that_fails_raises_a_compaction_error_and_changes_nothing(tmp_path, monkeypatch):
    """Reads do not go through the I/O seam: the segment reader is made to fail instead."""
    from compactlog.compaction import cleaner
    from compactlog.errors import CompactionError

    model = Model()
    with _open(tmp_path / "log", FileSystem()) as log:
        _fill(log, model)
        before = list_segments(log.directory)
        real = cleaner._batches

        def failing(directory, base):
            raise OSError(errno.EIO, "Input/output error", segment_path(directory, base))
            yield from real(directory, base)

        monkeypatch.setattr(cleaner, "_batches", failing)
        with pytest.raises(CompactionError) as caught:
            log.compact(force=True)
        monkeypatch.setattr(cleaner, "_batches", real)
        error = caught.value
        assert not isinstance(error, OSError) and error.operation == "read"
        assert error.errno == errno.EIO and error.path.endswith(".log")
        assert list_segments(log.directory) == before and rewrite_files(tmp_path / "log") == []
        assert not log.reload_meta().uncleanable
        check_log(log, model)
        _compact_until_stable(log)
        check_log(log, model)


UNDO_KILLER = r"""
import errno, os, signal, sys
import compactlog
from compactlog.storage import swap
from compactlog.storage.fsio import FileSystem

point = sys.argv[2]

class FailThenDie(FileSystem):
    # the swap's rename of the .log.rw fails (EIO), so the pass undoes the swap; the
    # process then dies by SIGKILL at the chosen step of the undo
    def rename(self, source, target):
        if source.endswith(".log.rw"):
            raise OSError(errno.EIO, "injected", source)
        super().rename(source, target)

    def remove(self, path):
        if point == "before-intent-removal" and path.endswith(swap.SWAP_INTENT):
            os.kill(os.getpid(), signal.SIGKILL)
        if point == "before-rw-removal" and path.endswith(".log.rw"):
            os.kill(os.getpid(), signal.SIGKILL)
        super().remove(path)

log = compactlog.open(sys.argv[1], _fs=FailThenDie())
log.compact(force=True)
sys.exit(3)  # not reached: the undo dies first
"""


@pytest.mark.parametrize("point", ["before-intent-removal", "before-rw-removal"])
def test_kill_9_during_the_undo_of_a_failed_swap_loses_nothing(tmp_path, point):
    """A real ``kill -9`` at each step of the undo (``swap.resolve_interrupted_swap``): the
    reopened log holds every record, whichever step the cleaner died at."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    model = Model()
    path = tmp_path / "log"
    with _open(path, FileSystem()) as log:
        _fill(log, model, unique=True)
        log.compact(force=True)  # small cleaned segments: the next pass groups several
        _fill(log, model)
    repo = Path(__file__).resolve().parents[1]
    child = subprocess.run(
        [sys.executable, "-c", UNDO_KILLER, str(path), point],
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
        capture_output=True,
        timeout=60,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()
    if point == "before-intent-removal":
        with open(os.path.join(path, swap.SWAP_INTENT)) as handle:
            assert json.load(handle)["others"], "the undone group must span several segments"
    with _open(path, FileSystem()) as log:
        assert rewrite_files(path) == []
        assert not os.path.exists(os.path.join(path, swap.SWAP_INTENT))
        check_log(log, model)
        _compact_until_stable(log)
        check_log(log, model)
