"""A log's identity: a random id in ``meta`` (``log_id``), written when the log is created.

What it is for: state kept outside the log (a disk table's LMDB, ``table_identity.py``)
names the log it was built from, so the same state directory used with another log is
rebuilt or refused, never mixed with it. The id follows the log's *contents*: a snapshot
copies ``meta`` (same id: the same records at the same offsets), ``repair`` keeps it, and
a log written anew (``open(create=True)``, Spark's writer) gets a new one.

A log made before ids existed gets one from its next writable open (``Log``, under the
writers' lock) or from the first disk table that needs it (:func:`ensure_log_id`, which
takes that lock for the moment of the write). Adding the id is not a settings change
(design invariant 8): only the ``log_id`` field is added to ``meta``, every stored setting
stays as it was (:func:`compactlog.state_files.add_log_id`, one atomic write).
"""

from __future__ import annotations

import os
import time
import uuid

from . import filenames
from .fsio import DEFAULT_FS, FileSystem
from .head import try_lock_exclusive
from .state_files import add_log_id, read_meta


def new_log_id() -> str:
    """A fresh id: 128 random bits, as 32 hex digits."""
    return uuid.uuid4().hex


LOCK_WAIT_S = 2.0  # how long ensure_log_id waits for the writers' lock


def ensure_log_id(directory: str, fs: FileSystem = DEFAULT_FS) -> str | None:
    """The log's id, added first if it has none (taking the writers' lock for it).
    ``None`` when it cannot be added now: a read-only file system, no permission, or the
    writers' lock held for longer than ``LOCK_WAIT_S``."""
    present = read_meta(directory).log_id
    if present is not None:
        return present
    try:
        fd = os.open(
            os.path.join(directory, filenames.WRITER_LOCK),
            os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
            0o644,
        )
    except OSError:
        return None
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        while not try_lock_exclusive(fd):
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.01)
        return add_log_id(fs, directory, new_log_id())
    except OSError:
        return None
    finally:
        os.close(fd)  # releases the lock


__all__ = ["LOCK_WAIT_S", "ensure_log_id", "new_log_id"]
