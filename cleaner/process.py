"""The process around the service: one instance per root, signals, the exit path.

A service lock per root (``<root>/.compactlog-cleaner.lock``, an ``flock`` the kernel drops
with the process, so ``kill -9`` never leaves a root locked) keeps a second service off the
same root; the file holds the owner's pid so the refusal names it. Logs given by path
only are locked through the state file's own lock file. The per-log ``.cleaner.lock`` is a
separate lock, shared with ``Log.compact()`` and the CLI.

SIGTERM and SIGINT set the stop event: the scheduler takes no new work, running passes
see ``should_abort`` at their next batch (and throttled ones wake at once), and the entry
point waits up to the grace period for them before it exits 0.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType

from compactlog.storage import lockfile

from .config import SERVICE_LOCK_NAME


class AlreadyRunningError(Exception):
    """Another service holds the lock of a root."""

    def __init__(self, path: str, holder: str) -> None:
        self.path = path
        self.holder = holder
        super().__init__(
            f"another compactlog-cleaner ({holder}) is already running on {os.path.dirname(path)}"
            f" (service lock {path})"
        )


class ServiceLock:
    """An exclusive, non-blocking ``flock`` on one lock file, held until :meth:`release`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = -1

    def acquire(self) -> None:
        try:
            self.fd = lockfile.lock(self.path)
        except lockfile.LockHeld as held:
            raise AlreadyRunningError(self.path, held.holder or "unknown pid") from None

    def release(self) -> None:
        if self.fd >= 0:
            lockfile.release(self.fd)
            self.fd = -1


def lock_paths(roots: tuple[str, ...], state_path: str) -> list[str]:
    """One lock per root; without roots, one beside the state file."""
    if roots:
        return [os.path.join(root, SERVICE_LOCK_NAME) for root in roots]
    return [state_path + ".lock"]


def acquire_all(paths: list[str]) -> list[ServiceLock]:
    """Take every lock or none (a refusal releases what was taken)."""
    held: list[ServiceLock] = []
    try:
        for path in paths:
            lock = ServiceLock(path)
            lock.acquire()
            held.append(lock)
    except BaseException:
        for lock in held:
            lock.release()
        raise
    return held


def install_signal_handlers(stop: threading.Event) -> None:
    """SIGTERM and SIGINT set ``stop`` (call from the main thread)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
