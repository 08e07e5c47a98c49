"""Shared pieces of the benchmarks: timing, peak memory, test data, SQLite, scratch dirs.

A *trial* is a generator function: the code before its first ``yield`` is untimed setup,
the code between the first and second ``yield`` is what is timed, the rest is untimed
teardown. :func:`measure` runs warm-up trials, then timed repetitions, then one more trial
under ``tracemalloc`` for the peak memory of the timed part (that trial is never timed).
"""

from __future__ import annotations

import gc
import os
import platform
import shutil
import sqlite3
import statistics
import tempfile
import tracemalloc
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from time import perf_counter
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
BENCH_ROOT = REPO_ROOT / "bench-data"
MB = 1_000_000

Trial = Callable[[], Generator[None, None, None]]


class BenchmarkError(AssertionError):
    """A benchmark read back something other than what it wrote."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise BenchmarkError(message)


def timed_runs(run: Callable[[], int], repeat: int, expect: int, what: str) -> list[float]:
    """The times of ``repeat`` calls of ``run``, each checked to return ``expect``
    (``what`` names the count in the error)."""
    times = []
    for _ in range(repeat):
        started = perf_counter()
        got = run()
        times.append(perf_counter() - started)
        if got != expect:
            raise BenchmarkError(f"{what}: {got}, not {expect}")
    return times


@dataclass
class Measurement:
    """One system running one workload: ``records`` records and ``nbytes`` bytes per run."""

    workload: str
    system: str
    records: int
    nbytes: int
    times: list[float]
    memory: Memory | None = None
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def p90(self) -> float:
        return float(np.percentile(self.times, 90))

    @property
    def records_per_s(self) -> float:
        return self.records / self.median

    @property
    def mb_per_s(self) -> float:
        return self.nbytes / MB / self.median

    def as_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "system": self.system,
            "records": self.records,
            "bytes": self.nbytes,
            "times_s": self.times,
            "median_s": self.median,
            "p90_s": self.p90,
            "records_per_s": self.records_per_s,
            "mb_per_s": self.mb_per_s,
            "peak_traced_bytes": self.memory.traced if self.memory else None,
            "peak_rss_growth_bytes": self.memory.rss_growth if self.memory else None,
            "note": self.note,
            **self.extra,
        }


def _status_kib(field_name: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_rss_peak() -> bool:
    """Reset the kernel's resident-set high-water mark (Linux ``clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


@dataclass
class Memory:
    """Peak memory of the timed part: Python allocations traced by ``tracemalloc`` (numpy
    included, SQLite's own C heap not), and the growth of the process's resident set above
    what it held when the part began (everything, page-cache pages of mmaps included)."""

    traced: int | None = None
    rss_growth: int | None = None


def _run_trial(trial: Trial, *, trace: bool = False) -> tuple[float, Memory]:
    gc.collect()
    steps = trial()
    next(steps)  # setup
    memory = Memory()
    rss_before = None
    if trace:
        if _reset_rss_peak():
            rss_before = _status_kib("VmRSS")
        tracemalloc.start()
        tracemalloc.reset_peak()
    start = perf_counter()
    next(steps, None)  # the timed part
    elapsed = perf_counter() - start
    if trace:
        memory.traced = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        peak = _status_kib("VmHWM")
        if rss_before is not None and peak is not None:
            memory.rss_growth = max(peak - rss_before, 0) * 1024
    for _ in steps:  # teardown
        pass
    return elapsed, memory


def measure(trial: Trial, *, repeat: int, warmup: int) -> tuple[list[float], Memory]:
    """Warm up, time ``repeat`` runs, then measure peak memory in one more (untimed) run."""
    for _ in range(warmup):
        _run_trial(trial)
    times = [_run_trial(trial)[0] for _ in range(max(repeat, 1))]
    return times, _run_trial(trial, trace=True)[1]


def max_rss_bytes() -> int:
    """The process's peak resident set size so far (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# -- the machine -------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, str]:
    import compactlog

    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 1
    return {
        "Python": f"{platform.python_implementation()} {platform.python_version()}",
        "OS": f"{platform.system()} {platform.release()}",
        "CPU": cpu_model(),
        "Cores": f"{os.cpu_count()} ({usable} usable)",
        "compactlog": compactlog.__version__,
        "numpy": np.__version__,
        "SQLite": sqlite3.sqlite_version,
    }


# -- data --------------------------------------------------------------------------------


def make_records(
    count: int, *, key_size: int = 16, value_size: int = 100, keyspace: int | None = None, seed=0
) -> list[tuple[bytes, bytes]]:
    """``count`` (key, value) pairs: fixed-size keys over ``keyspace`` distinct keys (a keyed
    changelog updates keys again and again) and incompressible random values."""
    keyspace = keyspace or max(count // 10, 1)
    rng = np.random.default_rng(seed)
    key_ids = rng.integers(0, keyspace, size=count).tolist()
    key_format = b"k%0" + str(key_size - 1).encode() + b"d"
    blob = rng.bytes(count * value_size)
    return [
        (key_format % key_id, blob[i : i + value_size])
        for key_id, i in zip(key_ids, range(0, count * value_size, value_size), strict=True)
    ]


def in_batches(records: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [records[i : i + size] for i in range(0, len(records), size)]


# -- scratch directories -----------------------------------------------------------------


@contextmanager
def scratch_root(root: Path | None = None) -> Iterator[Path]:
    """A fresh directory under ``root`` (default ``./bench-data``), removed afterwards."""
    base = Path(root) if root is not None else BENCH_ROOT
    base.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="run-", dir=base))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def fresh_path(root: Path, name: str) -> Path:
    """A path under ``root`` that does not exist yet (removing what was there)."""
    path = root / name
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    return path


def remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)


# -- SQLite ------------------------------------------------------------------------------

SQLITE_INSERT = "INSERT INTO log (offset, key, value, ts) VALUES (?, ?, ?, ?)"


def sqlite_open(path: Path) -> sqlite3.Connection:
    """SQLite as a log would use it: WAL, ``synchronous=NORMAL``, offset as the rowid."""
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute(
        "CREATE TABLE IF NOT EXISTS log "
        "(offset INTEGER PRIMARY KEY, key BLOB, value BLOB, ts INTEGER)"
    )
    return conn


def sqlite_rows(
    batches: Sequence[Sequence[tuple[bytes, bytes]]], ts: int
) -> list[list[tuple[int, bytes, bytes, int]]]:
    """The same batches as SQLite rows (prepared outside the timing)."""
    rows = []
    offset = 0
    for batch in batches:
        rows.append([(offset + i, k, v, ts) for i, (k, v) in enumerate(batch)])
        offset += len(batch)
    return rows


def sqlite_insert_batch(conn: sqlite3.Connection, rows: Sequence[tuple[Any, ...]]) -> None:
    """One transaction per batch."""
    conn.execute("BEGIN")
    conn.executemany(SQLITE_INSERT, rows)
    conn.execute("COMMIT")


def median_rate(scan: Callable[[], int], records: int, repeat: int) -> float:
    """Records per second of the median of ``repeat`` runs of ``scan``, which returns the
    records it saw (checked against ``records``)."""
    return records / statistics.median(timed_runs(scan, repeat, records, "records read back"))
