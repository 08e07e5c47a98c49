"""Tables (issue 19): building the latest state of a compacted log, side by side.

Workload: ``records`` distinct keys (16 B keys, 100 B values) appended in batches of 1,000,
then every key written once more and a forced cleaning pass (so the log is compacted: the
clean tail holds one record per key, the active segment the rest). Each system builds the
same ``{key: value}`` of the whole state; the median of ``repeat`` runs:

``dict(read_batches())``  a dict updated from every batch (``dict.update(zip(keys, values))``)
``SQLite SELECT``         a dict from ``SELECT k, v`` of a table holding the same state
``log.latest()``          a dict from the ``Record`` objects of :meth:`Log.latest`
``latest_batches()``      a dict updated from the batches of :meth:`Log.latest_batches`
``Table restore``         ``compactlog.Table(path, follow=False)`` until point reads serve
                          (the state served frozen, ``table_frozen.py``)
``Table restore + dict``  the same until the background thread has built the dict
``Table first range``     the first ordered read after a restore (the dict, then the sort)
``Table first small range`` the same of 10 keys (served frozen: the sort only)

reported as records/s and as ratios to ``read_batches()``. Also: random point reads per
second of the frozen state and of the dict, and the follow latency (an append by another
process until ``wait_for`` returns in the table, median and p90 of ``latency_samples``).

Large mode (:func:`run_disk`, ``--disk-keys N``): a log of ``N`` distinct keys restored
into ``store="disk"`` (time, and the process's anonymous memory per key: heap, not the
page cache that maps LMDB's file), a restart after 10,000 more records, random point
``get`` per second, and for comparison a point read by offset through the log's reader
(what a keydir that keeps values in the log would do).

Run standalone (``python -m benchmarks.bench_table [--records N] [--json]``) or call
:func:`run`, which returns a dict.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import compactlog

from .common import timed_runs

VALUE = b"v" * 100
BATCH = 1000


def build_log(directory: str, records: int) -> None:
    with compactlog.open(directory, segment_bytes=16 << 20) as log:
        for round_ in range(2):
            for start in range(0, records, BATCH):
                log.append_batch(
                    [
                        (b"key-%012d" % i, VALUE[:-1] + bytes([48 + round_]))
                        for i in range(start, min(start + BATCH, records))
                    ]
                )
        log.compact(force=True)


def build_sqlite(path: str, directory: str) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE kv (k BLOB PRIMARY KEY, v BLOB) WITHOUT ROWID")
    with compactlog.open(directory, read_only=True) as log:
        for batch in log.latest_batches():
            conn.executemany(
                "INSERT INTO kv VALUES (?, ?)", zip(batch.keys(), batch.values(), strict=True)
            )
    conn.commit()
    conn.close()


def _from_batches(directory: str, method: str) -> int:
    """Keys of a dict updated from ``log.<method>()``'s batches."""
    state: dict[bytes, bytes] = {}
    with compactlog.open(directory, read_only=True) as log:
        for batch in getattr(log, method)():
            state.update(zip(batch.keys(), batch.values(), strict=True))
    return len(state)


def _from_sqlite(path: str) -> int:
    conn = sqlite3.connect(path)
    state = dict(conn.execute("SELECT k, v FROM kv"))
    conn.close()
    return len(state)


def _from_latest(directory: str) -> int:
    with compactlog.open(directory, read_only=True) as log:
        state = {r.key: r.value for r in log.latest()}
    return len(state)


def _table_restore(directory: str) -> int:
    with compactlog.Table(directory, follow=False) as table:
        return len(table)


def _wait_for_dict(table: compactlog.Table) -> None:
    """Until the background build of the table's dict is done (private, a benchmark's)."""
    for part in table._parts:
        part.thaw()


def _table_restore_and_dict(directory: str) -> int:
    with compactlog.Table(directory, follow=False) as table:
        _wait_for_dict(table)
        return len(table)


def point_reads(directory: str, records: int, reads: int = 200_000) -> dict[str, float]:
    """Random ``get`` per second: the frozen state, then the table's dict."""
    import random

    from compactlog.table.table_frozen import FrozenState

    sample = [b"key-%012d" % random.randrange(records) for _ in range(reads)]
    out = {}
    with compactlog.open(directory, read_only=True) as log:
        frozen = FrozenState(list(log.latest_batches()))
    started = time.perf_counter()
    for key in sample:
        frozen.get(key)
    out["frozen_get_per_s"] = reads / (time.perf_counter() - started)
    with compactlog.Table(directory, follow=False) as table:
        _wait_for_dict(table)
        started = time.perf_counter()
        for key in sample:
            table.get(key)
        out["table_get_per_s"] = reads / (time.perf_counter() - started)
    return out


def _first_range(directory: str, repeat: int, prefix: bytes = b"key-") -> list[float]:
    """Seconds of the first ordered read of the keys starting with ``prefix`` right after
    a restore (all of them by default)."""
    times = []
    for _ in range(repeat):
        with compactlog.Table(directory, follow=False) as table:
            started = time.perf_counter()
            next(iter(table.items(prefix=prefix)))
            times.append(time.perf_counter() - started)
    return times


APPENDER = """
import sys, time, compactlog
log = compactlog.open(sys.argv[1])
for line in sys.stdin:
    print(log.append(b"latency", b"x"), time.perf_counter(), flush=True)
"""


def follow_latency(directory: str, samples: int) -> list[float]:
    """Seconds from an append by another process (its clock just after ``append``
    returned; ``perf_counter`` is system-wide on Linux) to ``wait_for`` returning."""
    child = subprocess.Popen(
        [sys.executable, "-c", APPENDER, directory],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    out = []
    with compactlog.Table(directory) as table:
        for _ in range(samples):
            child.stdin.write("\n")
            child.stdin.flush()
            offset, stamp = child.stdout.readline().split()
            table.wait_for(int(offset), timeout=10)
            out.append(time.perf_counter() - float(stamp))
            time.sleep(0.002)  # the follower is asleep again, as it is between appends
    child.stdin.close()
    child.wait()
    return out


def run(
    records: int = 1_000_000,
    repeat: int = 5,
    latency_samples: int = 200,
    root: str | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=root) as scratch:
        directory = os.path.join(scratch, "log")
        sqlite_path = os.path.join(scratch, "kv.sqlite")
        build_log(directory, records)
        build_sqlite(sqlite_path, directory)
        systems: dict[str, Callable[[], int]] = {
            "dict(read_batches())": lambda: _from_batches(directory, "read_batches"),
            "SQLite SELECT": lambda: _from_sqlite(sqlite_path),
            "log.latest()": lambda: _from_latest(directory),
            "latest_batches()": lambda: _from_batches(directory, "latest_batches"),
            "Table restore": lambda: _table_restore(directory),
            "Table restore + dict": lambda: _table_restore_and_dict(directory),
        }
        results: dict[str, Any] = {"records": records, "systems": {}}
        for fn in systems.values():
            fn()  # warm-up (page cache, imports)
        for _round in range(repeat):  # interleaved: each system sees the same machine
            for name, fn in systems.items():
                results["systems"].setdefault(name, []).extend(
                    timed_runs(fn, 1, records, f"keys built by {name}")
                )
        base = statistics.median(results["systems"]["dict(read_batches())"])
        summary = {}
        for name, times in results["systems"].items():
            median = statistics.median(times)
            summary[name] = {
                "median_s": median,
                "records_per_s": records / median,
                "ratio_to_read_batches": base / median,
            }
            say(
                f"{name:24s} {records / median / 1e6:6.2f} M records/s  "
                f"{base / median:5.2f}x read_batches()"
            )
        first = statistics.median(_first_range(directory, repeat))
        summary["Table first range"] = {"median_s": first}
        say(f"{'Table first range':24s} {first * 1000:6.1f} ms (the dict, then the lazy sort)")
        ten_keys = (b"key-%012d" % (records // 2))[:-1]  # the 10 keys around the middle
        small = statistics.median(_first_range(directory, repeat, ten_keys))
        summary["Table first small range"] = {"median_s": small}
        say(f"{'Table first small range':24s} {small * 1000:6.1f} ms (10 keys: the sort, frozen)")
        reads = point_reads(directory, records)
        summary["point get"] = reads
        say(
            f"{'point get':24s} frozen {reads['frozen_get_per_s'] / 1000:.0f}k/s, "
            f"dict (through Table) {reads['table_get_per_s'] / 1000:.0f}k/s"
        )
        latency = follow_latency(directory, latency_samples)
        summary["follow latency"] = {
            "median_ms": statistics.median(latency) * 1000,
            "p90_ms": sorted(latency)[int(len(latency) * 0.9)] * 1000,
        }
        say(
            f"{'follow latency':24s} median {summary['follow latency']['median_ms']:.2f} ms, "
            f"p90 {summary['follow latency']['p90_ms']:.2f} ms"
        )
        results["summary"] = summary
        return results


def _anon_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    return 0


def run_disk(
    keys: int, root: str | None = None, say: Callable[[str], None] = print
) -> dict[str, Any]:
    import gc
    import random

    from compactlog.engine.reader import iter_batches

    out: dict[str, Any] = {"keys": keys}
    with tempfile.TemporaryDirectory(dir=root) as scratch:
        directory = os.path.join(scratch, "log")
        state_dir = os.path.join(scratch, "state")
        with compactlog.open(directory, segment_bytes=64 << 20) as log:
            for start in range(0, keys, 10_000):
                log.append_batch(
                    [(b"key-%012d" % i, VALUE) for i in range(start, min(start + 10_000, keys))]
                )
        gc.collect()
        before = _anon_bytes()
        started = time.perf_counter()
        table = compactlog.Table(directory, store="disk", state_dir=state_dir, follow=False)
        out["restore_s"] = time.perf_counter() - started
        gc.collect()
        out["anon_bytes_per_key"] = (_anon_bytes() - before) / keys
        sample = [b"key-%012d" % random.randrange(keys) for _ in range(200_000)]
        started = time.perf_counter()
        for key in sample:
            table[key]
        out["get_per_s"] = len(sample) / (time.perf_counter() - started)
        table.close()
        with compactlog.open(directory) as log:
            log.append_batch([(b"new-%012d" % i, VALUE) for i in range(10_000)])
            offsets = [random.randrange(keys) for _ in range(2000)]
            started = time.perf_counter()
            for offset in offsets:
                next(iter_batches(log.directory, offset, offset + 1))
            out["get_by_offset_per_s"] = len(offsets) / (time.perf_counter() - started)
        started = time.perf_counter()
        with compactlog.Table(directory, store="disk", state_dir=state_dir, follow=False) as t:
            out["restart_10k_s"] = time.perf_counter() - started
            assert len(t) == keys + 10_000
    say(
        f"disk table, {keys / 1e6:.1f}M keys: restore {out['restore_s']:.1f} s, "
        f"{out['anon_bytes_per_key']:.1f} B/key of heap, restart after 10k records "
        f"{out['restart_10k_s'] * 1000:.0f} ms, get {out['get_per_s'] / 1000:.0f}k/s "
        f"(by offset through the log's reader: {out['get_by_offset_per_s'] / 1000:.1f}k/s)"
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--root", default=None)
    parser.add_argument("--disk-keys", type=int, default=0, help="also the large mode")
    args = parser.parse_args()
    summary = {}
    if args.records:
        summary = run(args.records, args.repeat, root=args.root)["summary"]
    if args.disk_keys:
        summary["disk"] = run_disk(args.disk_keys, root=args.root)
    if args.json:
        json.dump(summary, sys.stdout, indent=2)


if __name__ == "__main__":
    main()


__all__ = ["run"]
