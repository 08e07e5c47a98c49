"""Following under load (issue 24): how far behind a ``Table`` is while other processes write.

Workload: ``writers`` processes append single records to one log, each at ``rate``
records/s (0: as fast as it can), for ``seconds``: 16 B keys over ``keys`` users and 100 B
values whose first 8 bytes are ``time.perf_counter()`` just before the append
(``perf_counter`` is system-wide on Linux); or with ``values="json"`` a log of str keys and
JSON values ``{"t": <that time>, ...}`` of about 100 B, as a profile service writes.
This process holds a ``Table`` of the log with an ``on_change`` callback that records, for
every change, the time from the append to the callback. Reported: the latency's median,
p99 and max; the writers' total rate; the rate the table applied at (records it applied
while the writers wrote, over that time); how many records it was behind when they
stopped, and how long it took to catch up.

"Keeps up" means: applied rate >= written rate, and the backlog at the end is small.

Run standalone (``python -m benchmarks.bench_follow [--writers N] [--rate R] [--json]``)
or call :func:`run`, which returns a dict.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import compactlog

STAMP = struct.Struct("<d")

WRITER = """
import struct, sys, time, compactlog
directory, rate, seconds, keys, seed = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), \
    int(sys.argv[4]), int(sys.argv[5])
as_json = sys.argv[6] == "json"
stamp = struct.Struct("<d")
pad = b"v" * (100 - stamp.size)
log = compactlog.open(directory)
sys.stdout.write("ready\\n"); sys.stdout.flush()
sys.stdin.readline()
clock = time.perf_counter
started = clock()
n = 0
key = (seed * 7919) % keys
while True:
    now = clock()
    if now - started >= seconds:
        break
    if rate and n >= (now - started) * rate:
        time.sleep(0.0005)
        continue
    key = (key + 7919) % keys
    if as_json:
        log.append("user:%011d" % key, {"t": clock(), "name": "n" * 60, "n": n})
    else:
        log.append(b"user:%011d" % key, stamp.pack(clock()) + pad)
    n += 1
log.close()
print(n, clock() - started, time.process_time(), flush=True)
"""


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


def run(
    writers: int = 1,
    rate: float = 20_000,
    seconds: float = 5.0,
    keys: int = 100_000,
    values: str = "bytes",
    store: str = "memory",
    root: str | None = None,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=root) as scratch:
        directory = os.path.join(scratch, "log")
        formats = {"key_format": "str", "value_format": "json"} if values == "json" else {}
        compactlog.open(directory, **formats).close()
        latencies: list[float] = []
        clock = time.perf_counter

        def changed(key: Any, old: Any, new: Any, offset: int) -> None:
            if new is not None:
                stamp = new["t"] if values == "json" else STAMP.unpack_from(new)[0]
                latencies.append(clock() - stamp)

        children = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    WRITER,
                    directory,
                    *map(str, (rate, seconds, keys, number)),
                    values,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for number in range(writers)
        ]
        options: dict[str, Any] = {}
        if store == "disk":
            options = {"store": "disk", "state_dir": os.path.join(scratch, "state")}
        with compactlog.Table(directory, **options) as table:
            table.on_change(changed)
            for child in children:
                assert child.stdout is not None
                child.stdout.readline()  # ready
            for child in children:
                assert child.stdin is not None
                child.stdin.write("go\n")
                child.stdin.flush()
            started = clock()
            cpu_started = time.process_time()
            # the table's offset while the writers write (sampled), then at their end
            offsets: list[tuple[float, int]] = []
            done = threading.Event()

            def sample() -> None:
                while not done.wait(0.1):
                    offsets.append((clock() - started, table.offset))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            written = 0
            writer_cpu = 0.0
            for child in children:
                assert child.stdout is not None
                count, _elapsed, cpu = child.stdout.readline().split()
                written += int(count)
                writer_cpu += float(cpu)
                child.wait()
            stopped = clock() - started
            behind = written - table.offset
            table.wait_for(written - 1, timeout=600)
            caught_up = clock() - started - stopped
            table_cpu = time.process_time() - cpu_started
            done.set()
            sampler.join()
        applied_during = [offset for at, offset in offsets if at <= seconds]
        applied_rate = (applied_during[-1] / seconds) if applied_during else 0.0
        out = {
            "writers": writers,
            "values": values,
            "store": store,
            "target_rate_per_writer": rate,
            "seconds": seconds,
            "written": written,
            "written_per_s": written / seconds,
            "applied_per_s_while_writing": applied_rate,
            "behind_at_stop": behind,
            "catch_up_s": caught_up,
            "changes": len(latencies),
            # CPU per record (independent of how loaded the machine is): keeping up with
            # N writers on N + 1 cores takes table_cpu_us <= writer_cpu_us
            "writer_cpu_us_per_record": writer_cpu / max(written, 1) * 1e6,
            "table_cpu_us_per_record": table_cpu / max(written, 1) * 1e6,
            "latency_ms": {
                "p50": statistics.median(latencies) * 1000 if latencies else float("nan"),
                "p99": _percentile(latencies, 0.99) * 1000,
                "max": max(latencies) * 1000 if latencies else float("nan"),
            },
        }
        say(
            f"{store} table of {values} values, "
            f"{writers} writer(s) at {'full rate' if not rate else f'{rate / 1000:.0f}k/s'}: "
            f"wrote {written / seconds / 1000:.1f}k/s, table applied "
            f"{applied_rate / 1000:.1f}k/s while writing, {behind} behind at stop "
            f"(caught up in {caught_up * 1000:.0f} ms); append -> on_change p50 "
            f"{out['latency_ms']['p50']:.2f} ms, p99 {out['latency_ms']['p99']:.1f} ms, "
            f"max {out['latency_ms']['max']:.0f} ms; CPU per record: writer "
            f"{out['writer_cpu_us_per_record']:.1f} us, "
            f"table {out['table_cpu_us_per_record']:.1f} us"
        )
        return out


BATCHER = """
import sys, compactlog
with compactlog.open(sys.argv[1]) as log:
    print(log.append_batch([(f"user:{i:011d}", {"n": i, "name": "n" * 60})
                            for i in range(int(sys.argv[2]))])[-1])
"""


def get_during_apply(
    records: int = 50_000, store: str = "memory", root: str | None = None
) -> dict[str, float]:
    """The longest ``table.get`` while the follower applies one batch of ``records`` JSON
    records (appended by another process over as many keys already in the table), and the
    time until the table has applied it."""
    with tempfile.TemporaryDirectory(dir=root) as scratch:
        directory = os.path.join(scratch, "log")
        formats = {"key_format": "str", "value_format": "json"}
        with compactlog.open(directory, **formats) as log:
            log.append_batch([(f"user:{i:011d}", {"n": -1}) for i in range(records)])
        options: dict[str, Any] = {}
        if store == "disk":
            options = {"store": "disk", "state_dir": os.path.join(scratch, "state")}
        key = "user:00000000007"  # (a disk table takes the declared key format too)
        with compactlog.Table(directory, **options) as table:
            longest = 0.0
            done = threading.Event()

            def read() -> None:
                nonlocal longest
                clock = time.perf_counter
                while not done.is_set():
                    started = clock()
                    table.get(key)
                    longest = max(longest, clock() - started)
                    time.sleep(0.0002)

            reader = threading.Thread(target=read)
            reader.start()
            started = time.perf_counter()
            out = subprocess.run(
                [sys.executable, "-c", BATCHER, directory, str(records)],
                capture_output=True,
                text=True,
                check=True,
            )
            table.wait_for(int(out.stdout), timeout=600)
            applied = time.perf_counter() - started
            done.set()
            reader.join()
            assert table[key]["n"] == 7
    return {"longest_get_ms": longest * 1000, "append_and_apply_ms": applied * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--writers", type=int, default=1)
    parser.add_argument("--rate", type=float, default=20_000, help="per writer; 0: full rate")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--values", choices=["bytes", "json"], default="bytes")
    parser.add_argument("--store", choices=["memory", "disk"], default="memory")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--root", default=None)
    parser.add_argument(
        "--get-during-apply", type=int, default=0, help="N: the longest get during an apply of N"
    )
    args = parser.parse_args()
    if args.get_during_apply:
        got = get_during_apply(args.get_during_apply, args.store, root=args.root)
        print(
            f"{args.store} table, a batch of {args.get_during_apply} JSON records: longest get "
            f"{got['longest_get_ms']:.1f} ms (append + apply {got['append_and_apply_ms']:.0f} ms)"
        )
        return
    out = run(
        args.writers, args.rate, args.seconds, args.keys, args.values, args.store, root=args.root
    )
    if args.json:
        json.dump(out, sys.stdout, indent=2)


if __name__ == "__main__":
    main()


__all__ = ["get_during_apply", "run"]
