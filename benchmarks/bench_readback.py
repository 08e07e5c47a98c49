"""Reading back a log written by single appends, before and after one compaction pass.

Workload: ``records`` records of a 16 B key + 100 B value, every key distinct, each
written by its own ``log.append`` (so every record is a one-record batch on disk, as
JLog's users and most changelog producers write). The values are one repeated 100-byte
string (as in ``bench_jlog``) or, with ``--random-values``, random bytes: the first lets the
reader check the CRCs of a run with table lookups on the few byte columns that vary
(``row_crcs.rows_crcs``), the second costs one ``crc32c`` call per batch. With
``--varied-sizes`` the values are random bytes of a random length from 50 to 150 (so the
stored batches differ in length from append to append, and the reader cannot treat a run
as rows of one length). Then, each the median of ``repeat`` full scans:

``read()``          ``Record`` objects, the whole log
``read_batches()``  columnar batches (runs of small batches come back as one batch)

measured once on the log as written and again after one forced compaction pass, which
merges runs of small batches into batches of up to ``cleaner_merge_batch_bytes``. The
active segment (the newest ``segment_bytes``: 16 MiB, a tenth of the log for small runs)
is never cleaned, so the "after" figures include that uncleaned tail. Also reported:
bytes of segment files before and after, and the pass's own time.

Run standalone (``python -m benchmarks.bench_readback [--records N] [--json]``) or call
:func:`run`, which returns a dict (``benchmarks.run`` adds it to the report).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import compactlog

from .common import median_rate

VALUE = b"v" * 100
SEGMENT_BYTES = 16 << 20
STORED_RECORD = 48 + 8 + 16 + 100  # a one-record batch of this workload


def segment_bytes_for(records: int) -> int:
    """16 MiB, or less for a small run so that most of the log is in closed segments."""
    return max(16 << 10, min(SEGMENT_BYTES, records * STORED_RECORD // 10))


def _write(
    path: str, records: int, random_values: bool = False, varied_sizes: bool = False
) -> float:
    config = {"sync": "os", "segment_bytes": segment_bytes_for(records)}
    if varied_sizes:
        values = _varied_values(records)
    else:
        values = _random_values(records) if random_values else [VALUE] * records
    with compactlog.open(path, **config) as log:
        append = log.append
        started = time.perf_counter()
        for i, value in enumerate(values):
            append(b"%016d" % i, value)
        elapsed = time.perf_counter() - started
    return records / elapsed


def _random_values(records: int) -> list[bytes]:
    data = random.Random(12).randbytes(records * len(VALUE))
    return [data[i : i + len(VALUE)] for i in range(0, len(data), len(VALUE))]


def _varied_values(records: int) -> list[bytes]:
    """Random bytes of a random length in [50, 150] each (100 on average, as the others)."""
    rng = random.Random(13)
    data = rng.randbytes(records * 150)
    lengths = [rng.randint(50, 150) for _ in range(records)]
    return [data[i * 150 : i * 150 + n] for i, n in enumerate(lengths)]


def _segment_bytes(path: str) -> int:
    return sum(p.stat().st_size for p in Path(path).glob("*.log"))


def _scans(path: str, records: int, repeat: int) -> dict[str, float]:
    with compactlog.open(path, read_only=True) as log:
        return {
            "read_records_per_s": median_rate(lambda: sum(1 for _ in log.read()), records, repeat),
            "read_batches_records_per_s": median_rate(
                lambda: sum(len(b) for b in log.read_batches()), records, repeat
            ),
            "stored_batches_per_read_batch": _stored_per_batch(log),
        }


def _stored_per_batch(log: Any) -> float:
    batches = list(log.read_batches())
    return sum(b.stored_batches for b in batches) / max(len(batches), 1)


def run(
    records: int = 1_000_000,
    repeat: int = 3,
    root: str | None = None,
    random_values: bool = False,
    varied_sizes: bool = False,
) -> dict[str, Any]:
    """Write, scan, compact, scan again; figures as a dict."""
    with tempfile.TemporaryDirectory(prefix="bench-readback-", dir=root) as scratch:
        path = os.path.join(scratch, "log")
        append_rate = _write(path, records, random_values, varied_sizes)
        before_bytes = _segment_bytes(path)
        before = _scans(path, records, repeat)
        with compactlog.open(path) as log:
            started = time.perf_counter()
            stats = log.compact(force=True)
            compact_seconds = time.perf_counter() - started
        after_bytes = _segment_bytes(path)
        after = _scans(path, records, repeat)
    return {
        "setup": {
            "records": records,
            "record": "16 B key + 100 B value, distinct keys, one log.append each",
            "values": (
                "random bytes of 50-150 B"
                if varied_sizes
                else "random bytes"
                if random_values
                else "one repeated string"
            ),
            "segment_bytes": segment_bytes_for(records),
            "repeat": repeat,
            "load_average": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        },
        "write": {"single_appends_per_s": round(append_rate)},
        "as_written": {
            **{k: round(v, 1) for k, v in before.items()},
            "segment_bytes_on_disk": before_bytes,
        },
        "after_one_compaction": {
            **{k: round(v, 1) for k, v in after.items()},
            "segment_bytes_on_disk": after_bytes,
            "compaction_seconds": round(compact_seconds, 2),
            "batches_merged": stats.batches_merged,
        },
        "shrink": round(after_bytes / before_bytes, 3) if before_bytes else None,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_readback")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="print the dict as JSON")
    parser.add_argument(
        "--random-values", action="store_true", help="random 100-byte values (default: one)"
    )
    parser.add_argument(
        "--varied-sizes",
        action="store_true",
        help="random values of 50-150 bytes (records of varied sizes)",
    )
    args = parser.parse_args(argv)
    result = run(
        args.records,
        args.repeat,
        random_values=args.random_values,
        varied_sizes=args.varied_sizes,
    )
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for section, figures in result.items():
        if isinstance(figures, dict):
            print(section)
            for name, value in figures.items():
                shown = f"{value:,}" if isinstance(value, int | float) else value
                print(f"  {name:32} {shown}")
        else:
            print(f"{section:34} {figures}")


if __name__ == "__main__":
    main()
