"""asyncio (compactlog/aio.py, Subscriber.poll_async, async iteration, Log.flush_async):
coroutines woken by appends of other processes, with no thread per waiter."""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import threading

import pytest

import compactlog
from compactlog.engine.aio import wait_for_offset_async, wait_until

from .helpers import run_python

APPENDER = """
import sys, compactlog
with compactlog.open(sys.argv[1]) as log:
    for i in range(int(sys.argv[2])):
        log.append(b"k%d" % i, b"v%d" % i)
"""


def start_appender(path, count: int) -> subprocess.Popen[bytes]:
    """Another process appending ``count`` single records (a real subprocess; started with
    Popen, not asyncio's subprocess support, which on Python 3.11 watches it by a thread)."""
    return subprocess.Popen([sys.executable, "-c", APPENDER, str(path), str(count)])


def test_a_thousand_tasks_wait_on_one_log_woken_by_another_process(log_dir):
    compactlog.open(log_dir).close()
    waiters = 1000

    async def main() -> tuple[list[bool], int, int]:
        before = threading.active_count()
        tasks = [
            asyncio.create_task(wait_for_offset_async(log_dir, i, timeout_s=120))
            for i in range(waiters)
        ]
        await asyncio.sleep(0)  # every task runs to its first wait
        await asyncio.sleep(0)
        assert not any(task.done() for task in tasks)
        waiting = threading.active_count()
        appender = start_appender(log_dir, waiters)
        try:
            done = await asyncio.gather(*tasks)
        finally:
            assert appender.wait(timeout=120) == 0
        return done, before, waiting

    done, before, waiting = asyncio.run(main())
    assert done == [True] * waiters
    assert waiting == before  # no thread per waiter (nor any thread at all)


def test_subscribers_iterate_asynchronously_over_appends_of_another_process(log_dir):
    compactlog.open(log_dir).close()
    count = 300

    async def consume(log: compactlog.Log, name: str) -> list[int]:
        offsets = []
        async for record in log.subscribe(name):
            offsets.append(record.offset)
            if len(offsets) == count:
                break
        return offsets

    async def main() -> list[list[int]]:
        with compactlog.open(log_dir, read_only=True) as log:
            before = threading.active_count()
            tasks = [asyncio.create_task(consume(log, f"c{i}")) for i in range(20)]
            await asyncio.sleep(0.01)
            assert threading.active_count() == before
            appender = start_appender(log_dir, count)
            try:
                return await asyncio.gather(*tasks)
            finally:
                assert appender.wait(timeout=120) == 0

    assert asyncio.run(main()) == [list(range(count))] * 20


def test_poll_async_returns_records_deserialized_and_empty_after_its_timeout(log_dir):
    async def main() -> None:
        with compactlog.open(log_dir, key_format="str", value_format="json") as log:
            subscriber = log.subscribe("s")
            assert await subscriber.poll_async(timeout_s=0.01) == []
            log.append("k", {"n": 1})
            records = await subscriber.poll_async(timeout_s=5)
            assert [(r.key, r.value) for r in records] == [("k", {"n": 1})]

    asyncio.run(main())


def test_async_iteration_ends_when_the_subscriber_is_closed(log_dir):
    async def main() -> list[object]:
        with compactlog.open(log_dir) as log:
            log.append(b"k", b"v")
            subscriber = log.subscribe("s")
            seen: list[object] = []

            async def consume() -> None:
                async for record in subscriber:
                    seen.append(record.value)

            task = asyncio.create_task(consume())
            while not seen:
                await asyncio.sleep(0.001)
            subscriber.close()
            await asyncio.wait_for(task, timeout=30)
            return seen

    assert asyncio.run(main()) == [b"v"]


def test_wait_for_offset_async_times_out_and_checks_its_arguments(log_dir):
    compactlog.open(log_dir).close()

    async def main() -> None:
        assert await wait_for_offset_async(log_dir, 0, timeout_s=0.01) is False
        with pytest.raises(ValueError, match="offset"):
            await wait_for_offset_async(log_dir, -1)
        with pytest.raises(ValueError, match="timeout_s"):
            await wait_until(log_dir, lambda: True, timeout_s=-1)
        assert await wait_until(log_dir, lambda: True) is True

    asyncio.run(main())


def test_flush_async_makes_lingering_appends_visible_to_other_processes(log_dir):
    async def main() -> None:
        with compactlog.open(log_dir, linger_ms=60_000) as log:
            log.append(b"k", b"v")
            seen = (
                "import sys, compactlog\n"
                "print(compactlog.open(sys.argv[1], read_only=True).end_offset)"
            )
            assert run_python(seen, str(log_dir)).strip() == "0"
            await log.flush_async()
            assert run_python(seen, str(log_dir)).strip() == "1"

    asyncio.run(main())


def test_async_iteration_over_a_backlog_lets_other_tasks_run(log_dir):
    """Issue 24: ``async for record in sub`` over 200,000 waiting records held the loop for
    1.3 s; another task, waking every millisecond, now waits at most about one poll."""
    count = 200_000
    with compactlog.open(log_dir) as log:
        for lo in range(0, count, 10_000):
            log.append_batch([(b"k%d" % i, b"v") for i in range(lo, lo + 10_000)])
        subscriber = log.subscribe("~backlog", start=0)

        async def ticker(stop: asyncio.Event, delays: list[float]) -> None:
            loop = asyncio.get_running_loop()
            while not stop.is_set():
                asked = loop.time()
                await asyncio.sleep(0.001)
                delays.append(loop.time() - asked - 0.001)

        async def main() -> tuple[float, list[float]]:
            stop = asyncio.Event()
            delays: list[float] = []
            task = asyncio.create_task(ticker(stop, delays))
            await asyncio.sleep(0)  # the ticker is waiting
            loop = asyncio.get_running_loop()
            began = loop.time()
            seen = 0
            async for _record in subscriber:
                seen += 1
                if seen == count:
                    break
            took = loop.time() - began
            stop.set()
            await task
            return took, delays

        took, delays = asyncio.run(main())
    # the ticker ran all along (before: once, after the whole backlog), and was usually
    # woken on time (a median: one stall of a loaded machine does not decide it)
    assert len(delays) >= 20
    assert statistics.median(delays) < took / 20
