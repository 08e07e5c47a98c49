"""Spark reading a log's archive from ``s3://`` against reading the log's directory.

A log of ``records`` records (``bench_spark.build_log``: ``records // 10`` keys) pushed once
to SeaweedFS (``--seaweed``) or ``--url``; then, alternating ``--repeat`` times,
``spark.read.format("compactlog").load(SOURCE).write.parquet(OUT)`` with SOURCE the local
directory and the archive URL (the latest value per key, written as Parquet: a restore).
The ratio is local time / archive time (the issue's target: 0.7x or better).

Run: ``python -m benchmarks.bench_archive_spark --seaweed --records 1000000``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path

from compactlog.archive import open_store
from compactlog.archive.push import push_once

from .archive_store import add_store_options, archive_store
from .bench_spark import build_log


def run(url: str, records: int, repeat: int, scratch: Path, say=print) -> dict:
    from compactlog.spark import register
    from compactlog.spark.session import local_session

    log_path = str(scratch / "log")
    build_log(log_path, records, max(records // 10, 1))
    push_once(log_path, open_store(url))
    spark = local_session(
        "local[*]",
        app_name="bench-archive-spark",
        shuffle_partitions=os.cpu_count() or 2,
        config={"spark.ui.showConsoleProgress": "false"},
    )
    register(spark)

    def restore(source: str, out: Path) -> float:
        started = time.perf_counter()
        spark.read.format("compactlog").load(source).write.parquet(str(out))
        seconds = time.perf_counter() - started
        shutil.rmtree(out)
        return seconds

    restore(log_path, scratch / "warm-local")
    restore(url, scratch / "warm-s3")
    times: dict[str, list[float]] = {"local": [], "archive": []}
    for i in range(repeat):
        times["local"].append(restore(log_path, scratch / f"local-{i}"))
        times["archive"].append(restore(url, scratch / f"archive-{i}"))
        say(f"round {i}: local {times['local'][-1]:.2f}s archive {times['archive'][-1]:.2f}s")
    local_s, archive_s = (statistics.median(times[k]) for k in ("local", "archive"))
    return {
        "records": records,
        "local_s": local_s,
        "archive_s": archive_s,
        "archive_vs_local": local_s / archive_s,
        "times": times,
        "load": os.getloadavg()[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_store_options(parser)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with archive_store(args, "bench-archive-spark-") as (url, scratch):
        result = run(url, args.records, args.repeat, scratch)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
