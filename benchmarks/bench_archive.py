"""The archive against the same client moving the same bytes as plain objects.

1. **push vs plain upload**: a log of ``--size-mb`` MB (random 200-byte values, 16 MiB
   segments) archived by one ``archive push`` into a fresh prefix, against uploading its
   segment files as plain objects with the same ``store.put``, alternating, ``--repeat``
   times each; the ratio is plain time / push time (1.0: no overhead; the target is 0.9).
   The plain upload runs twice: one put after another, and ``UPLOAD_THREADS`` puts at a
   time as the archiver does (the stricter comparison).
2. **restore vs plain download**: ``archive restore`` of that archive against getting the
   same objects and writing them to files, alternating: one get after another, and
   ``FETCH_THREADS`` at a time as the restore does, both without fsync; and
   ``FETCH_THREADS`` at a time with each file fsynced (durable, as a restore must be).
3. **size after compaction**: ``--keys`` keys rewritten ``--rewrites`` times over 10
   compactions, pushed after each and pruned with retention 0: the archive's object bytes
   against the local log's segment bytes (the target is at most 1.1x).

Against SeaweedFS (``--seaweed``: ``weed mini`` started on loopback, as the tests do) or any
``--url`` (default: a ``file://`` directory). Numbers are noisy on a shared machine: report
the ratios, with the load (printed).

Run: ``python -m benchmarks.bench_archive --seaweed --size-mb 256 --json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import compactlog
from compactlog.archive import manifest as manifests
from compactlog.archive import open_store
from compactlog.archive.prune import prune
from compactlog.archive.push import UPLOAD_THREADS, Archiver, push_once
from compactlog.archive.restore import FETCH_THREADS, restore

from .archive_store import add_store_options, archive_store


def build_log(path: Path, size_mb: int) -> int:
    with compactlog.open(path, segment_bytes=16 << 20, sync="os") as log:
        value = os.urandom(1 << 20)
        written, i = 0, 0
        while written < size_mb * 1_000_000:
            batch = [
                (b"key-%010d" % (i + j), value[(j * 200) % 900_000 : (j * 200) % 900_000 + 200])
                for j in range(5000)
            ]
            log.append_batch(batch)
            i += len(batch)
            written += 5000 * 215
        log.flush()
    return sum(os.path.getsize(p) for p in path.glob("*.log"))


def settled() -> float:
    """The start of a timed step, once the writes of the steps before it are on disk: each
    step then pays for its own writeback only (the restore's fsync pass would otherwise
    wait for the uploads' data that the server is still writing out)."""
    os.sync()
    return time.perf_counter()


def plain_upload(store: Any, path: Path, prefix: str, threads: int = 1) -> None:
    """Each segment file as one plain object, ``threads`` puts at a time."""

    def put(file: Path) -> None:
        store.put(f"{prefix}/{file.name}", file.read_bytes())

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(put, sorted(path.glob("*.log"))))


def plain_download(
    store: Any, keys: list[str], target: Path, threads: int = 1, durable: bool = False
) -> None:
    """Each object to a file of its own, ``threads`` gets at a time; ``durable``: each file
    fsynced once written, and the directory at the end, as the restore makes its bytes
    durable before the log's ``meta`` vouches for them."""
    target.mkdir()

    def get(key: str) -> None:
        data, _ = store.get(key)
        with open(target / key.rsplit("/", 1)[-1], "wb") as handle:
            handle.write(data)
            if durable:
                handle.flush()
                os.fsync(handle.fileno())

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(get, keys))
    if durable:
        fd = os.open(target, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def run(url: str, size_mb: int, repeat: int, keys: int, rewrites: int, say=print) -> dict:
    root = Path(tempfile.mkdtemp(prefix="bench-archive-"))
    try:
        log_path = root / "log"
        size = build_log(log_path, size_mb)
        say(f"log: {size / 1e6:.0f} MB; load {os.getloadavg()[0]:.1f}")
        push_s, plain_s, restore_s, download_s = [], [], [], []
        parallel_up_s: list[float] = []
        parallel_down_s: list[float] = []
        durable_down_s: list[float] = []
        for i in range(repeat):
            prefix = f"{url}/push-{uuid.uuid4().hex[:8]}"
            store = open_store(prefix)
            started = settled()
            push_once(str(log_path), store)
            push_s.append(time.perf_counter() - started)

            plain = open_store(f"{url}/plain-{uuid.uuid4().hex[:8]}")
            started = settled()
            plain_upload(plain, log_path, "p")
            plain_s.append(time.perf_counter() - started)

            again = open_store(f"{url}/plain-{uuid.uuid4().hex[:8]}")
            started = settled()
            plain_upload(again, log_path, "p", threads=UPLOAD_THREADS)
            parallel_up_s.append(time.perf_counter() - started)

            started = settled()
            restore(store, str(root / f"restored-{i}"))
            restore_s.append(time.perf_counter() - started)
            shutil.rmtree(root / f"restored-{i}")

            keys_ = [info.key for info in plain.list("p/")]
            started = settled()
            plain_download(plain, keys_, root / f"download-{i}")
            download_s.append(time.perf_counter() - started)
            shutil.rmtree(root / f"download-{i}")

            started = settled()
            plain_download(plain, keys_, root / f"download-{i}", threads=FETCH_THREADS)
            parallel_down_s.append(time.perf_counter() - started)
            shutil.rmtree(root / f"download-{i}")

            started = settled()
            plain_download(
                plain, keys_, root / f"download-{i}", threads=FETCH_THREADS, durable=True
            )
            durable_down_s.append(time.perf_counter() - started)
            shutil.rmtree(root / f"download-{i}")
            say(
                f"round {i}: push {push_s[-1]:.2f}s plain {plain_s[-1]:.2f}s "
                f"plain x{UPLOAD_THREADS} {parallel_up_s[-1]:.2f}s "
                f"restore {restore_s[-1]:.2f}s download {download_s[-1]:.2f}s "
                f"download x{FETCH_THREADS} {parallel_down_s[-1]:.2f}s "
                f"durable download x{FETCH_THREADS} {durable_down_s[-1]:.2f}s"
            )
        compacted = size_after_compaction(
            root, f"{url}/compacted-{uuid.uuid4().hex[:8]}", keys, rewrites
        )
        result = {
            "log_bytes": size,
            "push_s": statistics.median(push_s),
            "plain_upload_s": statistics.median(plain_s),
            "push_vs_plain": statistics.median(plain_s) / statistics.median(push_s),
            "restore_s": statistics.median(restore_s),
            "plain_download_s": statistics.median(download_s),
            "restore_vs_plain": statistics.median(download_s) / statistics.median(restore_s),
            "parallel_upload_s": statistics.median(parallel_up_s),
            "push_vs_parallel": statistics.median(parallel_up_s) / statistics.median(push_s),
            "parallel_download_s": statistics.median(parallel_down_s),
            "restore_vs_parallel": (
                statistics.median(parallel_down_s) / statistics.median(restore_s)
            ),
            "durable_download_s": statistics.median(durable_down_s),
            "restore_vs_durable": (
                statistics.median(durable_down_s) / statistics.median(restore_s)
            ),
            **compacted,
            "load": os.getloadavg()[0],
        }
        return result
    finally:
        shutil.rmtree(root, ignore_errors=True)


def size_after_compaction(root: Path, url: str, keys: int, rewrites: int) -> dict:
    path = root / "compacted"
    store = open_store(url)
    log = compactlog.open(
        path, segment_bytes=4 << 20, sync="os", min_compaction_lag_ms=0, delete_retention_ms=0
    )
    reader = compactlog.open(path, read_only=True)
    archiver = Archiver(reader, store)
    archiver.start()
    shipped = 0
    per_pass = max(rewrites // 10, 1)
    value = os.urandom(100)
    for _ in range(10):
        for _ in range(per_pass):
            for start in range(0, keys, 10_000):
                log.append_batch(
                    [(b"k%09d" % k, value) for k in range(start, min(start + 10_000, keys))]
                )
        log.flush()
        log.compact(force=True)
        shipped += archiver.push().bytes
        prune(store, 0, orphan_grace_ms=0)
    archiver.stop()
    reader.close()
    local = sum(os.path.getsize(p) for p in path.glob("*.log"))
    log.close()
    archived = sum(i.size for i in store.list(manifests.OBJECT_PREFIX))
    return {
        "compacted_local_bytes": local,
        "compacted_archive_bytes": archived,
        "archive_vs_local": archived / local,
        "shipped_bytes": shipped,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_store_options(parser)
    parser.add_argument("--size-mb", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--rewrites", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with archive_store(args, "bench-archive-store-") as (url, _scratch):
        result = run(url, args.size_mb, args.repeat, args.keys, args.rewrites)
    print(json.dumps(result, indent=2) if args.json else result)


if __name__ == "__main__":
    main()
