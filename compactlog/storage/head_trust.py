"""Which head in ``.lock`` a reader may trust: the one rule of every reader view
(docs/format.md, section 10.2; style.md "A reader trusts only what it can prove").

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

A head that no live writer vouches for is still a fact when the clean-shutdown marker
(fsynced by ``close()`` after the final sync) equals it and the newest segment ends where
it says (:func:`closed_cleanly`). Any other head is a hint: readers then find the end of
the newest segment from the data and its checksums, as recovery does
(``segment.SegmentReader``, ``Log.end_offset``).
"""

from __future__ import annotations

import fcntl
import os
import struct

from . import filenames
from .head import Head, decode_head
from .segment import segment_path

# struct flock (Linux): l_type, l_whence, l_start, l_len, l_pid, padded to 8 bytes
_FLOCK = struct.Struct("@hhqqi4x")
_GETLK = getattr(fcntl, "F_OFD_GETLK", None)
_SETLK = getattr(fcntl, "F_OFD_SETLK", None)


def mark_present(fd: int) -> None:
    """Mark the writable open holding ``fd`` (its ``.writers.lock``) as a live writer until
    ``fd`` is closed."""
    if _SETLK is None:
        return
    fcntl.fcntl(fd, _SETLK, _FLOCK.pack(fcntl.F_RDLCK, os.SEEK_SET, 0, 1, 0))


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


def vouched(directory: str, head: Head) -> bool:
    """Whether a reader may take ``head`` (read under this boot's id) as the truth: a live
    writer stands behind it, or the log was closed cleanly with it."""
    return writer_present(directory) or closed_cleanly(directory, head)


def read_clean_shutdown(directory: str) -> Head | None:
    """The head the clean-shutdown marker holds (``None``: no marker, or unreadable)."""
    try:
        with open(os.path.join(directory, filenames.CLEAN_SHUTDOWN), "rb") as handle:
            return decode_head(handle.read())
    except FileNotFoundError:
        return None


def closed_cleanly(directory: str, head: Head | None) -> bool:
    """Whether the last writer closed the log (its marker matches the head and the newest
    segment ends where the head says): then the head is a fact, not a hint."""
    marker = read_clean_shutdown(directory)
    if marker is None or head is None or marker != head:
        return False
    try:
        return os.path.getsize(segment_path(directory, head.active_base)) == head.active_size
    except FileNotFoundError:
        return False


__all__ = ["closed_cleanly", "mark_present", "read_clean_shutdown", "vouched", "writer_present"]
