"""Spark benchmarks (issue 10): restore vs Spark's own Parquet copy, changelog reads, snapshots.

One log of ``records`` records over ``records // 10`` keys (16 B keys, 100 B values, in
10,000-record batches), then, side by side in one run and one SparkSession (``local[*]``):

``snapshot``   ``log.snapshot()`` of the full, uncompacted log (hard links, the active
               segment copied, every file's CRC computed): seconds and GB.
``changelog``  every record of that snapshot read into Spark's ``noop`` sink
               (``mode=changelog``): records/s.
``restore``    after compacting the log, :func:`compactlog.spark.restore.restore` of its
               latest state (one row per key) to Parquet, snapshot included.
``source``     the data source alone: ``spark.read.format("compactlog")`` of the
               compacted log written as Parquet (no explicit snapshot, no result file).
``parquet``    the baseline: Spark reading those same final rows from the Parquet files the
               restore wrote and writing them again as Parquet. ``restore_vs_parquet`` is
               the baseline's median time over the restore's (1.0 = as fast; the target is
               0.8); ``restore_vs_parquet_per_round`` the median of the rounds' ratios.

Each Spark measurement is the median of ``repeat`` timed runs (3 by default) after one
untimed warm-up run; every time is listed. Restore, the baseline and the source's own write
take turns within each round (:func:`_interleaved`), so a change of the machine's load
between minutes moves all three alike.

The SparkSession is started (and warmed up by one small job) before anything is timed.
Run standalone (``python -m benchmarks.bench_spark [--records N] [--json]``) or call
:func:`run`, which returns a dict.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from typing import Any

import numpy as np

import compactlog

BATCH = 10_000
KEY_BYTES = 16
VALUE_BYTES = 100


def build_log(path: str, records: int, keys: int, seed: int = 3) -> int:
    """Append ``records`` records over ``keys`` keys; returns the bytes of the segments."""
    rng = np.random.default_rng(seed)
    pool = rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes()
    names = [b"key-%012d" % i for i in range(keys)]
    assert len(names[0]) == KEY_BYTES
    with compactlog.open(path, segment_bytes=16 << 20, sync="os", min_compaction_lag_ms=0) as log:
        for start in range(0, records, BATCH):
            count = min(BATCH, records - start)
            which = rng.integers(0, keys, count).tolist()
            where = rng.integers(0, len(pool) - VALUE_BYTES, count).tolist()
            log.append_batch(
                [(names[k], pool[w : w + VALUE_BYTES]) for k, w in zip(which, where, strict=True)]
            )
        log.flush()
    return _segment_bytes(path)


def _segment_bytes(path: str) -> int:
    return sum(
        os.path.getsize(os.path.join(path, n)) for n in os.listdir(path) if n.endswith(".log")
    )


def _timed(action: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    value = action()
    return time.perf_counter() - started, value


def _median_of(repeat: int, action: Any, before: Any = None) -> tuple[float, list[float], Any]:
    """Median seconds of ``repeat`` timed runs after one untimed warm-up run (``before``
    runs untimed ahead of each)."""
    times = []
    value = None
    for i in range(repeat + 1):
        if before is not None:
            before()
        seconds, value = _timed(action)
        if i:
            times.append(seconds)
    return statistics.median(times), [round(t, 2) for t in times], value


def _interleaved(repeat: int, actions: dict[str, Any]) -> dict[str, list[float]]:
    """Seconds of each action over ``repeat`` rounds (after one untimed warm-up round), the
    actions taking turns within a round so that all of them see the same machine load (a
    shared machine's load moves between minutes; side-by-side ratios should not)."""
    times: dict[str, list[float]] = {name: [] for name in actions}
    for i in range(repeat + 1):
        for name, action in actions.items():
            seconds, _ = _timed(action)
            if i:
                times[name].append(seconds)
    return times


def run(records: int = 10_000_000, keys: int | None = None, repeat: int = 3) -> dict[str, Any]:
    """Every measurement; returns a dict of figures (and the setup)."""
    from compactlog.spark.restore import restore
    from compactlog.spark.session import local_session

    keys = keys or max(records // 10, 1)
    result: dict[str, Any] = {
        "setup": {
            "python": platform.python_version(),
            "cores": os.cpu_count(),
            "records": records,
            "keys": keys,
            "key_bytes": KEY_BYTES,
            "value_bytes": VALUE_BYTES,
            "load_average_at_start": os.getloadavg()[0],
        }
    }
    spark = local_session(
        "local[*]",
        app_name="compactlog-bench",
        shuffle_partitions=os.cpu_count() or 2,
        config={"spark.ui.showConsoleProgress": "false"},
    )
    with tempfile.TemporaryDirectory(prefix="bench-spark-", dir=os.environ.get("BENCH_DIR")) as d:
        log_path = os.path.join(d, "log")
        write_s, size = _timed(lambda: build_log(log_path, records, keys))
        result["setup"]["log_bytes"] = size
        result["setup"]["write_seconds"] = round(write_s, 2)
        # warm up the JVM and the Python workers on a tiny read
        spark.read.format("compactlog").option("endOffset", 1000).load(log_path).count()

        with compactlog.open(log_path) as log:
            snap_s, snap = _timed(lambda: log.snapshot(os.path.join(d, "full")))
        result["snapshot"] = {
            "seconds": round(snap_s, 3),
            "gb": round(snap.total_bytes / 1e9, 3),
            "seconds_per_gb": round(snap_s / (snap.total_bytes / 1e9), 3),
            "files": len(snap.files),
        }

        changelog = spark.read.format("compactlog").option("mode", "changelog")
        df = changelog.load(os.path.join(d, "full"))
        read_s, read_times, _ = _median_of(
            repeat, lambda: df.write.format("noop").mode("overwrite").save()
        )
        result["changelog"] = {
            "seconds": round(read_s, 2),
            "times": read_times,
            "records_per_s": round(records / read_s),
            "partitions": df.rdd.getNumPartitions(),
        }

        with compactlog.open(log_path) as log:
            compact_s, _stats = _timed(lambda: log.compact(force=True))
        result["setup"]["compact_seconds"] = round(compact_s, 2)
        result["setup"]["compacted_bytes"] = _segment_bytes(log_path)

        out = os.path.join(d, "restored")
        copy = os.path.join(d, "copied")
        restored = restore(log_path, out, spark=spark)  # the baseline's input, and a warm-up
        source = spark.read.format("compactlog").load(log_path)

        def fresh_restore() -> Any:
            shutil.rmtree(out + ".again", ignore_errors=True)
            return restore(log_path, out + ".again", spark=spark)

        rounds = _interleaved(
            repeat,
            {
                "restore": fresh_restore,
                "parquet": lambda: spark.read.parquet(out).write.mode("overwrite").parquet(copy),
                "source_to_parquet": lambda: source.write.mode("overwrite").parquet(copy),
            },
        )
        rows = restored.rows
        for name, times in rounds.items():
            seconds = statistics.median(times)
            result[name] = {
                "seconds": round(seconds, 3),
                "times": [round(t, 3) for t in times],
                "rows": rows,
                "rows_per_s": round(rows / seconds),
            }
        parquet_s = result["parquet"]["seconds"]
        result["restore_vs_parquet"] = round(parquet_s / result["restore"]["seconds"], 3)
        result["restore_vs_parquet_per_round"] = round(
            statistics.median(
                p / r for p, r in zip(rounds["parquet"], rounds["restore"], strict=True)
            ),
            3,
        )
        result["source_write_vs_parquet"] = round(
            parquet_s / result["source_to_parquet"]["seconds"], 3
        )
        shutil.rmtree(os.path.join(d, "full"), ignore_errors=True)
    result["setup"]["load_average_at_end"] = os.getloadavg()[0]
    result["targets_met"] = {
        "restore_at_least_0.8x_parquet": result["restore_vs_parquet"] >= 0.8,
        "changelog_1.5M_records_per_s": result["changelog"]["records_per_s"] >= 1_500_000,
        "snapshot_1GB_under_1s": result["snapshot"]["seconds_per_gb"] < 1.0,
    }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_spark", description=__doc__)
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--keys", type=int)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.records, args.keys, args.repeat)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
