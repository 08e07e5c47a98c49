"""Lock files: an ``flock`` the kernel drops with its process (so ``kill -9`` never leaves
a lock behind), stamped ``pid N`` by its holder so that a refusal can name it; who holds
one (``/proc/locks``); whether a pid is alive.

Used by ``.cleaner.lock`` (``Log.cleaner_lock``), ``.writers.lock`` (``head.py``), a
durable subscriber's name lock (``subscriber_names.py``), a disk table's ``table.lock`` and
the cleaner service's root lock.
"""

from __future__ import annotations

import fcntl
import os

from ..errors import LockHeld

HOLDER_BYTES = 64  # a stamp is ``pid N`` and maybe a word: read no more


def lock(path: str, *, wait: bool = False, shared: bool = False, note: str = "") -> int:
    """Open (or create) ``path`` and take its ``flock``; returns the descriptor, whose
    closing releases the lock. Exclusive holders stamp ``pid N`` (and ``note``); a shared
    holder clears a stamp left by a dead exclusive one. Without ``wait``, raises
    :class:`LockHeld` at once when the lock is taken.

    Protocol (each step is safe to crash in: the lock is the ``flock``, which dies with its
    process, never the file's existence):

    1. Open ``path``, creating it if missing.
    2. ``flock``; if it is taken (and not ``wait``): raise :class:`LockHeld` with the
       holder's stamp.
    3. Check that ``path`` still names the file locked: a holder may unlink its lock file
       while holding it (``remove_subscriber`` does) between our steps 1 and 2, leaving us
       a lock on an orphan that nobody else can find. If so, close it and start again at 1.
    4. Exclusive: write the stamp (a crash leaves a stale stamp in a file nobody holds:
       harmless, the next holder overwrites it); shared: clear a stale exclusive stamp.
    """
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)  # 1.
        try:
            mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
            try:
                fcntl.flock(fd, mode if wait else mode | fcntl.LOCK_NB)  # 2.
            except BlockingIOError:
                raise LockHeld(path, stamp_of(fd)) from None
            if not _names(path, fd):  # 3.
                os.close(fd)
                continue
            if not shared:  # 4.
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"pid {os.getpid()}{f' {note}' if note else ''}\n".encode(), 0)
            elif os.fstat(fd).st_size:
                os.ftruncate(fd, 0)  # left by a killed exclusive holder (it is gone: we hold it)
        except BaseException:
            os.close(fd)
            raise
        return fd


def _names(path: str, fd: int) -> bool:
    """Whether ``path`` is (still) the file open as ``fd``."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (named.st_ino, named.st_dev) == (opened.st_ino, opened.st_dev)


def release(fd: int, *, clear: bool = False) -> None:
    """Drop the lock and close ``fd``; ``clear`` removes the stamp first (no stale pid for
    the next refusal to name)."""
    if clear:
        os.ftruncate(fd, 0)
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def stamp_of(fd: int) -> str:
    """What the holder of the lock on ``fd`` wrote (``pid N``), empty if nothing (yet)."""
    return os.pread(fd, HOLDER_BYTES, 0).decode(errors="replace").strip()


def holders(fd: int) -> set[int] | None:
    """Pids that ``/proc/locks`` lists as holding a lock on ``fd``'s file (Linux), without
    touching the lock; ``None`` where ``/proc/locks`` cannot be read."""
    stat = os.fstat(fd)
    try:
        with open("/proc/locks") as handle:
            lines = handle.readlines()
    except OSError:
        return None
    pids: set[int] = set()
    for line in lines:
        fields = line.split()
        if "->" in fields:  # a waiter, not a holder
            continue
        # ``1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF``: the pid precedes the file
        for i, item in enumerate(fields):
            if item.count(":") == 2 and i > 0 and fields[i - 1].lstrip("-").isdigit():
                major, minor, inode = item.split(":")
                try:
                    device = os.makedev(int(major, 16), int(minor, 16))
                    if int(inode) == stat.st_ino and device == stat.st_dev:
                        pids.add(int(fields[i - 1]))
                except ValueError:
                    pass
                break
    return pids


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (another user's live process counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


__all__ = ["LockHeld", "holders", "lock", "pid_alive", "release", "stamp_of"]
