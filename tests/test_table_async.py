"""A table never makes a reader wait for the follower, nor an event loop for the table:
reads during a large apply see the state before or after it (never a part, never a wait),
``wait_for_async`` is woken by the follower's apply (not by the log's head), and
``Table.open_async`` restores while the loop keeps running."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

import compactlog
from compactlog.engine import aio

BIG = 50_000  # records of the batch the follower applies while readers read


def _gate(release: threading.Event, entered: threading.Event, marker: bytes):
    """A value deserializer that blocks on ``marker`` until ``release`` (the follower is
    then in the middle of applying the batch that holds it)."""

    def deserialize(value: bytes) -> bytes:
        if value == marker:
            entered.set()
            assert release.wait(30)
        return value

    return deserialize


def _in_thread(fn, timeout: float = 10.0):
    """``fn()`` in a thread, its result; fails if it takes longer than ``timeout`` (it
    waited for the follower)."""
    out: list = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    thread.join(timeout)
    assert out, f"a read waited more than {timeout} s for the follower"
    return out[0]


@pytest.mark.parametrize("store", ["memory", "disk"])
def test_reads_during_a_large_apply_see_the_previous_state_without_waiting(tmp_path, store):
    release, entered = threading.Event(), threading.Event()
    marker = b"marker"
    options: dict = {"value_deserializer": _gate(release, entered, marker)}
    if store == "disk":
        options.update(store="disk", state_dir=str(tmp_path / "state"))
    with compactlog.open(tmp_path / "log") as log:
        log.append_batch([(b"k%06d" % i, b"old") for i in range(BIG)])
        with compactlog.Table(tmp_path / "log", **options) as table:
            changes = []
            table.on_change(lambda key, old, new, offset: changes.append(offset))
            before = table.offset
            last = log.append_batch(
                [(b"k%06d" % i, b"new") for i in range(BIG - 1)] + [(b"k%06d" % (BIG - 1), marker)]
            )[-1]
            assert entered.wait(30)  # the follower is in the middle of the batch
            # every read answers at once, from the state before the batch
            assert _in_thread(lambda: table.get(b"k000000")) == b"old"
            assert _in_thread(lambda: table.offset) == before
            assert _in_thread(lambda: len(table)) == BIG
            assert _in_thread(lambda: {v for _k, v in table.items(prefix=b"k0000")}) == {b"old"}
            release.set()
            table.wait_for(last, timeout=60)
            assert table.offset == last + 1
            assert table.get(b"k000000") == b"new"
            assert table[b"k%06d" % (BIG - 1)] == marker
            assert len(changes) == BIG


def test_ordered_reads_see_whole_batches_while_the_follower_adds_and_removes_keys(tmp_path):
    """Each batch ``i`` writes keys ``i .. i+W`` with value ``i`` and removes key ``i-1``:
    every ``items()`` is exactly the state after some batch (the key order's part of an
    apply is done in steps; an ordered read finishes it first), never older than the
    offset read before it."""
    width, batches = 3000, 12
    with compactlog.open(tmp_path / "log") as log:
        log.append(b"start", b"-")
        with compactlog.Table(tmp_path / "log") as table:
            list(table.items())  # the key order exists: the follower keeps it up to date
            ends = []
            for i in range(batches):
                records = [(b"k%06d" % (i - 1), None)] if i else []
                records += [(b"k%06d" % j, b"%d" % i) for j in range(i, i + width)]
                ends.append(log.append_batch(records)[-1] + 1)
            seen = []
            while table.offset < ends[-1]:
                offset = table.offset
                seen.append((offset, list(table.items())))
            seen.append((table.offset, list(table.items())))
    for offset, items in seen:
        if len(items) == 1:
            assert offset <= ends[0] - 1 and items == [(b"start", b"-")]
            continue
        i = int(items[0][1])
        assert ends[i] >= offset  # (no older than the offset read before it)
        want = [(b"k%06d" % j, b"%d" % i) for j in range(i, i + width)]
        assert items[:-1] == want and items[-1] == (b"start", b"-")


def test_wait_for_async_is_woken_by_the_apply_not_by_the_logs_head(tmp_path, monkeypatch):
    """The follower applies the record only after the head moved (its change callback
    holds it back here); with no later append and no safety tick, only a wake-up by the
    apply itself ends the wait."""
    monkeypatch.setattr(aio, "INOTIFY_SAFETY_S", 3600.0)
    monkeypatch.setattr(aio, "SLEEP_MAX_S", 3600.0)
    release = threading.Event()
    with compactlog.open(tmp_path / "log") as log:
        log.append(b"a", b"0")
        with compactlog.Table(tmp_path / "log") as table:
            table.on_change(lambda key, old, new, offset: release.wait(30))

            async def main() -> float:
                offset = log.append(b"a", b"1")
                waiter = asyncio.create_task(table.wait_for_async(offset, timeout=20))
                await asyncio.sleep(0.2)  # the head moved long ago; the callback holds on
                assert not waiter.done()
                release.set()
                started = time.monotonic()
                await waiter
                assert table.offset > offset and table[b"a"] == b"1"
                return time.monotonic() - started

            assert asyncio.run(main()) < 10


def test_wait_for_async_raises_the_followers_error_and_times_out(tmp_path):
    with compactlog.open(tmp_path / "log") as log:
        log.append(b"a", b"0")
        with compactlog.Table(tmp_path / "log") as table:

            async def main() -> None:
                with pytest.raises(TimeoutError):
                    await table.wait_for_async(5, timeout=0.05)
                waiter = asyncio.create_task(table.wait_for_async(100))
                await asyncio.sleep(0.05)
                await table.close_async()
                with pytest.raises(compactlog.LogClosedError):
                    await waiter

            asyncio.run(main())


async def _ticking(work, period: float = 0.005) -> tuple[object, float, int]:
    """``await work()`` while a ticker task sleeps ``period`` in a loop: its result, the
    ticker's longest gap (seconds) and its tick count."""
    gaps: list[float] = []
    done = False

    async def ticker() -> None:
        last = time.monotonic()
        while not done:
            await asyncio.sleep(period)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    try:
        result = await work()
    finally:
        done = True
        await task
    return result, max(gaps, default=0.0), len(gaps)


def test_open_async_restores_while_the_loop_keeps_running(tmp_path):
    records = 100_000
    with compactlog.open(tmp_path / "log", key_format="str", value_format="json") as log:
        for start in range(0, records, 10_000):
            log.append_batch([(f"user:{i}", {"n": i}) for i in range(start, start + 10_000)])

    async def main() -> None:
        started = time.monotonic()
        table, gap, ticks = await _ticking(lambda: compactlog.Table.open_async(tmp_path / "log"))
        took = time.monotonic() - started
        try:
            assert len(table) == records and table["user:7"] == {"n": 7}
        finally:
            await table.close_async()
        # the restore (JSON decoding: Python work) took a while, and the loop kept ticking
        assert ticks >= 5
        assert gap < max(0.5 * took, 0.1), (gap, took)

    asyncio.run(main())


def test_open_async_cancelled_closes_the_table_it_was_making(tmp_path):
    with compactlog.open(tmp_path / "log") as log:
        log.append_batch([(b"k%d" % i, b"v") for i in range(20_000)])
    made: list[compactlog.Table] = []

    class Recorded(compactlog.Table):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    async def main() -> None:
        task = asyncio.create_task(Recorded.open_async(tmp_path / "log"))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(1000):  # the restore ends in its thread, then the table is closed
            if made and made[0]._closing:
                return
            await asyncio.sleep(0.01)
        raise AssertionError("the table made for a cancelled open was not closed")

    asyncio.run(main())
    assert made[0]._closing


def test_open_async_takes_the_tables_options(tmp_path):
    with compactlog.open(tmp_path / "log") as log:
        log.append(b"a", json.dumps({"x": 1}).encode())

    async def main() -> None:
        table = await compactlog.Table.open_async(
            tmp_path / "log", follow=False, value_deserializer=json.loads
        )
        try:
            assert table[b"a"] == {"x": 1}
            with pytest.raises(TimeoutError):
                await table.wait_for_async(1, timeout=0.05)
        finally:
            await table.close_async()

    asyncio.run(main())


def test_a_backlog_is_published_and_called_back_slice_by_slice_cut_between_batches(tmp_path):
    """A poll of many batches is applied in slices (here of at least 2 records): each
    slice is published (``table.offset`` at its batch's end) before its change callbacks
    run, and no batch is cut. (Batches of 10 records only: a reader takes a run that
    starts at a small batch, a single append, as one batch, with the batches after it.)"""
    with compactlog.open(tmp_path / "log") as log:
        log.append_batch([(b"start-%d" % j, b"-") for j in range(10)])
        with compactlog.Table(tmp_path / "log", follow=False) as table:
            table._parts[0].slice_records = 2  # (private: the follower sizes it from its speed)
            seen = []
            table.on_change(lambda key, old, new, offset: seen.append((offset, table.offset)))
            ends = [
                log.append_batch([(b"k%d-%d" % (i, j), b"v") for j in range(10)])[-1] + 1
                for i in range(4)
            ]
            table.refresh()
    assert [offset for offset, _ in seen] == list(range(10, 50))
    for offset, published in seen:
        assert published == next(end for end in ends if end > offset)
