"""One I/O budget shared by every worker (Kafka's ``log.cleaner.io.max.bytes.per.second``).

``compactlog.compaction.Throttler`` caps bytes since its creation; the service wants a
bucket that outlives passes and wakes on SIGTERM, so it keeps one token bucket of its own,
:class:`SharedThrottle`, and hands each pass a :class:`PassThrottle`: a ``Throttler``
whose ``account`` charges the shared bucket and counts the pass's own bytes and sleep.

The bucket is GCRA-style virtual time: each charge of ``n`` bytes moves the bucket's
"theoretical arrival time" on by ``n / rate``; a caller sleeps until that time is within
``burst_seconds`` of now. The sleep waits on the service's stop event, so a SIGTERM
wakes a throttled pass at once (it then sees ``should_abort``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from compactlog.compaction import Throttler

DEFAULT_BURST_SECONDS = 0.05


class SharedThrottle:
    """A thread-safe token bucket of ``bytes_per_second`` (0: unthrottled)."""

    def __init__(
        self,
        bytes_per_second: int,
        *,
        stop: threading.Event | None = None,
        clock: Callable[[], float] = time.monotonic,
        burst_seconds: float = DEFAULT_BURST_SECONDS,
        sleep: Callable[[float], object] | None = None,
    ) -> None:
        self.rate = bytes_per_second
        self.stop = stop or threading.Event()
        self.clock = clock
        self.burst = burst_seconds
        self.sleep = sleep or self.stop.wait  # waking on stop: SIGTERM ends a throttled wait
        self._lock = threading.Lock()
        self._tat = clock()  # when the bytes charged so far are "paid for"
        self.bytes = 0
        self.slept = 0.0

    def charge(self, nbytes: int) -> float:
        """Account ``nbytes`` of I/O; sleeps while the service is ahead of the rate.
        Returns the seconds slept."""
        if not self.rate or nbytes <= 0:
            return 0.0
        with self._lock:
            now = self.clock()
            self._tat = max(self._tat, now) + nbytes / self.rate
            self.bytes += nbytes
            delay = self._tat - now - self.burst
        if delay <= 0:
            return 0.0
        self.sleep(delay)
        with self._lock:
            self.slept += delay
        return delay

    def for_pass(self, progress: Callable[[int], None] | None = None) -> PassThrottle:
        return PassThrottle(self, progress)


class PassThrottle(Throttler):
    """The ``throttler=`` of one ``compact_log`` call: charges the shared bucket.

    ``bytes`` and ``slept`` are this pass's own (``compact_log`` reports ``slept`` as the
    pass's ``throttled_seconds``). ``progress`` is called with the pass's bytes so far.
    """

    def __init__(self, shared: SharedThrottle, progress: Callable[[int], None] | None) -> None:
        super().__init__(shared.rate or None)
        self.shared = shared
        self.progress = progress

    def account(self, nbytes: int) -> None:
        self.bytes += nbytes
        self.slept += self.shared.charge(nbytes)
        if self.progress is not None:
            self.progress(self.bytes)

    def slept_here(self) -> float:
        """One pass runs on one thread, so the pass's own sleep is all of ``slept``
        (``compact_log`` reports it as the pass's ``throttled_seconds``)."""
        return self.slept
