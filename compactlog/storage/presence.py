"""Whether a live writer has the log open: what a reader asks before it trusts the head
in ``.lock`` (``head.vouched``; docs/format.md, section 10.2).

The head in ``.lock`` is never fsynced. While a writer lives, it is the truth (each writer
keeps it in step with the data under the writers' lock); once no writer lives, it is only
what the page cache held when the last one stopped, and after unsynced data was lost
without a reboot (a FUSE daemon that died, an NFS server with async exports that
restarted, a volume detached from a running machine) it may be older or newer than the
data. So a reader trusts it only while a writer that could vouch for it is registered.

Every writable open already holds ``.writers.lock`` (a shared ``flock``, ``head.py``);
an ``flock`` cannot be asked about without taking it, and taking it, even for a moment,
would make a writer's non-blocking registration fail. So each writer also holds an
open-file-description record lock (``F_OFD_SETLK``, a read lock on byte 0) on the same
descriptor, which the kernel drops with the descriptor (a ``kill -9`` included), and a
reader asks ``F_OFD_GETLK``, which takes nothing. Where the system has no OFD locks, every
head is taken as vouched for (the rule of this version's predecessors).
"""

from __future__ import annotations

import fcntl
import os
import struct

from . import filenames

# struct flock (Linux): l_type, l_whence, l_start, l_len, l_pid, padded to 8 bytes
_FLOCK = struct.Struct("@hhqqi4x")
_GETLK = getattr(fcntl, "F_OFD_GETLK", None)
_SETLK = getattr(fcntl, "F_OFD_SETLK", None)


def mark_present(fd: int) -> None:
    """Mark the writable open holding ``fd`` (its ``.writers.lock``) as a live writer until
    ``fd`` is closed."""
    if _SETLK is None:
        return
    try:
        fcntl.fcntl(fd, _SETLK, _FLOCK.pack(fcntl.F_RDLCK, os.SEEK_SET, 0, 1, 0))
    except OSError:
        # a file system that refuses record locks: its readers' F_OFD_GETLK fails alike and
        # takes every head as vouched for (as before); should only the query work, readers
        # find no writer and scan the data, which is slower and never wrong
        pass


def writer_present(directory: str) -> bool:
    """Whether some process (this one included) has the log in ``directory`` open for
    writing right now. Takes no lock, so it never disturbs a writer's open."""
    if _GETLK is None:
        return True
    try:
        fd = os.open(os.path.join(directory, filenames.WRITERS_LOCK), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        asked = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0)
        answer = fcntl.fcntl(fd, _GETLK, asked)
    except OSError:
        return True  # (a file system without record locks: as before this test existed)
    finally:
        os.close(fd)
    return _FLOCK.unpack(answer)[0] != fcntl.F_UNLCK


def others_present(fd: int) -> bool:
    """Whether a writable open other than the one holding ``fd`` (its ``.writers.lock``,
    marked by :func:`mark_present`) has the log open: a description's own lock never
    conflicts with itself, so only the others' answer."""
    if _GETLK is None:
        return True
    try:
        answer = fcntl.fcntl(fd, _GETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0))
    except OSError:
        return True
    return _FLOCK.unpack(answer)[0] != fcntl.F_UNLCK


__all__ = ["mark_present", "others_present", "writer_present"]
