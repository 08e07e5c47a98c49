"""Maintenance passes: ``compact`` (one cleaning pass now) and ``retention``."""

from __future__ import annotations

from typing import Any

import click

from .common import (
    json_option,
    log_dir,
    no_longer_needed_force_option,
    open_beside_writers,
    open_read_only,
    path_argument,
)
from .output import CliError, emit_json, human_bytes, print_fields, to_plain
from .progress import ProgressDisplay, progress_option, resolve_mode


@click.command()
@path_argument
@click.option(
    "--if-due",
    is_flag=True,
    help="Clean only if the dirty ratio or max_compaction_lag_ms says so (the cleaner "
    "service's rule); by default the pass runs now.",
)
@progress_option("bytes, rate, ETA")
@no_longer_needed_force_option
@json_option
def compact(path: str, if_due: bool, progress_mode: str, force: bool, as_json: bool) -> None:
    """Run one compaction pass now (then retention), and print its statistics.

    Never touches the active segment or records younger than min_compaction_lag_ms. Shows
    its progress on stderr (see --progress). Runs beside live writers: the cleaner lock and
    the swap protocol make that safe (a second cleaner is refused).

    \b
    Examples:
      compactlog compact ./demo-data/log
      compactlog compact ./demo-data/log --if-due --json
      compactlog compact ./demo-data/log --json --progress json 2>progress.jsonl
    """
    import time

    directory = log_dir(path)
    with open_beside_writers(directory) as log:
        try:
            import compactlog.compaction  # noqa: F401
        except ImportError:
            raise CliError(
                "this compactlog has no compaction yet (compactlog.compaction is missing)",
                path=directory,
            ) from None
        started = time.monotonic()
        with ProgressDisplay(resolve_mode(progress_mode, as_json)) as display:
            result = log.compact(force=not if_due, progress=display)
        elapsed = time.monotonic() - started
    stats = to_plain(result)
    if as_json:
        emit_json(
            {
                "path": directory,
                "forced": not if_due,
                "elapsed_s": round(elapsed, 3),
                "stats": stats,
            }
        )
        return
    if result is None or stats == {} or (isinstance(stats, dict) and stats.get("cleaned") is False):
        reason = stats.get("skipped") if isinstance(stats, dict) else None
        click.echo(f"{directory}: nothing cleaned ({reason or 'no cleaning due'})")
        _echo_retention(result)
        return
    why = result.extra.get("reason") or ("forced" if result.forced else "due")
    click.echo(f"{directory}: compaction done in {elapsed:.2f}s ({why})")
    click.echo(result.summary(directory))  # Kafka's lines; --json has every statistic
    _echo_retention(result)


def _echo_retention(result: Any) -> None:
    """The retention run that follows every pass, in one line when it removed something."""
    retention = getattr(result, "retention", None)
    deleted = getattr(retention, "segments_deleted", None)
    if deleted:
        click.echo(
            f"retention removed {len(deleted)} segment(s), "
            f"{human_bytes(retention.bytes_deleted)} ({retention.reason}); "
            f"log start now {retention.log_start_offset}"
        )


@click.command()
@path_argument
@click.option("--dry-run", is_flag=True, help="Only show which segments would be removed.")
@no_longer_needed_force_option
@json_option
def retention(path: str, dry_run: bool, force: bool, as_json: bool) -> None:
    """Apply delete/consumed retention now: remove whole closed segments that are older
    than retention_ms, beyond retention_bytes, or (consumed) read by every durable
    subscriber. The log start moves up; the active segment always stays. Runs beside
    live writers (it takes the writers' lock for the moment it moves the log start).

    \b
    Examples:
      compactlog retention ./log --dry-run
      compactlog retention ./log --json
    """
    import time

    from compactlog.storage import retention as library_retention
    from compactlog.storage.head import read_log_head
    from compactlog.storage.segment import list_segments, segment_data_size

    directory = log_dir(path)
    if dry_run:
        with open_read_only(directory) as log:
            infos = library_retention.closed_segments(directory, {})
            bases = list_segments(directory)
            total = sum(i.size for i in infos)
            if bases:
                total += segment_data_size(directory, bases[-1], read_log_head(directory))
            doomed, reason = library_retention.select_for_deletion(
                log.config, infos, total, int(time.time() * 1000), log.subscribers()
            )
            start = doomed[-1].next_base if doomed else log.start_offset
        deleted = [d.base for d in doomed]
        removed = sum(d.size for d in doomed)
    else:
        with open_beside_writers(directory) as log:
            result = log.enforce_retention()
        deleted, removed = list(result.segments_deleted), result.bytes_deleted
        start, reason = result.log_start_offset, result.reason
    document = {
        "path": directory,
        "dry_run": dry_run,
        "segments_deleted": deleted,
        "bytes_deleted": removed,
        "log_start_offset": start,
        "reason": reason,
    }
    if as_json:
        emit_json(document)
        return
    verb = "would remove" if dry_run else "removed"
    print_fields(
        [
            (verb, f"{len(deleted)} segment(s), {human_bytes(removed)}"),
            ("segments", ", ".join(map(str, deleted)) or "-"),
            ("log start", start),
            ("policy", reason),
        ],
        title=directory,
    )
