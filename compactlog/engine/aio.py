"""asyncio waiting: coroutines woken when a log's head moves, with no thread per waiter.

The wake-up is the subscribers' (:class:`~compactlog.engine.watch.HeadWatcher`: an inotify
watch of ``.lock`` and the doorbell byte that asks the next writer to ``pwrite`` the head;
see ``head.py``). Here its descriptor is watched by the running event loop
(``loop.add_reader``) instead of ``select``, and **one** watcher serves every coroutine of
that loop waiting on the same log: a thousand waiters cost one inotify instance (Linux
allows 128 per user by default), one descriptor in the loop's selector and no thread.

Every event wakes all the log's waiters, and each re-checks its own condition (a ``pread``
of the head). As in the threaded wait, a timer wakes them all every ``INOTIFY_SAFETY_S``
while anyone waits, so a lost event or a closed subscriber is noticed; where inotify is
missing (or found not to fire) that timer is the only wake-up and runs every
``SLEEP_MAX_S``.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
import weakref
from collections.abc import Callable

from ..storage import filenames
from ..storage.head import Head, read_head_file
from .view_end import view_end_offset
from .watch import INOTIFY_MISSES, INOTIFY_SAFETY_S, SLEEP_MAX_S, HeadWatcher


class _SharedWatch:
    """One :class:`HeadWatcher` for the waiters of one log in one event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, lock_path: str) -> None:
        self.loop = loop
        self.lock_path = lock_path
        self.watcher = HeadWatcher(lock_path)
        self.users = 0  # coroutines inside wait()
        self.pending: list[asyncio.Future[None]] = []  # woken by the next event or tick
        self.timer: asyncio.TimerHandle | None = None
        self.last_head: Head | None = read_head_file(lock_path)
        self.reading = self.watcher.fd >= 0
        if self.reading:
            loop.add_reader(self.watcher.fd, self._on_event)

    @property
    def interval(self) -> float:
        return INOTIFY_SAFETY_S if self.reading else SLEEP_MAX_S

    def close(self) -> None:
        if self.reading:
            self.loop.remove_reader(self.watcher.fd)
            self.reading = False
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.watcher.close()

    def _wake_all(self) -> None:
        pending, self.pending = self.pending, []
        for future in pending:
            if not future.done():
                future.set_result(None)

    def _on_event(self) -> None:
        self.watcher.drain()
        self.watcher.missed = 0
        self.last_head = read_head_file(self.lock_path)
        self._wake_all()

    def _on_tick(self) -> None:
        self.timer = None
        head = read_head_file(self.lock_path)
        if head != self.last_head:
            self.last_head = head
            if self.reading and not self.watcher.drain():
                # the head moved without an event: after a few in a row, stop trusting
                # inotify and let the short timer do the waking (HeadWatcher does the same)
                self.watcher.missed += 1
                if self.watcher.missed >= INOTIFY_MISSES:
                    self.loop.remove_reader(self.watcher.fd)
                    self.reading = False
        self._wake_all()  # every waiter re-checks (a close, a lost event), as wait() does
        if self.users:
            self.timer = self.loop.call_later(self.interval, self._on_tick)

    async def wait(self, ready: Callable[[], bool], deadline: float) -> bool:
        """``True`` as soon as ``ready()`` holds, ``False`` at ``deadline`` (monotonic)."""
        if self.timer is None:
            self.timer = self.loop.call_later(self.interval, self._on_tick)
        while True:
            self.watcher.ring_for_me()  # before the last check: see HeadWatcher
            if ready():
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            future: asyncio.Future[None] = self.loop.create_future()
            self.pending.append(future)
            if math.isinf(remaining):
                await future
            else:
                alarm = self.loop.call_later(remaining, _settle, future)
                try:
                    await future
                finally:
                    alarm.cancel()


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


_watches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _SharedWatch]] = (
    weakref.WeakKeyDictionary()
)


async def wait_until(
    directory: str | os.PathLike[str], ready: Callable[[], bool], timeout_s: float | None = None
) -> bool:
    """Wait, without blocking the event loop, until ``ready()`` holds; ``ready`` is called
    now and whenever the head of the log in ``directory`` may have moved (an append by any
    process). ``True`` when it held, ``False`` after ``timeout_s`` (``None``: no limit).

    The general primitive beneath :meth:`Subscriber.poll_async` and
    :func:`wait_for_offset_async`; a reader that applies records elsewhere (a table's
    follower) can pass its own condition."""
    if timeout_s is not None and (
        isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s < 0
    ):
        raise ValueError(f"timeout_s must be a number >= 0 or None, not {timeout_s!r}")
    deadline = math.inf if timeout_s is None else time.monotonic() + timeout_s
    lock_path = os.path.join(os.path.abspath(os.fspath(directory)), filenames.WRITER_LOCK)
    loop = asyncio.get_running_loop()
    watches = _watches.setdefault(loop, {})
    watch = watches.get(lock_path)
    if watch is None:
        watch = watches[lock_path] = _SharedWatch(loop, lock_path)
    watch.users += 1
    try:
        return await watch.wait(ready, deadline)
    finally:
        watch.users -= 1
        if not watch.users:
            del watches[lock_path]
            watch.close()


async def wait_for_offset_async(
    directory: str | os.PathLike[str], offset: int, timeout_s: float | None = None
) -> bool:
    """Wait until the log in ``directory`` holds ``offset`` (its end offset is above it),
    whichever process appends it. ``True`` once it does, ``False`` after ``timeout_s``."""
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be a non-negative int, not {offset!r}")
    path = os.path.abspath(os.fspath(directory))

    def published() -> bool:
        # (the view's end: the head while a live writer stands behind it, else the data's)
        try:
            return view_end_offset(path, lambda: 0) > offset
        except FileNotFoundError:
            return False  # (no log here yet)

    return await wait_until(directory, published, timeout_s)


__all__ = ["wait_for_offset_async", "wait_until"]
