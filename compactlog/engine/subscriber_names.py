"""A durable subscriber's name: its rules, its checkpoint, and its lock (one consumer per
name in all processes). The protocol is :func:`acquire_name_lock`'s docstring; the
subscriber's other parts are listed in docs/architecture.md.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import time

from ..errors import SubscriberBusyError, SubscriberError
from ..storage import filenames, lockfile
from ..storage.state_files import read_checkpoint_file, read_meta

logger = logging.getLogger("compactlog.subscriber")

TRANSIENT_PREFIX = "~"
MAX_NAME_BYTES = 255
HOLDER_READ_ATTEMPTS = 20  # a holder that just took the lock writes its pid a moment later


# -- names ---------------------------------------------------------------------------------


def validate_name(name: object) -> str:
    """The name itself if it is a valid subscriber name, else :class:`SubscriberError`."""
    if not isinstance(name, str):
        raise SubscriberError(f"a subscriber name must be a str, not {type(name).__name__}")
    if not name:
        raise SubscriberError("a subscriber name must not be empty")
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError as error:
        raise SubscriberError(f"subscriber name {name!r} is not valid UTF-8 ({error})") from None
    if len(encoded) > MAX_NAME_BYTES:
        raise SubscriberError(
            f"subscriber name is {len(encoded)} bytes in UTF-8; at most {MAX_NAME_BYTES} allowed"
        )
    return name


def is_transient(name: str) -> bool:
    return name.startswith(TRANSIENT_PREFIX)


def load_checkpoint(directory: str, name: str) -> int | None:
    """The committed offset of durable subscriber ``name``, or ``None`` if it has none."""
    file_name = filenames.checkpoint_name(name)
    try:
        stored, offset = read_checkpoint_file(directory, file_name)
    except FileNotFoundError:
        return None
    if stored != name:
        raise SubscriberError(
            f"checkpoint {file_name} belongs to subscriber {stored!r}, not {name!r}",
            path=directory,
        )
    return offset


def log_start(directory: str) -> int:
    """The log start offset as ``meta`` on disk says now (other processes move it)."""
    return read_meta(directory).log_start_offset


# -- one consumer per name ---------------------------------------------------------------


def lock_path(directory: str, name: str) -> str:
    return os.path.join(directory, filenames.subscriber_lock_name(name))


def _pid_in(stamp: str) -> int | None:
    """The pid of a lock file's stamp (``pid N``), ``None`` if it names none."""
    words = stamp.split()
    return int(words[1]) if len(words) >= 2 and words[0] == "pid" and words[1].isdigit() else None


def _read_holder(fd: int) -> int | None:
    """The pid a holder stamped into its lock file, ``None`` if there is none (yet)."""
    for _attempt in range(HOLDER_READ_ATTEMPTS):
        pid = _pid_in(lockfile.stamp_of(fd))
        if pid is not None:
            return pid
        time.sleep(0.001)
    return None


def _holder_of(path: str, stamp: str) -> int | None:
    """The holder's pid from the stamp a refusal read, or, when the holder had not yet
    written it, from the file a moment later."""
    pid = _pid_in(stamp)
    if pid is not None:
        return pid
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        return _read_holder(fd)
    finally:
        os.close(fd)


def _busy(directory: str, name: str, pid: int | None) -> SubscriberBusyError:
    if pid is None:
        who = "another consumer (pid unknown)"
    elif pid == os.getpid():
        who = f"pid {pid} (this process: another Subscriber object or thread)"
    else:
        who = f"pid {pid}"
    return SubscriberBusyError(
        f"subscriber {name!r} is in use by {who}; a durable subscriber has one consumer at "
        "a time: close that one first (its lock goes with its process)",
        subscriber=name,
        pid=pid,
        path=directory,
    )


def acquire_name_lock(directory: str, name: str) -> int:
    """Take durable subscriber ``name``'s lock, ``.cp.<hex(name)>.lock``; return the
    descriptor that holds it.

    Raises :class:`SubscriberBusyError` (naming the holder's pid) when it is held.
    Closing the descriptor releases it, as does the death of the process. The protocol is
    :func:`lockfile.lock`'s (an ``flock`` stamped ``pid N``, safe to crash in at every
    step, and taken again when :func:`remove_subscriber` unlinked the file meanwhile).
    """
    path = lock_path(directory, name)
    try:
        return lockfile.lock(path)
    except lockfile.LockHeld as held:
        raise _busy(directory, name, _holder_of(path, held.holder)) from None


def acquire_or_degrade(directory: str, name: str) -> int:
    """:func:`acquire_name_lock`, except where the lock file cannot be created (a log on a
    read-only file system or directory): such a subscriber cannot commit either, so two of
    them cannot overwrite each other's position; it runs without the lock (a warning says
    so)."""
    try:
        return acquire_name_lock(directory, name)
    except OSError as error:
        if error.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        logger.warning(
            "subscriber %r: cannot create its lock file (%s); running without exclusivity",
            name,
            error.strerror,
        )
        return -1


def name_holder(directory: str, name: str) -> int | None:
    """The pid consuming durable subscriber ``name`` now (0 if its pid is unreadable), or
    ``None`` if nobody is.

    Reads ``/proc/locks`` so that looking never takes the name from a consumer starting
    at that instant; where there is no ``/proc/locks`` it probes with a shared lock taken
    and dropped at once. For display (``compactlog subscribers list``), never for a
    decision: the answer may be stale by the time it is read.
    """
    try:
        fd = os.open(lock_path(directory, name), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        holders = lockfile.holders(fd)
        if holders is not None:
            if not holders:
                return None
            written = _read_holder(fd)
            return written if written in holders else min(holders)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_holder(fd)
            return pid if pid is not None else 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
