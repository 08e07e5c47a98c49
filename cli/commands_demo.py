"""``compactlog demo`` (what ``make demo`` runs): write a realistic keyed changelog, reopen
it, read it back, and summarize."""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

import click

from .common import json_option, refuse_if_busy
from .output import CliError, emit_json, human_bytes, human_count, print_fields, to_plain

PLANS = ("free", "free", "free", "pro", "pro", "team", "enterprise")
CITIES = ("Lisbon", "Oslo", "Nairobi", "Lima", "Osaka", "Austin", "Tallinn", "Pune", "Perth")
BATCH = 2000


def _prepare(directory: str) -> None:
    """Recreate ``directory``; only a compactlog log or an empty directory is removed."""
    if os.path.lexists(directory):
        if not os.path.isdir(directory):
            raise CliError("exists and is not a directory; not removing it", path=directory)
        entries = os.listdir(directory)
        if entries and "meta" not in entries:
            raise CliError(
                "exists, is not empty and is not a compactlog log; not removing it",
                path=directory,
            )
        if entries:
            refuse_if_busy(
                directory, force=False, why="the demo deletes and recreates this directory"
            )
        shutil.rmtree(directory)
    os.makedirs(os.path.dirname(directory) or ".", exist_ok=True)


def _generate(
    updates: int, keys: int, delete_ratio: float, seed: int, start_ms: int, model: dict[bytes, Any]
) -> list[tuple[list[tuple[bytes, bytes | None]], list[int]]]:
    """Batches of (records, timestamps) for a day of user-profile changes; ``model`` gets
    the latest value per key they should leave behind. Random draws are vectorized; only
    the value formatting is a Python loop."""
    import numpy as np

    rng = np.random.default_rng(seed)
    names = [f"user:{i:06d}".encode() for i in range(keys)]
    hot = max(keys // 10, 1)  # a tenth of the users get half of the updates
    users = np.where(
        rng.random(updates) < 0.5, rng.integers(0, hot, updates), rng.integers(0, keys, updates)
    ).tolist()
    deleted = (rng.random(updates) < delete_ratio).tolist()
    plans = [PLANS[i].encode() for i in rng.integers(0, len(PLANS), updates).tolist()]
    cities = [CITIES[i].encode() for i in rng.integers(0, len(CITIES), updates).tolist()]
    balances = rng.integers(0, 1_000_000, updates).tolist()
    step = max(86_400_000 // updates, 1)
    template = b'{"id":%d,"name":"user %d","plan":"%s","city":"%s","balance":%d,"version":%d}'
    records: list[tuple[bytes, bytes | None]] = [
        (
            names[user],
            None if gone else template % (user, user, plan, city, balance, seq),
        )
        for seq, (user, gone, plan, city, balance) in enumerate(
            zip(users, deleted, plans, cities, balances, strict=True)
        )
    ]
    model.update(records)
    stamps = list(range(start_ms, start_ms + updates * step, step))
    return [(records[lo : lo + BATCH], stamps[lo : lo + BATCH]) for lo in range(0, updates, BATCH)]


def _log_bytes(directory: str) -> int:
    from compactlog.segment import list_segments, segment_path

    return sum(os.path.getsize(segment_path(directory, b)) for b in list_segments(directory))


def _latest(log: Any) -> tuple[dict[bytes, bytes], str]:
    try:
        import compactlog.latest  # noqa: F401
    except ImportError:
        state: dict[bytes, bytes | None] = {}
        for batch in log.read_batches():
            state.update(zip(batch.keys(), batch.values(), strict=True))
        return {k: v for k, v in state.items() if v is not None}, "a dict over read_batches()"
    return {r.key: r.value for r in log.latest()}, "log.latest()"


@click.command()
@click.option(
    "--path",
    "path",
    default="./demo-data/log",
    show_default=True,
    help="Directory to (re)create the demo log in.",
)
@click.option("--updates", type=click.IntRange(min=1), default=200_000, show_default=True)
@click.option("--keys", type=click.IntRange(min=1), default=20_000, show_default=True)
@click.option(
    "--delete-ratio",
    type=click.FloatRange(0, 1),
    default=0.05,
    show_default=True,
    help="Share of updates that are deletes (tombstones).",
)
@click.option("--seed", type=int, default=7, show_default=True)
@click.option(
    "--compression", type=click.Choice(["none", "zstd"]), default="none", show_default=True
)
@click.option(
    "--compact/--no-compact",
    default=True,
    show_default=True,
    help="Also run one compaction pass (when this compactlog has compaction).",
)
@json_option
def demo(
    path: str,
    updates: int,
    keys: int,
    delete_ratio: float,
    seed: int,
    compression: str,
    compact: bool,
    as_json: bool,
) -> None:
    """Write a realistic keyed changelog, reopen it, read it back and summarize.

    A day of user-profile updates (default 200,000 over 20,000 keys, a tenth of the users
    hot, about 5% deletes) appended in batches, then: a reopen, a full columnar scan, a
    read of every record, the latest state per key checked against an in-memory model,
    and (if available) one compaction pass. The directory is recreated each run (only if
    it is empty or a compactlog log).

    \b
    Examples:
      compactlog demo
      compactlog demo --path /tmp/demo --updates 1000000 --keys 100000 --compression zstd
      compactlog demo --json
    """
    import compactlog

    directory = os.path.abspath(path)
    _prepare(directory)
    start_ms = int(time.time() * 1000) - 86_400_000
    config = {"segment_bytes": 4 << 20, "sync": "os", "compression": compression}
    model: dict[bytes, bytes | None] = {}
    batches = _generate(updates, keys, delete_ratio, seed, start_ms, model)
    tombstones = sum(1 for batch, _ in batches for _key, value in batch if value is None)
    started = time.perf_counter()
    with compactlog.open(directory, create=True, **config) as log:
        for batch, stamps in batches:
            log.append_batch(batch, timestamps_ms=stamps)
        log.flush()
    write_s = time.perf_counter() - started
    size = _log_bytes(directory)
    deletes = sum(1 for v in model.values() if v is None)
    live_model = {k: v for k, v in model.items() if v is not None}

    started = time.perf_counter()
    log = compactlog.open(directory, create=False)
    reopen_s = time.perf_counter() - started
    try:
        segments = len(log.get_segments())
        started = time.perf_counter()
        scanned = sum(len(b) for b in log.read_batches())
        scan_s = time.perf_counter() - started
        started = time.perf_counter()
        previous = -1
        read = 0
        for record in log.read():
            if record.offset <= previous:
                raise CliError(f"offsets out of order at {record.offset}", path=directory)
            previous = record.offset
            read += 1
        read_s = time.perf_counter() - started
        started = time.perf_counter()
        latest, source = _latest(log)
        latest_s = time.perf_counter() - started
        compaction: dict[str, Any] | None = None
        if compact:
            try:
                import compactlog.compaction
            except ImportError:
                compaction = None
            else:
                started = time.perf_counter()
                stats = log.compact(force=True)
                compact_s = time.perf_counter() - started
                after, _ = _latest(log)
                compaction = {
                    "seconds": round(compact_s, 3),
                    "bytes_before": size,
                    "bytes_after": _log_bytes(directory),
                    "records_after": sum(len(b) for b in log.read_batches()),
                    "latest_matches_model": after == live_model,
                    "stats": to_plain(stats),
                }
    finally:
        log.close()
    document = {
        "path": directory,
        "updates": updates,
        "keys": keys,
        "tombstones": tombstones,
        "records": scanned,
        "records_read": read,
        "segments": segments,
        "bytes": size,
        "write_seconds": round(write_s, 3),
        "write_records_per_s": round(updates / write_s),
        "write_mb_per_s": round(size / write_s / 1e6, 1),
        "reopen_seconds": round(reopen_s, 4),
        "scan_records_per_s": round(scanned / scan_s) if scan_s else None,
        "read_records_per_s": round(read / read_s) if read_s else None,
        "latest_keys": len(latest),
        "latest_seconds": round(latest_s, 3),
        "latest_source": source,
        "deleted_keys": deletes,
        "latest_matches_model": latest == live_model,
        "compaction": compaction,
    }
    if as_json:
        emit_json(document)
    else:
        rows = [
            ("log", directory),
            (
                "written",
                f"{human_count(updates)} updates over {human_count(keys)} keys in "
                f"{write_s:.2f}s ({human_count(document['write_records_per_s'])} records/s, "
                f"{document['write_mb_per_s']} MB/s)",
            ),
            ("on disk", f"{segments} segments, {human_bytes(size)}"),
            ("reopened", f"in {reopen_s * 1000:.1f} ms"),
            (
                "read back",
                f"{human_count(scanned)} records: columnar scan "
                f"{human_count(document['scan_records_per_s'])} records/s, records "
                f"{human_count(document['read_records_per_s'])} records/s",
            ),
            (
                "latest state",
                f"{human_count(len(latest))} live keys ({human_count(deletes)} deleted, "
                f"{human_count(tombstones)} tombstones written) via "
                f"{source} in {latest_s:.2f}s; "
                + (
                    "matches the model"
                    if document["latest_matches_model"]
                    else "DIFFERS from the model"
                ),
            ),
        ]
        if compaction is not None:
            rows.append(
                (
                    "compaction",
                    f"{human_bytes(compaction['bytes_before'])} -> "
                    f"{human_bytes(compaction['bytes_after'])}, "
                    f"{human_count(compaction['records_after'])} records left, "
                    f"{compaction['seconds']:.2f}s; latest state "
                    + ("still matches" if compaction["latest_matches_model"] else "DIFFERS"),
                )
            )
        print_fields(rows, title="compactlog demo")
        click.echo(f"\nTry: compactlog meta {path}   compactlog dump {path} --limit 5")
    if not document["latest_matches_model"] or (
        compaction is not None and not compaction["latest_matches_model"]
    ):
        raise CliError("the latest state read back differs from what was written", path=directory)
