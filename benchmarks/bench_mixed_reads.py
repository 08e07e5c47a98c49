"""Reading logs of single appends mixed with batches, side by side with the same records
written by single appends alone (issue 24).

Workload: ``records`` records of a 16 B key (each key twice, half the log apart) and a
value, in segments of 4 MiB, written in
one of several *patterns*: single ``log.append`` calls with an ``append_batch`` of ``size``
records after every ``every`` of them, or a seeded random mix (each append a batch with
probability 1/8, of 2 to 1,000 records); values of 100 B (one repeated string), random
values of 50-150 B, and either with zstd. Each pattern's records are also written by
single appends alone (``single``), and each scan is timed on both logs in turn, in one
process, so that load from anything else falls on both alike; the ratio is the mixed
log's records/s over the single log's (the target: 0.8 or more for every pattern). Times
are the process's CPU time (``time.process_time``: what the scan costs, not how long it
waited for a core on a loaded machine).

Scans (each the median of ``repeat``): ``read()`` (``Record`` objects), ``read_batches()``
(columns), ``latest()`` (the latest record of every key) and a ``Table`` restore
(``Table(path, follow=False)``, until its length is known); the rates count every
record of the log. Then one forced compaction of each log of the first pattern (which
drops half the records; its seconds, and the ratio).

Run standalone (``python -m benchmarks.bench_mixed_reads [--records N] [--json]``) or call
:func:`run`, which returns a dict with a ``markdown`` table (``benchmarks.run`` adds it).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import compactlog

VALUE = b"v" * 100
SEGMENT_BYTES = 4 << 20  # most of the log in closed segments, as in a log that has lived


def _keys(records: int) -> list[bytes]:
    """Each key written twice, the second time half the log later (so that a compaction
    has half the records to drop, and ``latest`` half the records to return)."""
    distinct = max(records // 2, 1)
    return [b"%016d" % (i % distinct) for i in range(records)]


@dataclass(frozen=True)
class Pattern:
    """How a log's records are appended: ``every`` singles then a batch of ``size``
    (``every`` 0: a seeded random mix), values of 100 B or of 50-150 B, zstd or not."""

    name: str
    every: int
    size: int
    varied: bool = False
    zstd: bool = False


PATTERNS = (
    Pattern("batch of 10 every 16 singles (issue 24)", 16, 10),
    Pattern("batch of 2 after each single", 1, 2),
    Pattern("batch of 10 every 4 singles", 4, 10),
    Pattern("batch of 100 every 64 singles", 64, 100),
    Pattern("batch of 1000 every 100 singles", 100, 1000),
    Pattern("random mix, batches of 2-1000", 0, 0),
    Pattern("batch of 10 every 16, values 50-150 B", 16, 10, varied=True),
    Pattern("random mix, values 50-150 B", 0, 0, varied=True),
    Pattern("batch of 10 every 16, zstd", 16, 10, zstd=True),
    Pattern("random mix, values 50-150 B, zstd", 0, 0, varied=True, zstd=True),
)


def _values(records: int, varied: bool) -> list[bytes]:
    if not varied:
        return [VALUE] * records
    rng = random.Random(13)
    data = rng.randbytes(records * 150)
    return [data[i * 150 : i * 150 + rng.randint(50, 150)] for i in range(records)]


def _groups(pattern: Pattern, records: int) -> Iterator[int]:
    """The sizes of the appends in turn (1: a single append)."""
    rng = random.Random(7)
    done = 0
    while done < records:
        if pattern.every:
            sizes = [1] * pattern.every + [pattern.size]
        else:
            sizes = [rng.choice((2, 3, 10, 50, 1000)) if rng.random() < 1 / 8 else 1]
        for size in sizes:
            size = min(size, records - done)
            if size <= 0:
                return
            yield size
            done += size


def _write(path: str, pattern: Pattern, records: int, mixed: bool) -> None:
    config = {
        "sync": "os",
        "compression": "zstd" if pattern.zstd else "none",
        "segment_bytes": SEGMENT_BYTES,
    }
    keys = _keys(records)
    values = _values(records, pattern.varied)
    with compactlog.open(path, **config) as log:
        i = 0
        for size in _groups(pattern, records) if mixed else iter([1] * records):
            if size == 1:
                log.append(keys[i], values[i])
            else:
                log.append_batch([(keys[j], values[j]) for j in range(i, i + size)])
            i += size


def _read(log: Any) -> int:
    return sum(1 for _ in log.read())


def _read_batches(log: Any) -> int:
    return sum(len(b) for b in log.read_batches())


def _latest(log: Any) -> int:
    return sum(1 for _ in log.latest())


SCANS: dict[str, Callable[[Any], int]] = {
    "read_batches": _read_batches,
    "read": _read,
    "latest": _latest,
}


def _side_by_side(paths: dict[str, str], records: int, repeat: int) -> dict[str, dict[str, float]]:
    """records/s of each scan on each log, the logs timed in turn (median of ``repeat``)."""
    times: dict[str, dict[str, list[float]]] = {s: {k: [] for k in paths} for s in SCANS}
    times["Table restore"] = {k: [] for k in paths}
    distinct = len(set(_keys(records)))  # what latest and a table hold
    logs = {kind: compactlog.open(path, read_only=True) for kind, path in paths.items()}
    try:
        for _ in range(repeat):
            for scan, timings in times.items():
                for kind in paths:
                    started = time.process_time()
                    if scan == "Table restore":
                        with compactlog.Table(paths[kind], follow=False) as table:
                            got = len(table)
                    else:
                        got = SCANS[scan](logs[kind])
                    timings[kind].append(time.process_time() - started)
                    want = records if scan in ("read", "read_batches") else distinct
                    if got != want:
                        raise AssertionError(f"{scan} of {kind} gave {got} of {want} records")
    finally:
        for log in logs.values():
            log.close()
    return {
        scan: {kind: records / statistics.median(t) for kind, t in timings.items()}
        for scan, timings in times.items()
    }


def _compaction(paths: dict[str, str]) -> dict[str, float]:
    """CPU seconds of one forced compaction of each log (copies: the logs stay as written)."""
    seconds = {}
    for kind, path in paths.items():
        copy = path + "-compacted"
        shutil.copytree(path, copy)
        with compactlog.open(copy) as log:
            started = time.process_time()
            log.compact(force=True)
            seconds[kind] = time.process_time() - started
        shutil.rmtree(copy)
    return seconds


def run(
    records: int = 200_000,
    repeat: int = 3,
    root: str | None = None,
    patterns: tuple[Pattern, ...] = PATTERNS,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Every pattern side by side with single appends; figures and a markdown table."""
    rows = []
    compaction: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-mixed-", dir=root) as scratch:
        for n, pattern in enumerate(patterns):
            paths = {kind: os.path.join(scratch, f"{n}-{kind}") for kind in ("single", "mixed")}
            for kind, path in paths.items():
                _write(path, pattern, records, mixed=kind == "mixed")
            rates = _side_by_side(paths, records, repeat)
            row = {"pattern": pattern.name}
            for scan, by_kind in rates.items():
                row[f"{scan} single"] = round(by_kind["single"])
                row[f"{scan} mixed"] = round(by_kind["mixed"])
                row[f"{scan} ratio"] = round(by_kind["mixed"] / by_kind["single"], 2)
            rows.append(row)
            say(f"{pattern.name}: " + ", ".join(f"{s} {row[f'{s} ratio']}x" for s in rates))
            if n == 0:
                compaction = _compaction(paths)
            for path in paths.values():
                shutil.rmtree(path)
    lowest = min(row[k] for row in rows for k in row if k.endswith("ratio"))
    return {
        "setup": {
            "records": records,
            "record": "16 B key (each twice) + value; mixed: single appends and append_batch",
            "repeat": repeat,
            "load_average": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        },
        "patterns": rows,
        "lowest_ratio": lowest,
        "compaction_seconds": {k: round(v, 3) for k, v in compaction.items()},
        "markdown": _markdown(rows, compaction, records),
    }


def _markdown(rows: list[dict[str, Any]], compaction: dict[str, float], records: int) -> str:
    scans = [*SCANS, "Table restore"]
    lines = [
        f"Mixed appends against single appends, {records:,} records; M records/s"
        " single / mixed (ratio)",
        "",
        "| Pattern | " + " | ".join(scans) + " |",
        "|---|" + "---|" * len(scans),
    ]
    for row in rows:
        cells = [
            f"{row[f'{s} single'] / 1e6:.2f} / {row[f'{s} mixed'] / 1e6:.2f}"
            f" ({row[f'{s} ratio']:.2f}x)"
            for s in scans
        ]
        lines.append(f"| {row['pattern']} | " + " | ".join(cells) + " |")
    if compaction:
        lines += [
            "",
            f"compact(force=True) of the first pattern: single {compaction['single']:.2f} s,"
            f" mixed {compaction['mixed']:.2f} s"
            f" ({compaction['single'] / compaction['mixed']:.2f}x)",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_mixed_reads")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", type=int, nargs="*", help="pattern numbers (from 0)")
    parser.add_argument("--json", action="store_true", help="print the dict as JSON")
    args = parser.parse_args(argv)
    patterns = PATTERNS if not args.only else tuple(PATTERNS[i] for i in args.only)
    result = run(args.records, args.repeat, patterns=patterns)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(result["markdown"])
        print("load average:", result["setup"]["load_average"])


if __name__ == "__main__":
    main()
