"""How the archive's long-running loops (``archive run``, ``archive follow``) live through a
failing store: every failed round is retried after a backoff that doubles from the
interval up to ``MAX_BACKOFF_S`` and resets at the first success. They never exit on a
store error; an operator sees each failure as one line and the lag growing."""

from __future__ import annotations

import time
from collections.abc import Callable

MAX_BACKOFF_S = 30.0
MIN_BACKOFF_S = 0.1
MIN_INTERVAL_S = 0.1  # the CLI's floor for --interval: rounds cost requests, and money


class Backoff:
    """The delay before the next try: ``0`` while rounds succeed."""

    def __init__(self, interval_s: float, maximum_s: float = MAX_BACKOFF_S) -> None:
        self.interval_s = interval_s
        self.maximum_s = maximum_s
        self.delay_s = 0.0

    def failed(self) -> float:
        """One more failure: the (doubled) delay before the next try."""
        self.delay_s = min(max(self.delay_s * 2, self.interval_s, MIN_BACKOFF_S), self.maximum_s)
        return self.delay_s

    def succeeded(self) -> None:
        self.delay_s = 0.0


def sleep_until(deadline: float, should_stop: Callable[[], bool]) -> None:
    """Sleep until ``time.monotonic()`` reaches ``deadline`` or ``should_stop()`` turns true
    (checked every 50 ms)."""
    while not should_stop():
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(0.05, left))


__all__ = ["MAX_BACKOFF_S", "MIN_INTERVAL_S", "Backoff", "sleep_until"]
