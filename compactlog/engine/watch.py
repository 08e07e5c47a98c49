"""Waiting for a log's head to move: inotify on ``.lock`` where it works, else short sleeps.

Subscribers wait here from a thread (:meth:`HeadWatcher.wait`); ``aio.py`` watches the
same descriptor from an event loop. The doorbell byte that asks the next writer to
``pwrite`` the head is ``head.py``'s.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import time
from collections.abc import Callable

from ..storage.head import DOORBELL, SharedBytes, map_lock_file_if_present

SLEEP_MIN_S = 50e-6  # sleep-polling: first sleep between reads of the head ...
SLEEP_MAX_S = 2e-3  # ... doubling up to this
INOTIFY_SAFETY_S = 0.05  # with inotify: re-check the head at least this often
INOTIFY_MISSES = 3  # head moves found by that re-check in a row before falling back to sleeps


class HeadWatcher:
    """Waits for the head in ``.lock`` to change: inotify where it works, else short sleeps.

    :meth:`wait` blocks a thread; ``aio.py`` watches :attr:`fd` from an event loop instead,
    with the same :meth:`ring_for_me` and :meth:`drain`."""

    IN_MODIFY = 0x2
    IN_ATTRIB = 0x4
    IN_CLOSE_WRITE = 0x8

    def __init__(self, lock_path: str) -> None:
        self.fd = -1
        self.reliable = True
        self.lock_path = lock_path
        self.doorbell: SharedBytes | None = None  # writable map of .lock, made on first wait
        self.missed = 0  # head moves seen without an event, in a row
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
            fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            if fd < 0:
                return
            mask = self.IN_MODIFY | self.IN_ATTRIB | self.IN_CLOSE_WRITE
            if libc.inotify_add_watch(fd, os.fsencode(lock_path), mask) < 0:
                os.close(fd)
                return
            self.fd = fd
        except (OSError, AttributeError):
            self.fd = -1

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.doorbell is not None:
            self.doorbell.close()
            self.doorbell = None

    def ring_for_me(self) -> None:
        """Ask the next writer to ``pwrite`` the head (see ``head.py``): a store into the
        map, which makes no inotify event for the other sleepers. Call before the last
        check of the head, so that a writer publishing after that check finds it set."""
        doorbell = self.doorbell
        if doorbell is None:
            doorbell = self.doorbell = map_lock_file_if_present(self.lock_path)
            if doorbell is None:
                return  # no map yet (or read-only): the safety timer finds the head moved
        if not doorbell[DOORBELL]:
            doorbell[DOORBELL] = 1

    def drain(self) -> bool:
        """Read away the pending inotify events; whether there were any."""
        got = False
        while True:
            try:
                if not os.read(self.fd, 4096):
                    return got
                got = True
            except BlockingIOError:
                return got

    def wait(self, ready: Callable[[], bool], deadline: float) -> bool:
        """Return ``True`` as soon as ``ready()`` holds, ``False`` at ``deadline``."""
        if self.fd >= 0 and self.reliable:
            return self._wait_inotify(ready, deadline)
        return self._wait_sleeping(ready, deadline)

    def _wait_inotify(self, ready: Callable[[], bool], deadline: float) -> bool:
        self.drain()  # events from before the check below are stale
        while True:
            self.ring_for_me()
            if ready():
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            readable, _, _ = select.select([self.fd], [], [], min(remaining, INOTIFY_SAFETY_S))
            got = self.drain() if readable else False
            if got:
                self.missed = 0
            elif ready():
                if self.drain():
                    self.missed = 0  # the event came between the timeout and the check
                    return True
                # the head moved without an event: a ring lost to a race (rare), no map of
                # the file, or a file system that does not notify; after a few, sleep-poll
                self.missed += 1
                if self.doorbell is None or self.missed >= INOTIFY_MISSES:
                    self.reliable = False
                return True

    @staticmethod
    def _wait_sleeping(ready: Callable[[], bool], deadline: float) -> bool:
        delay = SLEEP_MIN_S
        while True:
            if ready():
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, SLEEP_MAX_S)


__all__ = ["INOTIFY_MISSES", "INOTIFY_SAFETY_S", "SLEEP_MAX_S", "SLEEP_MIN_S", "HeadWatcher"]
