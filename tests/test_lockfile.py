"""storage/lockfile.py: the one lock-file routine (flock + pid stamp), its holders and
pid_alive, used by the cleaner lock, ``.writers.lock``, a disk table and the service."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from compactlog.storage import lockfile


def test_a_lock_is_stamped_and_a_second_taker_is_refused_naming_the_holder(tmp_path):
    path = str(tmp_path / "x.lock")
    fd = lockfile.lock(path)
    try:
        assert lockfile.stamp_of(fd) == f"pid {os.getpid()}"
        with pytest.raises(lockfile.LockHeld) as held:
            lockfile.lock(path)  # another open file description: refused
        assert held.value.holder == f"pid {os.getpid()}"
    finally:
        lockfile.release(fd)
    lockfile.release(lockfile.lock(path))  # free again


def test_a_note_follows_the_pid_and_clear_removes_the_stamp(tmp_path):
    path = str(tmp_path / "x.lock")
    fd = lockfile.lock(path, note="exclusive")
    assert lockfile.stamp_of(fd) == f"pid {os.getpid()} exclusive"
    lockfile.release(fd, clear=True)
    assert os.path.getsize(path) == 0


def test_shared_holders_coexist_and_clear_a_dead_exclusive_stamp(tmp_path):
    path = str(tmp_path / "x.lock")
    with open(path, "w") as handle:
        handle.write("pid 1 exclusive\n")  # left by a killed exclusive holder
    first = lockfile.lock(path, shared=True)
    second = lockfile.lock(path, shared=True)
    assert os.path.getsize(path) == 0
    with pytest.raises(lockfile.LockHeld):
        lockfile.lock(path)
    lockfile.release(first)
    lockfile.release(second)


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="Linux /proc/locks")
def test_holders_names_the_process_holding_the_lock(tmp_path):
    path = str(tmp_path / "x.lock")
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from compactlog.storage import lockfile; lockfile.lock(sys.argv[1]); "
            "print('held', flush=True); sys.stdin.read()",
            path,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "held\n"
        fd = os.open(path, os.O_RDONLY)
        try:
            assert lockfile.holders(fd) == {child.pid}
        finally:
            os.close(fd)
    finally:
        child.communicate("", timeout=60)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert lockfile.holders(fd) == set()  # gone with its process
    finally:
        os.close(fd)


def test_pid_alive():
    assert lockfile.pid_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=60)
    assert not lockfile.pid_alive(child.pid)


def test_a_lock_file_unlinked_before_its_flock_is_opened_again(tmp_path, monkeypatch):
    """A holder may unlink its lock file while holding it (``remove_subscriber``): a taker
    that opened the file just before must not end up holding a lock on the orphan."""
    path = str(tmp_path / "x.lock")
    real_flock = lockfile.fcntl.flock
    unlinked = []

    def flock(fd: int, operation: int) -> None:
        if not unlinked:  # the holder removes the file between our open and our flock
            os.unlink(path)
            unlinked.append(True)
        real_flock(fd, operation)

    monkeypatch.setattr(lockfile.fcntl, "flock", flock)
    fd = lockfile.lock(path)
    monkeypatch.undo()
    try:
        assert unlinked
        assert os.fstat(fd).st_ino == os.stat(path).st_ino  # the file the path names
        with pytest.raises(lockfile.LockHeld):
            lockfile.lock(path)
    finally:
        lockfile.release(fd)


def test_a_file_system_that_refuses_record_locks_still_opens_for_writing(tmp_path, monkeypatch):
    """``presence.mark_present`` on a file system without OFD locks: the writable open goes
    on (readers there take the head as vouched for, or scan), it is no error."""
    import fcntl

    import compactlog
    from compactlog.storage import presence

    real = fcntl.fcntl

    def refusing(fd, command, *args):
        if command == presence._SETLK:
            raise OSError(38, "Function not implemented")
        return real(fd, command, *args)

    monkeypatch.setattr(presence.fcntl, "fcntl", refusing)
    with compactlog.open(tmp_path / "log") as log:
        log.append(b"k", b"v")
        log.flush()
    with compactlog.open(tmp_path / "log", read_only=True) as view:
        assert [r.value for r in view.read()] == [b"v"]
