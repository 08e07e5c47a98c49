"""Compaction benchmark: a full compaction of a keyed changelog vs an SQLite latest table.

    python -m benchmarks.bench_compaction                  # 10,000,000 records
    python -m benchmarks.bench_compaction --records 1000000
    python -m benchmarks.bench_compaction --partial-only     # issue 8's partial passes
    python -m benchmarks.bench_compaction --small-map 250000 1000000   # issue 33

Workload (issue 4): ``records`` records, 16-byte keys over ``records // 10`` distinct keys
(uniformly drawn), 100-byte values, 5% tombstones, appended with ``append_batch`` in
batches of 10,000 (``sync="os"``). Then ``compact(force=True)`` repeats until the cleaner
point reaches the active segment, with ``cleaner_buffer_bytes`` = 16 MiB (the map holds
699,050 keys, fewer than the distinct keys: it takes several passes). The compaction runs in
a child process so that its peak RSS is its own: ``peak_rss_over_baseline_bytes`` is the
child's VmHWM minus its VmHWM after importing ``compactlog.compaction`` (numpy and friends)
and opening the log, to compare with ``peak_rss_limit_bytes`` (buffer + 64 MiB, issue 4).
Nothing traces allocations during the timed passes (``tracemalloc`` slowed them by ~40%);
``compaction_cpu_seconds`` is the child's CPU time. The output is checked against a model
(the last record of each key): the latest value of every live key is present, every
deleted key reads as deleted, offsets ascend.

Partial passes (issue 8, :func:`run_partial`, reported under ``partial``): 20,000 records
(10-byte keys over 5,000 distinct keys, 64-byte values, appended 10 at a time) in 2 KiB
segments, compacted with ``cleaner_buffer_bytes=4096`` (a map of 170 keys: over a hundred
passes) until the cleaner point reaches the active segment. It measures the fixed cost a
pass pays per segment and how much of the head a pass reads for its map
(``map_bytes_read``), which used to be the whole head.

Small map (issue 33, :func:`run_small_map`, ``--small-map N ...``): ``N`` records, keys of
16-24 bytes over ``N // 10`` distinct keys, 100-byte values, 5% tombstones, appended in
batches of 1,000 into 4 MiB segments, compacted with ``cleaner_buffer_bytes`` = 256 KiB
(10,922 keys) until the cleaner point reaches the first uncleanable offset, in a child
process. It reports the passes, the CPU microseconds per record and the bytes read and
written (log and spill files) per byte of log: flat in ``N`` when compaction is linear.

The same job without compactlog: an SQLite table ``latest(k BLOB PRIMARY KEY, v BLOB)``
fed with ``INSERT OR REPLACE`` in transactions of 10,000 rows (WAL, ``synchronous=NORMAL``),
tombstones written as NULL and purged at the end with one ``DELETE``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
BATCH = 10_000
KEY_BYTES = 16
VALUE_BYTES = 100
TOMBSTONE_SHARE = 0.05
BUFFER_BYTES = 16 << 20
SEGMENT_BYTES = 32 << 20
MB = 1_000_000


def make_workload(records: int, seed: int = 7) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(key ids, key table (distinct, 16 bytes each), tombstone mask)."""
    rng = np.random.default_rng(seed)
    distinct = max(records // 10, 1)
    ids = rng.integers(0, distinct, size=records, dtype=np.int64)
    table = np.zeros((distinct, KEY_BYTES), dtype=np.uint8)
    table[:, :8] = np.arange(distinct, dtype=">u8").view(np.uint8).reshape(distinct, 8)
    table[:, 8:] = rng.integers(0, 256, size=(distinct, 8), dtype=np.uint8)
    tombstones = rng.random(records) < TOMBSTONE_SHARE
    return ids, table, tombstones


def _columns(
    lo: int, hi: int, ids: np.ndarray, table: np.ndarray, tombstones: np.ndarray
) -> tuple[list[bytes], list[bytes | None]]:
    n = hi - lo
    kb = table[ids[lo:hi]].tobytes()
    keys = [kb[i : i + KEY_BYTES] for i in range(0, n * KEY_BYTES, KEY_BYTES)]
    values_arr = np.full((n, VALUE_BYTES), ord("v"), dtype=np.uint8)
    values_arr[:, :8] = np.arange(lo, hi, dtype=">u8").view(np.uint8).reshape(n, 8)
    vb = values_arr.tobytes()
    dead = tombstones[lo:hi]
    values: list[bytes | None] = [
        None if dead[j] else vb[j * VALUE_BYTES : (j + 1) * VALUE_BYTES] for j in range(n)
    ]
    return keys, values


def write_log(path: Path, ids: np.ndarray, table: np.ndarray, tombstones: np.ndarray) -> float:
    import compactlog

    started = time.perf_counter()
    with compactlog.open(
        path,
        segment_bytes=SEGMENT_BYTES,
        cleaner_buffer_bytes=BUFFER_BYTES,
        sync="os",
        segment_ms=None,
        retention_ms=None,
    ) as log:
        for lo in range(0, len(ids), BATCH):
            keys, values = _columns(lo, min(lo + BATCH, len(ids)), ids, table, tombstones)
            log.append_batch(list(zip(keys, values, strict=True)))
        log.flush()
    return time.perf_counter() - started


_CHILD = r"""
import json, sys, time
import compactlog
import compactlog.compaction  # numpy, zstandard, crc32c: the library's own footprint

def hwm():  # VmHWM: peak RSS of this process image (ru_maxrss survives exec on Linux)
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0

path = sys.argv[1]
log = compactlog.open(path)
baseline = hwm()  # after the imports and the open: what compaction adds is measured
passes = []
cpu = time.process_time()
started = time.perf_counter()
while True:
    st = log.compact(force=True)
    passes.append(st.to_dict())
    if not st.cleaned or not st.map_full:
        break
elapsed = time.perf_counter() - started
cpu = time.process_time() - cpu
log.close()
print(json.dumps({"elapsed": elapsed, "cpu": cpu, "passes": passes, "baseline_rss": baseline,
                  "peak_rss": hwm()}))
"""


def run_child(script: str, path: Path) -> dict[str, Any]:
    """Run a compaction ``script`` on the log at ``path`` in a child process; its last
    line of output, as JSON."""
    out = subprocess.run(
        [sys.executable, "-c", script, str(path)],
        check=True,
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def compact_in_child(path: Path) -> dict[str, Any]:
    return run_child(_CHILD, path)


def check_output(
    path: Path, ids: np.ndarray, table: np.ndarray, tombstones: np.ndarray
) -> dict[str, int]:
    """Compare the compacted log with the model: last record per key."""
    import compactlog
    from compactlog.engine.latest import latest_batches

    distinct = len(table)
    last = np.full(distinct, -1, dtype=np.int64)
    last[ids] = np.arange(len(ids))  # numpy keeps the last assignment of repeated indexes
    live = (last >= 0) & ~tombstones[np.maximum(last, 0)]
    seen_last = np.full(distinct, -1, dtype=np.int64)
    seen_is_value = np.zeros(distinct, dtype=bool)
    records = 0
    previous = -1
    with compactlog.open(path, read_only=True) as log:
        for batch in log.read_batches():
            offsets = batch.offsets
            if len(offsets) and (offsets[0] <= previous or (np.diff(offsets) <= 0).any()):
                raise AssertionError("offsets do not ascend")
            previous = int(offsets[-1]) if len(offsets) else previous
            keys = np.frombuffer(bytes(batch.keys_blob), dtype=np.uint8).reshape(-1, KEY_BYTES)
            key_ids = keys[:, :8].copy().view(">u8").ravel().astype(np.int64)
            seen_last[key_ids] = offsets
            seen_is_value[key_ids] = batch.value_lengths >= 0
            records += len(offsets)
        latest_count = sum(len(b) for b in latest_batches(log))
    # offsets equal record indexes here (one log, appended from 0)
    if not (seen_last[live] == last[live]).all():
        raise AssertionError("a live key's latest value is missing")
    if (seen_is_value[~live] & (seen_last[~live] >= 0)).any():
        raise AssertionError("a deleted key reads as live")
    if latest_count != int(live.sum()):
        raise AssertionError(f"latest() gave {latest_count} keys, model {int(live.sum())}")
    return {"records_after": records, "live_keys": int(live.sum())}


def sqlite_latest(path: Path, ids: np.ndarray, table: np.ndarray, tombstones: np.ndarray) -> float:
    started = time.perf_counter()
    db = sqlite3.connect(path)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("CREATE TABLE latest (k BLOB PRIMARY KEY, v BLOB)")
    for lo in range(0, len(ids), BATCH):
        keys, values = _columns(lo, min(lo + BATCH, len(ids)), ids, table, tombstones)
        with db:
            db.executemany(
                "INSERT OR REPLACE INTO latest VALUES (?, ?)", zip(keys, values, strict=True)
            )
    with db:
        db.execute("DELETE FROM latest WHERE v IS NULL")
    db.close()
    return time.perf_counter() - started


def _flat(document: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    pairs: list[tuple[str, Any]] = []
    for name, value in document.items():
        if isinstance(value, dict):
            pairs.extend(_flat(value, f"{prefix}{name}."))
        else:
            pairs.append((f"{prefix}{name}", value))
    return pairs


def run(records: int = 10_000_000, *, sqlite: bool = True, root: Path | None = None) -> dict:
    """Build, compact, check and compare; returns the figures as a dict."""
    base = Path(tempfile.mkdtemp(prefix="bench-compaction-", dir=root))
    try:
        ids, table, tombstones = make_workload(records)
        log_path = base / "log"
        append_s = write_log(log_path, ids, table, tombstones)
        size_before = sum(f.stat().st_size for f in log_path.glob("*.log"))
        child = compact_in_child(log_path)
        size_after = sum(f.stat().st_size for f in log_path.glob("*.log"))
        passes = child["passes"]
        elapsed = child["elapsed"]
        read = sum(p["bytes_read"] + p["map_bytes_read"] + p["verify_bytes_read"] for p in passes)
        map_s = sum(p["map_seconds"] for p in passes)
        clean_s = sum(p["clean_seconds"] for p in passes)
        written = sum(p["bytes_written"] for p in passes)
        first_uncleanable = passes[-1]["first_uncleanable_offset"]
        checked = check_output(log_path, ids, table, tombstones)
        capacity = passes[0]["map_capacity"]
        result: dict[str, Any] = {
            "records": records,
            "distinct_keys": len(table),
            "passes": len(passes),
            "records_compacted": first_uncleanable,
            "compaction_seconds": elapsed,
            "compaction_records_per_s": first_uncleanable / elapsed,
            "map_seconds": map_s,
            "clean_seconds": clean_s,
            "mb_read_per_s": read / MB / elapsed,
            "mb_written_per_s": written / MB / elapsed,
            "bytes_read": read,
            "bytes_written": written,
            "log_bytes_before": size_before,
            "log_bytes_after": size_after,
            "map_bytes_per_key": BUFFER_BYTES / capacity,
            "map_capacity_keys": capacity,
            "cleaner_buffer_bytes": BUFFER_BYTES,
            "peak_rss_bytes": child["peak_rss"],
            "baseline_rss_bytes": child["baseline_rss"],
            "peak_rss_over_baseline_bytes": child["peak_rss"] - child["baseline_rss"],
            "peak_rss_limit_bytes": BUFFER_BYTES + (64 << 20),
            "compaction_cpu_seconds": child["cpu"],
            "append_seconds": append_s,
            "append_records_per_s": records / append_s,
            **checked,
            "partial": run_partial(root),
        }
        if sqlite:
            sqlite_s = sqlite_latest(base / "latest.sqlite", ids, table, tombstones)
            result["sqlite_seconds"] = sqlite_s
            result["sqlite_records_per_s"] = records / sqlite_s
            result["ratio_compaction_vs_sqlite"] = (first_uncleanable / elapsed) / (
                records / sqlite_s
            )
            result["ratio_append_plus_compaction_vs_sqlite"] = sqlite_s / (append_s + elapsed)
        return result
    finally:
        shutil.rmtree(base, ignore_errors=True)


PARTIAL_RECORDS = 20_000
PARTIAL_KEYS = 5_000
PARTIAL_SEGMENT_BYTES = 2048
PARTIAL_BUFFER_BYTES = 4096

_PARTIAL_CHILD = r"""
import json, sys, time
import compactlog
import compactlog.compaction

log = compactlog.open(sys.argv[1])
passes = map_read = read = 0
started = time.perf_counter()
while True:
    st = log.compact(force=True)
    passes += 1
    map_read += st.map_bytes_read
    read += st.bytes_read + st.map_bytes_read + st.verify_bytes_read
    if passes == 1:
        first = {"map_bytes_read": st.map_bytes_read, "dirty_bytes": st.dirty_bytes}
    if not st.cleaned or st.new_first_dirty_offset >= st.first_uncleanable_offset:
        break
elapsed = time.perf_counter() - started
log.close()
print(json.dumps({"elapsed": elapsed, "passes": passes, "map_bytes_read": map_read,
                  "bytes_read": read, "first_pass": first}))
"""


def run_partial(root: Path | None = None) -> dict[str, Any]:
    """Compact issue 8's many-small-segments log to a stable state (see the module
    docstring); the compaction runs in a child process, as in :func:`run`."""
    import compactlog

    base = Path(tempfile.mkdtemp(prefix="bench-partial-", dir=root))
    try:
        path = base / "log"
        with compactlog.open(
            path,
            segment_bytes=PARTIAL_SEGMENT_BYTES,
            cleaner_buffer_bytes=PARTIAL_BUFFER_BYTES,
            sync="os",
            segment_ms=None,
            retention_ms=None,
        ) as log:
            for lo in range(0, PARTIAL_RECORDS, 10):
                log.append_batch(
                    [(b"key-%06d" % (i % PARTIAL_KEYS), b"v" * 64) for i in range(lo, lo + 10)]
                )
        segments = len(list(path.glob("*.log")))
        child = run_child(_PARTIAL_CHILD, path)
        with compactlog.open(path, read_only=True) as log:
            from compactlog.engine.latest import latest_dict

            live = latest_dict(log)
        expected = {b"key-%06d" % k: b"v" * 64 for k in range(PARTIAL_KEYS)}
        if live != expected:
            raise AssertionError("partial passes: the latest state differs from the model")
        return {
            "records": PARTIAL_RECORDS,
            "segments_before": segments,
            "segments_after": len(list(path.glob("*.log"))),
            "passes": child["passes"],
            "seconds_to_stable": child["elapsed"],
            "ms_per_pass": 1000 * child["elapsed"] / child["passes"],
            "map_bytes_read_total": child["map_bytes_read"],
            "bytes_read_total": child["bytes_read"],
            "first_pass_map_bytes_read": child["first_pass"]["map_bytes_read"],
            "first_pass_dirty_bytes": child["first_pass"]["dirty_bytes"],
        }
    finally:
        shutil.rmtree(base, ignore_errors=True)


SMALL_MAP_BUFFER_BYTES = 256 << 10
SMALL_MAP_BATCH = 1_000
SMALL_MAP_SEGMENT_BYTES = 4 << 20

_SMALL_MAP_CHILD = r"""
import json, sys, time
import compactlog
import compactlog.compaction

log = compactlog.open(sys.argv[1])
passes = read = written = spill = 0
cpu = time.process_time()
while True:
    st = log.compact(force=True)
    passes += 1
    read += st.bytes_read + st.map_bytes_read + st.verify_bytes_read
    written += st.bytes_written
    spill += getattr(st, "spill_bytes_read", 0) + getattr(st, "spill_bytes_written", 0)
    if not st.cleaned or st.new_first_dirty_offset >= st.first_uncleanable_offset:
        break
cpu = time.process_time() - cpu
log.close()
print(json.dumps({"cpu": cpu, "passes": passes, "read": read, "written": written,
                  "spill": spill}))
"""


def write_small_map_log(path: Path, records: int, seed: int = 7) -> int:
    """Issue 33's workload (module docstring); returns the log's bytes."""
    import compactlog

    rng = np.random.default_rng(seed)
    distinct = max(records // 10, 1)
    ids = rng.integers(0, distinct, size=records, dtype=np.int64)
    dead = rng.random(records) < TOMBSTONE_SHARE
    value = b"v" * VALUE_BYTES
    with compactlog.open(
        path,
        cleaner_buffer_bytes=SMALL_MAP_BUFFER_BYTES,
        segment_bytes=SMALL_MAP_SEGMENT_BYTES,
        sync="os",
        segment_ms=None,
        retention_ms=None,
    ) as log:
        for lo in range(0, records, SMALL_MAP_BATCH):
            chunk = ids[lo : lo + SMALL_MAP_BATCH].tolist()
            gone = dead[lo : lo + SMALL_MAP_BATCH].tolist()
            log.append_batch(
                [
                    # 16 to 24 bytes: "key-" + 12 digits + 0 to 8 filler bytes
                    (b"key-%012d" % k + b"x" * (k % 9), None if g else value)
                    for k, g in zip(chunk, gone, strict=True)
                ]
            )
        log.flush()
    return sum(f.stat().st_size for f in path.glob("*.log"))


def run_small_map(sizes: list[int], root: Path | None = None) -> dict[str, Any]:
    """Issue 33: compaction with a 256 KiB map at each size (see the module docstring)."""
    result: dict[str, Any] = {}
    for records in sizes:
        base = Path(tempfile.mkdtemp(prefix="bench-small-map-", dir=root))
        try:
            path = base / "log"
            log_bytes = write_small_map_log(path, records)
            child = run_child(_SMALL_MAP_CHILD, path)
            result[f"n{records}"] = {
                "records": records,
                "log_bytes": log_bytes,
                "passes": child["passes"],
                "cpu_us_per_record": 1e6 * child["cpu"] / records,
                "read_per_log_byte": child["read"] / log_bytes,
                "written_per_log_byte": child["written"] / log_bytes,
                "spill_per_log_byte": child["spill"] / log_bytes,
            }
        finally:
            shutil.rmtree(base, ignore_errors=True)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--no-sqlite", action="store_true")
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory")
    parser.add_argument(
        "--partial-only", action="store_true", help="only the partial-passes workload"
    )
    parser.add_argument(
        "--small-map", type=int, nargs="+", default=None, help="issue 33: sizes to compact"
    )
    args = parser.parse_args(argv)
    if args.small_map:
        result = run_small_map(args.small_map, args.dir)
    elif args.partial_only:
        result = run_partial(args.dir)
    else:
        result = run(args.records, sqlite=not args.no_sqlite, root=args.dir)
    width = max(map(len, result))
    for name, value in _flat(result):
        shown = f"{value:,.2f}" if isinstance(value, float) else f"{value:,}"
        print(f"{name:<{width + 20}}  {shown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
