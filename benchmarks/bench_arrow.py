"""Arrow in and out, side by side with the Python-object and columnar paths, in one run.

Workload: ``records`` records of a 16 B key + 100 B random value, every key distinct,
appended in calls of ``chunk`` rows (the same rows each way: a list of ``(key, value)``
pairs for ``append_batch``, a ``pyarrow.Table`` for ``append_arrow``, both built before
the clock starts; each way into a fresh log, ``sync="os"``, flushed at the end). Then, each
the median of ``repeat`` runs:

``append_batch`` / ``append_arrow``     records/s of the appends above (the clock runs
                                        from the first call to the end of the flush)
``read_batches`` / ``read_arrow``       a full scan (``read_arrow`` builds one ``pyarrow.Table``);
                                        ``read_batches kept`` keeps every batch until the
                                        scan ends, as a table must (the active segment's
                                        batches are ``pread`` copies, not mapped views)
``latest_batches`` / ``latest_arrow``   the latest state, on the compacted log

and the restore of that compacted log to Parquet by ``compactlog restore`` run as a
subprocess (so the Spark engine's start-up, a JVM and a local session on every core, is
included, as is the Arrow engine's Python start-up), once per engine (``spark_repeat``
times for Spark: a run takes tens of seconds). Targets (issue 19): ``append_arrow`` >= 2x
``append_batch``, ``read_arrow`` >= 0.8x ``read_batches``, the Arrow restore >= 10x faster.

Run standalone (``python -m benchmarks.bench_arrow [--records N] [--no-spark] [--json]``)
or call :func:`run`, which returns a dict (``benchmarks.run`` adds it to the report).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import pyarrow as pa

import compactlog

from .common import median_rate

KEY_BYTES = 16
VALUE_BYTES = 100
CHUNK = 10_000


def _rows(records: int) -> tuple[list[bytes], list[bytes]]:
    data = random.Random(19).randbytes(records * VALUE_BYTES)
    keys = [b"%016d" % i for i in range(records)]
    values = [data[i * VALUE_BYTES : (i + 1) * VALUE_BYTES] for i in range(records)]
    return keys, values


def _append_rates(
    scratch: str, keys: list[bytes], values: list[bytes], chunk: int, repeat: int
) -> dict[str, float]:
    n = len(keys)
    pairs = [
        list(zip(keys[i : i + chunk], values[i : i + chunk], strict=True))
        for i in range(0, n, chunk)
    ]
    tables = [
        pa.table(
            {
                "key": pa.array(keys[i : i + chunk], pa.binary()),
                "value": pa.array(values[i : i + chunk], pa.binary()),
            }
        )
        for i in range(0, n, chunk)
    ]
    rates = {}
    for name, items, method in (
        ("append_batch", pairs, "append_batch"),
        ("append_arrow", tables, "append_arrow"),
    ):

        def once(items: list[Any] = items, method: str = method) -> float:
            path = os.path.join(scratch, "append")
            shutil.rmtree(path, ignore_errors=True)
            with compactlog.open(path, sync="os") as log:
                append = getattr(log, method)
                started = time.perf_counter()
                for item in items:
                    append(item)
                log.flush()
                seconds = time.perf_counter() - started
                if log.end_offset != n:
                    raise AssertionError(f"{log.end_offset} records, not {n}")
            return seconds

        rates[name] = n / statistics.median(once() for _ in range(repeat))
    shutil.rmtree(os.path.join(scratch, "append"), ignore_errors=True)
    return rates


def _restore_seconds(log_path: str, out: str, engine: str) -> float:
    shutil.rmtree(out, ignore_errors=True)
    cli = os.path.join(os.path.dirname(sys.executable), "compactlog")
    started = time.perf_counter()
    subprocess.run(
        [cli, "restore", log_path, "--to", out, "--engine", engine, "--json"],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    seconds = time.perf_counter() - started
    with open(os.path.join(out, "_compactlog.json"), "rb") as handle:
        document = json.loads(handle.read())
    if document["engine"] != engine:
        raise AssertionError(f"restore ran {document['engine']}, not {engine}")
    return seconds


def run(
    records: int = 1_000_000,
    repeat: int = 3,
    root: str | None = None,
    spark: bool = True,
    spark_repeat: int = 1,
    chunk: int = CHUNK,
) -> dict[str, Any]:
    """Append, scan, compact, take the latest state, restore; figures as a dict."""
    keys, values = _rows(records)
    with tempfile.TemporaryDirectory(prefix="bench-arrow-", dir=root) as scratch:
        appends = _append_rates(scratch, keys, values, chunk, repeat)
        path = os.path.join(scratch, "log")
        with compactlog.open(path, sync="os", min_compaction_lag_ms=0) as log:
            for i in range(0, records, chunk):
                log.append_batch(list(zip(keys[i : i + chunk], values[i : i + chunk], strict=True)))
            log.flush()
            log.compact(force=True)
        with compactlog.open(path, read_only=True) as log:
            scans = {
                "read_batches": median_rate(
                    lambda: sum(len(b) for b in log.read_batches()), records, repeat
                ),
                "read_batches kept": median_rate(
                    lambda: sum(map(len, list(log.read_batches()))), records, repeat
                ),
                "read_arrow": median_rate(lambda: log.read_arrow().num_rows, records, repeat),
                "latest_batches": median_rate(
                    lambda: sum(len(b) for b in log.latest_batches()), records, repeat
                ),
                "latest_arrow": median_rate(lambda: log.latest_arrow().num_rows, records, repeat),
            }
        out = os.path.join(scratch, "table")
        arrow_s = statistics.median(_restore_seconds(path, out, "arrow") for _ in range(repeat))
        spark_s = None
        if spark:
            spark_s = statistics.median(
                _restore_seconds(path, out, "spark") for _ in range(spark_repeat)
            )
    rates = {**appends, **scans}
    return {
        "setup": {
            "records": records,
            "record": f"{KEY_BYTES} B key + {VALUE_BYTES} B random value, distinct keys",
            "rows per append call": chunk,
            "repeat": repeat,
            "cpus": os.cpu_count(),
            "load_average": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        },
        "records_per_s": {k: round(v) for k, v in rates.items()},
        "ratios": {
            "append_arrow / append_batch": round(rates["append_arrow"] / rates["append_batch"], 2),
            "read_arrow / read_batches": round(rates["read_arrow"] / rates["read_batches"], 2),
            "read_arrow / read_batches kept": round(
                rates["read_arrow"] / rates["read_batches kept"], 2
            ),
            "latest_arrow / latest_batches": round(
                rates["latest_arrow"] / rates["latest_batches"], 2
            ),
            "restore: spark seconds / arrow seconds": (
                round(spark_s / arrow_s, 1) if spark_s is not None else None
            ),
        },
        "restore_seconds": {
            "arrow": round(arrow_s, 2),
            "spark": round(spark_s, 2) if spark_s is not None else None,
        },
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_arrow")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--chunk", type=int, default=CHUNK, help="rows per append call")
    parser.add_argument("--no-spark", action="store_true", help="skip the Spark restore")
    parser.add_argument("--json", action="store_true", help="print the dict as JSON")
    args = parser.parse_args(argv)
    result = run(args.records, args.repeat, spark=not args.no_spark, chunk=args.chunk)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for section, figures in result.items():
        print(section)
        for name, value in figures.items():
            shown = f"{value:,}" if isinstance(value, int | float) else value
            print(f"  {name:40} {shown}")


if __name__ == "__main__":
    main()
