"""A table in asyncio: waiting for what the table applied, and opening it off the loop.

Why not the log's wake-up (``aio.wait_until``): that fires when a writer moves the log's
head, before the table's follower has applied the record, so a waiter woke early, found
the offset not applied, and slept until the next append or the 50 ms safety tick. Here the
follower itself wakes the waiters, right after it moved the offset and ran the change
callbacks (:meth:`AppliedWaiters.wake`, on the follower's thread:
``loop.call_soon_threadsafe`` for each waiter whose condition now holds).

Opening: ``Table(...)`` restores the state before it returns (0.5-10 s for millions of
keys). :func:`open_in_thread` runs it in the loop's default executor; the restore is
mostly numpy and C code that releases the interpreter, and the pure-Python parts hand it
over every ``sys.getswitchinterval()`` (5 ms), so the loop keeps running. A task cancelled
while it waits does not leak the table: it is closed when the restore ends.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_Waiter = tuple[asyncio.AbstractEventLoop, "asyncio.Future[None]", Callable[[], bool]]


class AppliedWaiters:
    """Coroutines waiting until a condition on a table holds, woken by the thread that
    makes it hold (any number of event loops; no thread per waiter)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: set[_Waiter] = set()

    def wake(self, everyone: bool = False) -> None:
        """Wake the waiters whose condition holds now (``everyone``: all of them, to see
        an error or a close). Called from any thread, after the change that makes a
        condition hold: a waiter registers before it checks, so one that this (unlocked)
        look at the set misses sees the change itself."""
        if not self._waiters:
            return
        with self._lock:
            waiters = list(self._waiters)
        for loop, future, ready in waiters:
            if everyone or ready():
                try:
                    loop.call_soon_threadsafe(_settle, future)
                except RuntimeError:
                    pass  # the loop is closed: nobody waits there any more

    async def wait(self, ready: Callable[[], bool], timeout_s: float | None) -> bool:
        """``True`` as soon as ``ready()`` holds, ``False`` after ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = math.inf if timeout_s is None else time.monotonic() + timeout_s
        while True:
            future: asyncio.Future[None] = loop.create_future()
            waiter = (loop, future, ready)
            with self._lock:  # registered before the check: a wake after it is not lost
                self._waiters.add(waiter)
            try:
                if ready():
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                alarm = None
                if not math.isinf(remaining):
                    alarm = loop.call_later(remaining, _settle, future)
                try:
                    await future
                finally:
                    if alarm is not None:
                        alarm.cancel()
            finally:
                with self._lock:
                    self._waiters.discard(waiter)


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def open_in_thread(make: Callable[[], T], close: Callable[[T], Any]) -> T:
    """``make()`` in the running loop's default executor; if the awaiting task is
    cancelled meanwhile, ``close(result)`` once ``make`` returns (in the executor too)."""
    loop = asyncio.get_running_loop()
    made = loop.run_in_executor(None, make)
    try:
        return await asyncio.shield(made)
    except asyncio.CancelledError:

        def dispose(future: asyncio.Future[T]) -> None:
            if not future.cancelled() and future.exception() is None:
                loop.run_in_executor(None, close, future.result())

        made.add_done_callback(dispose)
        raise


__all__ = ["AppliedWaiters", "open_in_thread"]
