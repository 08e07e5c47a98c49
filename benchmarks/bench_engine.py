"""The storage engine's workloads, each beside SQLite and raw file I/O of the same data.

1. ``append_batch`` of 1,000-record batches (16 B keys, 100 B values), ``sync="os"``.
2. Full scans: ``read_batches`` (columnar) and ``read`` (``Record`` objects).
3. ``append_batch`` of 1 KiB values: MB/s against a raw write of the same encoded bytes.
4. ``sync="always"`` single-record appends, 1 thread against 8 (group commit).
5. Single-record ``append`` into the precommit buffer.

Every workload checks what it wrote or read (count, first and last record), so the quick
mode doubles as a smoke test. Timings exclude setup and teardown; see ``common.measure``.
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import compactlog
from compactlog.encoding.batch_encode import encode_batch

from .common import (
    Measurement,
    check,
    fresh_path,
    in_batches,
    make_records,
    measure,
    remove,
    sqlite_insert_batch,
    sqlite_open,
    sqlite_rows,
)

TIMESTAMP = int(time.time() * 1000)  # current: older records would roll segments (segment_ms)
OURS = "compactlog"
SQLITE = "SQLite"
RAW = "raw I/O"
MIB = 1 << 20


@dataclass(frozen=True)
class Sizes:
    """How much each workload moves; ``--quick`` shrinks all of it."""

    records: int = 1_000_000  # workloads 1 and 2
    batch: int = 1000
    large_records: int = 100_000  # workload 3
    large_value: int = 1024
    threads: int = 8  # workload 4
    sync_appends: int = 1000  # per thread
    precommit_records: int = 300_000  # workload 5
    precommit_bytes: int = 4 * MIB
    single_records: int = 50_000  # single-record comparisons (slow systems) in workload 5
    repeat: int = 5
    warmup: int = 1


QUICK = Sizes(
    records=6000,
    batch=1000,
    large_records=2000,
    threads=8,
    sync_appends=20,
    precommit_records=5000,
    precommit_bytes=64 * 1024,
    single_records=1000,
    repeat=1,
    warmup=0,
)


@dataclass
class Target:
    name: str
    measured: float
    required: float
    unit: str

    @property
    def met(self) -> bool:
        return self.measured >= self.required

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "met": self.met}


@dataclass
class EngineResults:
    measurements: list[Measurement] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)

    def find(self, workload: str, system: str) -> Measurement:
        for m in self.measurements:
            if m.workload == workload and m.system == system:
                return m
        raise KeyError((workload, system))


class Bench:
    """Runs trials and records :class:`Measurement` rows."""

    def __init__(self, root: Path, sizes: Sizes, log: Callable[[str], None]) -> None:
        self.root = root
        self.sizes = sizes
        self.results = EngineResults()
        self.say = log

    def run(
        self,
        workload: str,
        system: str,
        trial: Callable[[], Generator[None, None, None]],
        *,
        records: int,
        nbytes: int,
        note: str = "",
    ) -> Measurement:
        times, memory = measure(trial, repeat=self.sizes.repeat, warmup=self.sizes.warmup)
        m = Measurement(workload, system, records, nbytes, times, memory, note)
        self.results.measurements.append(m)
        self.say(
            f"  {workload:<34} {system:<24} {m.records_per_s:>14,.0f} rec/s "
            f"{m.mb_per_s:>9,.1f} MB/s"
        )
        return m

    def target(self, name: str, measured: float, required: float, unit: str) -> None:
        self.results.targets.append(Target(name, measured, required, unit))


# -- helpers -----------------------------------------------------------------------------


def encoded_batches(batches: Sequence[Sequence[tuple[bytes, bytes]]]) -> list[bytes]:
    """Exactly the bytes each batch occupies in a segment."""
    out = []
    base = 0
    for batch in batches:
        keys, values = zip(*batch, strict=True)
        out.append(encode_batch(keys, values, TIMESTAMP).to_bytes(base))
        base += len(batch)
    return out


def segment_files(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.suffix == ".log")


def check_log(path: Path, records: Sequence[tuple[bytes, bytes]]) -> None:
    """The log at ``path`` holds exactly ``records`` at offsets 0.. (first and last read)."""
    with compactlog.open(path, read_only=True) as log:
        check(log.end_offset == len(records), f"end offset {log.end_offset} != {len(records)}")
        first = next(log.read(0, 1))
        last = next(log.read(len(records) - 1, len(records)))
    check((first.key, first.value) == tuple(records[0]), "first record differs")
    check((last.key, last.value) == tuple(records[-1]), "last record differs")


def write_log(path: Path, batches: Sequence[Sequence[tuple[bytes, bytes]]], **config: Any) -> None:
    with compactlog.open(path, sync="os", **config) as log:
        for batch in batches:
            log.append_batch(batch, timestamp_ms=TIMESTAMP)


# -- workload 1 and 3: batched appends ---------------------------------------------------


def bench_append(
    bench: Bench,
    workload: str,
    records: list[tuple[bytes, bytes]],
    *,
    sqlite: bool = True,
) -> tuple[Measurement, Measurement | None, Measurement]:
    sizes = bench.sizes
    batches = in_batches(records, sizes.batch)
    encoded = encoded_batches(batches)
    nbytes = sum(map(len, encoded))
    count = len(records)
    root = bench.root

    def ours() -> Generator[None, None, None]:
        path = fresh_path(root, "append-ours")
        log = compactlog.open(path, sync="os")
        yield
        for batch in batches:
            log.append_batch(batch, timestamp_ms=TIMESTAMP)
        yield
        log.close()
        check_log(path, records)
        remove(path)

    def sqlite_trial() -> Generator[None, None, None]:
        path = fresh_path(root, "append.sqlite")
        remove(path)
        conn = sqlite_open(path)
        yield
        for rows in rows_batches:
            sqlite_insert_batch(conn, rows)
        yield
        (n,) = conn.execute("SELECT count(*) FROM log").fetchone()
        conn.close()
        check(n == count, f"SQLite holds {n} rows, not {count}")
        remove(path)

    def raw() -> Generator[None, None, None]:
        path = fresh_path(root, "append.raw")
        yield
        with open(path, "wb") as handle:
            for blob in encoded:
                handle.write(blob)
        yield
        check(path.stat().st_size == nbytes, "raw file size differs")
        remove(path)

    m_ours = bench.run(workload, OURS, ours, records=count, nbytes=nbytes, note='sync="os"')
    m_sqlite = None
    if sqlite:
        rows_batches = sqlite_rows(batches, TIMESTAMP)
        m_sqlite = bench.run(
            workload,
            SQLITE,
            sqlite_trial,
            records=count,
            nbytes=nbytes,
            note="WAL, synchronous=NORMAL, executemany, 1 transaction per batch",
        )
        del rows_batches
    m_raw = bench.run(
        workload, RAW, raw, records=count, nbytes=nbytes, note="buffered write of encoded batches"
    )
    return m_ours, m_sqlite, m_raw


# -- workload 2: full scans --------------------------------------------------------------


def bench_scan(bench: Bench, records: list[tuple[bytes, bytes]]) -> None:
    sizes = bench.sizes
    count = len(records)
    batches = in_batches(records, sizes.batch)
    log_path = fresh_path(bench.root, "scan-log")
    write_log(log_path, batches)
    check_log(log_path, records)
    files = segment_files(log_path)
    nbytes = sum(p.stat().st_size for p in files)
    db_path = fresh_path(bench.root, "scan.sqlite")
    remove(db_path)
    conn = sqlite_open(db_path)
    for rows in sqlite_rows(batches, TIMESTAMP):
        sqlite_insert_batch(conn, rows)
    conn.close()
    last_key, last_value = records[-1]

    def columnar() -> Generator[None, None, None]:
        log = compactlog.open(log_path, read_only=True)
        yield
        n = 0
        for batch in log.read_batches():
            n += len(batch)
        yield
        log.close()
        check(n == count, f"read_batches saw {n} records, not {count}")

    def objects() -> Generator[None, None, None]:
        log = compactlog.open(log_path, read_only=True)
        tail: collections.deque[Any] = collections.deque(maxlen=1)
        yield
        tail.extend(log.read())
        yield
        log.close()
        rec = tail[0]
        check(rec.offset == count - 1, f"read() ended at {rec.offset}")
        check((rec.key, rec.value) == (last_key, last_value), "read() last record differs")

    def sqlite_scan() -> Generator[None, None, None]:
        conn = sqlite_open(db_path)
        tail: collections.deque[Any] = collections.deque(maxlen=1)
        yield
        tail.extend(conn.execute("SELECT offset, key, value, ts FROM log ORDER BY offset"))
        yield
        conn.close()
        check(tail[0][0] == count - 1, "SQLite scan ended early")

    def raw() -> Generator[None, None, None]:
        buffer = bytearray(4 * MIB)
        yield
        total = 0
        for path in files:
            with open(path, "rb", buffering=0) as handle:
                while n := handle.readinto(buffer):
                    total += n
        yield
        check(total == nbytes, "raw read size differs")

    name = "full scan, 16 B + 100 B"
    m_cols = bench.run(
        name, OURS + " read_batches", columnar, records=count, nbytes=nbytes, note="columnar"
    )
    m_recs = bench.run(
        name, OURS + " read()", objects, records=count, nbytes=nbytes, note="Record objects"
    )
    bench.run(name, SQLITE, sqlite_scan, records=count, nbytes=nbytes, note="SELECT, rows")
    bench.run(name, RAW, raw, records=count, nbytes=nbytes, note="read segment files")
    bench.target("read_batches full scan", m_cols.records_per_s, 10_000_000, "records/s")
    bench.target("read() Record objects", m_recs.records_per_s, 1_000_000, "records/s")
    remove(log_path)
    remove(db_path)


# -- workload 4: group commit ------------------------------------------------------------


def bench_group_commit(bench: Bench) -> None:
    sizes = bench.sizes
    per_thread = sizes.sync_appends
    records = make_records(per_thread * sizes.threads, seed=4)
    root = bench.root

    def ours(threads: int) -> Callable[[], Generator[None, None, None]]:
        def trial() -> Generator[None, None, None]:
            path = fresh_path(root, "sync-ours")
            log = compactlog.open(path, sync="always")
            gate = threading.Barrier(threads + 1)
            errors: list[BaseException] = []

            def worker(mine: Sequence[tuple[bytes, bytes]]) -> None:
                gate.wait()
                try:
                    for key, value in mine:
                        log.append(key, value)
                except BaseException as error:  # reported below, outside the timing
                    errors.append(error)

            workers = [
                threading.Thread(target=worker, args=(records[t * per_thread :][:per_thread],))
                for t in range(threads)
            ]
            for w in workers:
                w.start()
            yield
            gate.wait()
            for w in workers:
                w.join()
            yield
            end = log.end_offset
            log.close()
            check(not errors, f"appends failed: {errors[:1]}")
            check(end == threads * per_thread, f"{end} records, not {threads * per_thread}")
            remove(path)

        return trial

    def sqlite_trial() -> Generator[None, None, None]:
        path = fresh_path(root, "sync.sqlite")
        remove(path)
        conn = sqlite_open(path)
        conn.execute("PRAGMA synchronous=FULL")
        rows = [(i, k, v, TIMESTAMP) for i, (k, v) in enumerate(records[:per_thread])]
        yield
        for row in rows:
            conn.execute("INSERT INTO log (offset, key, value, ts) VALUES (?, ?, ?, ?)", row)
        yield
        conn.close()
        remove(path)

    def raw() -> Generator[None, None, None]:
        path = fresh_path(root, "sync.raw")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        yield
        for key, value in records[:per_thread]:
            os.write(fd, key + value)
            os.fdatasync(fd)
        yield
        os.close(fd)
        remove(path)

    size = len(records[0][0]) + len(records[0][1])
    one = bench.run(
        'sync="always" append()', OURS + ", 1 thread", ours(1),
        records=per_thread, nbytes=per_thread * size, note="fsync before each append returns",
    )  # fmt: skip
    many = bench.run(
        'sync="always" append()', f"{OURS}, {sizes.threads} threads", ours(sizes.threads),
        records=per_thread * sizes.threads, nbytes=per_thread * sizes.threads * size,
        note="group commit",
    )  # fmt: skip
    bench.run(
        'sync="always" append()', SQLITE + ", 1 thread", sqlite_trial,
        records=per_thread, nbytes=per_thread * size, note="synchronous=FULL, autocommit",
    )  # fmt: skip
    bench.run(
        'sync="always" append()', RAW + ", 1 thread", raw,
        records=per_thread, nbytes=per_thread * size, note="write + fdatasync per record",
    )  # fmt: skip
    bench.target(
        f"group commit: {sizes.threads} threads / 1 thread",
        many.records_per_s / one.records_per_s,
        4.0,
        "x",
    )


# -- workload 5: single appends ----------------------------------------------------------


def bench_single(bench: Bench) -> None:
    sizes = bench.sizes
    records = make_records(sizes.precommit_records, seed=5)
    few = records[: sizes.single_records]
    size = len(records[0][0]) + len(records[0][1])
    root = bench.root

    def ours(data: Sequence[tuple[bytes, bytes]], **config: Any):
        def trial() -> Generator[None, None, None]:
            path = fresh_path(root, "single-ours")
            log = compactlog.open(path, sync="os", **config)
            append = log.append
            yield
            for key, value in data:
                append(key, value, timestamp_ms=TIMESTAMP)
            log.flush()
            yield
            log.close()
            check_log(path, data)
            remove(path)

        return trial

    def sqlite_trial() -> Generator[None, None, None]:
        path = fresh_path(root, "single.sqlite")
        remove(path)
        conn = sqlite_open(path)
        rows = [(i, k, v, TIMESTAMP) for i, (k, v) in enumerate(few)]
        yield
        for row in rows:
            conn.execute("INSERT INTO log (offset, key, value, ts) VALUES (?, ?, ?, ?)", row)
        yield
        conn.close()
        remove(path)

    workload = "append() single records"
    m = bench.run(
        workload, OURS + ", precommit", ours(records, precommit_bytes=sizes.precommit_bytes),
        records=len(records), nbytes=len(records) * size,
        note=f"precommit_bytes={sizes.precommit_bytes // 1024} KiB, flush() at the end",
    )  # fmt: skip
    bench.run(
        workload, OURS + ", no precommit", ours(few),
        records=len(few), nbytes=len(few) * size, note='one batch per record, sync="os"',
    )  # fmt: skip
    bench.run(
        workload, SQLITE, sqlite_trial, records=len(few), nbytes=len(few) * size,
        note="WAL, synchronous=NORMAL, one transaction per record",
    )  # fmt: skip
    bench.target("append() with precommit", m.records_per_s, 300_000, "records/s")


# -- all of it ---------------------------------------------------------------------------


def run(root: Path, sizes: Sizes = Sizes(), log: Callable[[str], None] = print) -> EngineResults:
    """Run every engine workload with scratch files under ``root``."""
    bench = Bench(root, sizes, log)

    records = make_records(sizes.records)
    w1 = "append_batch 1000 x (16 B + 100 B)"
    ours, sqlite, raw = bench_append(bench, w1, records)
    bench.target("append_batch", ours.records_per_s, 3_000_000, "records/s")
    assert sqlite is not None
    bench.target("append_batch vs SQLite", ours.records_per_s / sqlite.records_per_s, 5.0, "x")

    bench_scan(bench, records)
    del records

    large = make_records(sizes.large_records, value_size=sizes.large_value, seed=3)
    w3 = f"append_batch 1000 x (16 B + {sizes.large_value} B)"
    ours, _sqlite, raw = bench_append(bench, w3, large)
    bench.target("1 KiB values: MB/s vs raw write", ours.mb_per_s / raw.mb_per_s, 0.6, "x")
    del large

    bench_group_commit(bench)
    bench_single(bench)
    return bench.results


def quick_sizes(**changes: Any) -> Sizes:
    return replace(QUICK, **changes)
