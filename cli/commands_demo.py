"""``compactlog demo`` (what ``make demo`` runs): the whole story of a keyed changelog.

By default: a realistic changelog of customer records (1M updates and deletes over 100k
keys, JSON values), compaction, a snapshot, a Spark restore of the snapshot to Parquet
checked against an in-memory model, and a short summary (:func:`_story`). With
``--quick``: the engine alone (write, reopen, read back, latest state, one compaction), no
Spark needed.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

import click

from compactlog.storage import filenames

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
        if entries and filenames.META not in entries:
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
    from compactlog.storage.segment import list_segments, segment_path

    return sum(os.path.getsize(segment_path(directory, b)) for b in list_segments(directory))


def _latest(log: Any) -> tuple[dict[bytes, bytes], str]:
    try:
        import compactlog.engine.latest  # noqa: F401
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
    help="Directory to (re)create the demo log in (the snapshot and table go beside it).",
)
@click.option(
    "--quick", is_flag=True, help="The engine alone: no snapshot, no Spark (200k updates)."
)
@click.option("--updates", type=click.IntRange(min=1), help="Default 1,000,000 (quick: 200,000).")
@click.option("--keys", type=click.IntRange(min=1), help="Default 100,000 (quick: 20,000).")
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
    help="Run a compaction pass (the story always compacts).",
)
@click.option("--master", help="Spark master URL for the restore (default local[*]).")
@json_option
def demo(
    path: str,
    quick: bool,
    updates: int | None,
    keys: int | None,
    delete_ratio: float,
    seed: int,
    compression: str,
    compact: bool,
    master: str | None,
    as_json: bool,
) -> None:
    """The whole story: changelog, compaction, snapshot, Spark restore, checked.

    Generates a day of customer-record changes (1,000,000 updates over 100,000 customers,
    about 5% deletes, JSON values), appends them, lets the compactor run, takes a
    snapshot, restores it with Spark to Parquet (values decoded into columns), checks
    the table against an in-memory model and prints sizes, timings and rows. Needs the
    `spark` extra and Java 17+. `--quick` shows the engine alone, without Spark. The
    directories are recreated each run (only if empty or made by compactlog).

    \b
    Examples:
      compactlog demo
      compactlog demo --quick
      compactlog demo --updates 200000 --keys 20000 --json
    """
    if quick:
        _engine_demo(
            path,
            updates or 200_000,
            keys or 20_000,
            delete_ratio,
            seed,
            compression,
            compact,
            as_json,
        )
        return
    _story(
        path,
        updates=updates or 1_000_000,
        keys=keys or 100_000,
        delete_ratio=delete_ratio,
        seed=seed,
        compression=compression,
        master=master,
        as_json=as_json,
    )


def _engine_demo(
    path: str,
    updates: int,
    keys: int,
    delete_ratio: float,
    seed: int,
    compression: str,
    compact: bool,
    as_json: bool,
) -> None:
    """The engine alone (``compactlog demo --quick``): write, reopen, read back, compact."""
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


# -- the whole story -------------------------------------------------------------------------

VALUE_SCHEMA = "id BIGINT, name STRING, plan STRING, city STRING, balance BIGINT, version BIGINT"


def _remove_ours(directory: str, marker: str) -> None:
    """Remove an earlier demo's snapshot or table (recognised by ``marker``), nothing else."""
    if not os.path.lexists(directory):
        return
    if not os.path.isdir(directory) or (
        os.listdir(directory) and not os.path.exists(os.path.join(directory, marker))
    ):
        raise CliError(f"exists and has no {marker}: not removing it", path=directory)
    shutil.rmtree(directory)


def _tree_bytes(directory: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(directory):
        total += sum(os.path.getsize(os.path.join(root, name)) for name in files)
    return total


def _check_table(table_dir: str, live: dict[bytes, bytes]) -> tuple[int, int]:
    """``(rows, mismatches)`` of the restored Parquet table against the model."""
    import json

    import pyarrow.parquet as pq

    table = pq.read_table(
        table_dir, columns=["key", "id", "name", "plan", "city", "balance", "version"]
    )
    columns = table.to_pydict()
    mismatches = abs(table.num_rows - len(live))
    fields = ("id", "name", "plan", "city", "balance", "version")
    for i, key in enumerate(columns["key"]):
        expected = live.get(key)
        if expected is None:
            mismatches += 1
            continue
        document = json.loads(expected)
        if any(columns[f][i] != document[f] for f in fields):
            mismatches += 1
    return table.num_rows, mismatches


def _story(
    path: str,
    *,
    updates: int,
    keys: int,
    delete_ratio: float,
    seed: int,
    compression: str,
    master: str | None,
    as_json: bool,
) -> None:
    """Changelog -> compaction -> snapshot -> Spark restore -> check -> summary."""
    import compactlog
    from compactlog.spark.restore import RESULT_FILE, restore
    from compactlog.spark.session import check_spark_available

    check_spark_available()  # before a minute of work, not after
    directory = os.path.abspath(path)
    root = os.path.dirname(directory)
    snap_dir = os.path.join(root, "snapshot")
    table_dir = os.path.join(root, "customers.parquet")
    _prepare(directory)
    _remove_ours(snap_dir, "snapshot.json")
    _remove_ours(table_dir, RESULT_FILE)

    def step(message: str) -> None:
        if not as_json:
            click.echo(message, err=True)

    timings: dict[str, float] = {}
    started = time.perf_counter()
    model: dict[bytes, bytes | None] = {}
    start_ms = int(time.time() * 1000) - 86_400_000
    batches = _generate(updates, keys, delete_ratio, seed, start_ms, model)
    tombstones = sum(1 for batch, _ in batches for _key, value in batch if value is None)
    timings["generate"] = time.perf_counter() - started
    live = {k: v for k, v in model.items() if v is not None}
    step(
        f"[1/5] generated {human_count(updates)} customer updates "
        f"({human_count(tombstones)} deletes)"
    )

    config = {
        "segment_bytes": 8 << 20,
        "sync": "os",
        "compression": compression,
        "min_compaction_lag_ms": 0,
    }
    with compactlog.open(directory, create=True, **config) as log:
        started = time.perf_counter()
        for batch, stamps in batches:
            log.append_batch(batch, timestamps_ms=stamps)
        log.flush()
        timings["write"] = time.perf_counter() - started
        before = _log_bytes(directory)
        step(f"[2/5] appended them in {timings['write']:.1f}s: {human_bytes(before)} on disk")
        started = time.perf_counter()
        stats = log.compact(force=True)
        timings["compact"] = time.perf_counter() - started
        after = _log_bytes(directory)
        step(
            f"[3/5] compacted in {timings['compact']:.1f}s: {human_bytes(before)} -> "
            f"{human_bytes(after)}"
        )
        snapshot = log.snapshot(snap_dir)
        timings["snapshot"] = snapshot.seconds
        step(
            f"[4/5] snapshot at offset {snapshot.end_offset:,} in {snapshot.seconds * 1000:.0f} ms "
            f"({snapshot.linked_files} of {len(snapshot.files)} files hard-linked)"
        )
    step("[5/5] restoring the snapshot with Spark to Parquet ...")
    result = restore(
        snap_dir,
        table_dir,
        format="parquet",
        value_format="json",
        value_schema=VALUE_SCHEMA,
        master=master,
        progress=None if not as_json else False,
        engine="spark",  # the demo shows Spark; `compactlog restore` picks Arrow for this size
    )
    timings["restore"] = result.seconds
    started = time.perf_counter()
    rows, mismatches = _check_table(table_dir, live)
    timings["check"] = time.perf_counter() - started
    document = {
        "log": directory,
        "snapshot": snap_dir,
        "table": table_dir,
        "updates": updates,
        "keys": keys,
        "tombstones": tombstones,
        "live_keys": len(live),
        "log_bytes_before_compaction": before,
        "log_bytes_after_compaction": after,
        "snapshot_end_offset": snapshot.end_offset,
        "snapshot_bytes": snapshot.total_bytes,
        "table_bytes": _tree_bytes(table_dir),
        "rows": rows,
        "mismatches": mismatches,
        "matches_model": mismatches == 0,
        "records_removed_by_compaction": getattr(stats, "records_removed", None),
        "seconds": {k: round(v, 3) for k, v in timings.items()},
    }
    if as_json:
        emit_json(document)
    else:
        print_fields(
            [
                (
                    "changelog",
                    f"{human_count(updates)} updates over {human_count(keys)} customers, "
                    f"{human_count(tombstones)} deletes, JSON values",
                ),
                (
                    "log",
                    f"{human_bytes(before)} written in {timings['write']:.1f}s, "
                    f"{human_bytes(after)} after compaction ({timings['compact']:.1f}s)",
                ),
                (
                    "snapshot",
                    f"offset {snapshot.end_offset:,}, {human_bytes(snapshot.total_bytes)}, "
                    f"{snapshot.seconds * 1000:.0f} ms",
                ),
                (
                    "restore",
                    f"{human_count(rows)} rows to Parquet ({human_bytes(document['table_bytes'])}) "
                    f"in {result.seconds:.1f}s",
                ),
                (
                    "check",
                    f"{human_count(len(live))} live customers in the model: "
                    + ("the table matches" if mismatches == 0 else f"{mismatches} rows DIFFER"),
                ),
            ],
            title="compactlog demo: changelog -> compaction -> snapshot -> Spark restore",
        )
        click.echo(
            f"\nTry: compactlog verify {os.path.join(os.path.dirname(path), 'snapshot')}\n"
            f"     compactlog restore {path} --to "
            f"{os.path.join(os.path.dirname(path), 'customers-as-of.parquet')} --as-of "
            f"{snapshot.end_offset // 2} --allow-inexact"
        )
    if mismatches:
        raise CliError("the restored table differs from the model", path=table_dir)
