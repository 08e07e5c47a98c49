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
print(n, clock() - started, flush=True)
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
            # the table's offset while the writers write (sampled), then at their end
            offsets: list[tuple[float, int]] = []
            done = threading.Event()

            def sample() -> None:
                while not done.wait(0.1):
                    offsets.append((clock() - started, table.offset))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            written = 0
            for child in children:
                assert child.stdout is not None
                count, _elapsed = child.stdout.readline().split()
                written += int(count)
                child.wait()
            stopped = clock() - started
            behind = written - table.offset
            table.wait_for(written - 1, timeout=600)
            caught_up = clock() - started - stopped
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
            f"max {out['latency_ms']['max']:.0f} ms"
        )
        return out


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
    args = parser.parse_args()
    out = run(
        args.writers, args.rate, args.seconds, args.keys, args.values, args.store, root=args.root
    )
    if args.json:
        json.dump(out, sys.stdout, indent=2)


if __name__ == "__main__":
    main()


__all__ = ["run"]
