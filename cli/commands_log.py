"""The log itself: ``create``, ``meta`` (jlogctl meta), ``config get|set``."""

from __future__ import annotations

import os
from typing import Any

import click

from .common import (
    busy_description,
    force_option,
    json_option,
    log_dir,
    open_beside_writers,
    open_read_only,
    parse_assignments,
    path_argument,
    writer_holders,
)
from .output import CliError, UsageProblem, emit_json, human_bytes, print_fields, print_table


@click.command()
@path_argument
@click.option(
    "-c",
    "--config",
    "settings",
    multiple=True,
    metavar="NAME=VALUE",
    help="A config setting (repeatable); sizes take KiB/MiB/GiB, *_ms take s/m/h/d.",
)
@json_option
def create(path: str, settings: tuple[str, ...], as_json: bool) -> None:
    """Create a new, empty log at PATH with the given config.

    The config is stored in the log; later opens use it.

    \b
    Examples:
      compactlog create /var/lib/app/users
      compactlog create /var/lib/app/events -c cleanup_policy=delete -c retention_ms=7d
      compactlog create ./log -c segment_bytes=16MiB -c compression=zstd --json
    """
    import compactlog
    from compactlog.storage import filenames

    directory = os.path.abspath(path)
    if os.path.exists(os.path.join(directory, filenames.META)):
        raise CliError("a log already exists here", path=directory)
    config = parse_assignments(settings)
    with compactlog.open(directory, create=True, **config) as log:
        stored = log.config.to_dict()
    if as_json:
        emit_json({"path": directory, "created": True, "config": stored})
        return
    click.echo(f"created {directory}")
    if config:
        print_fields(((name, stored[name]) for name in config), title="settings")


def meta_document(directory: str) -> dict[str, Any]:
    from compactlog.storage import filenames
    from compactlog.storage.head import read_log_head
    from compactlog.storage.state_files import list_checkpoints, read_cleaner_state

    from .scan import batch_bytes, dirty_figures

    with open_read_only(directory) as log:
        meta = log.meta
        start, end = log.start_offset, log.end_offset
        bases = log.get_segments()
    cleaner = read_cleaner_state(directory)
    cleaner_point = cleaner.first_dirty_offset
    figures = dirty_figures(directory, meta.config, meta.log_start_offset)
    head = read_log_head(directory)
    return {
        "path": directory,
        "log_id": meta.log_id,
        "format_version": meta.format_version,
        "log_start_offset": meta.log_start_offset,
        "start_offset": start,
        "end_offset": end,
        "segments": len(bases),
        "active_segment": filenames.segment_name(bases[-1]) if bases else None,
        "size_bytes": batch_bytes(directory),
        "cleaner_point": cleaner_point,
        # every tombstone the cleaner removed is below it (None: not known, older cleaner)
        "tombstone_horizon": cleaner.tombstone_horizon,
        **figures,
        "uncleanable": meta.uncleanable,
        "subscribers": len(list_checkpoints(directory)),
        "clean_shutdown": os.path.exists(os.path.join(directory, filenames.CLEAN_SHUTDOWN)),
        "precommit_pending": bool(head and head.precommit_pending),
        "writers": [h.to_json() for h in writer_holders(directory)],
        "config": meta.config.to_dict(),
    }


def _horizon_text(document: dict[str, Any]) -> str:
    horizon = document["tombstone_horizon"]
    if horizon is None:
        return f"not known (an older cleaner): taken as {document['cleaner_point']}"
    return str(horizon)


@click.command()
@path_argument
@json_option
def meta(path: str, as_json: bool) -> None:
    """Show the log's metadata (jlogctl meta): format version, offsets, cleaner point,
    dirty ratio, uncleanable reason, writers, and the stored config.

    \b
    Examples:
      compactlog meta ./demo-data/log
      compactlog meta ./demo-data/log --json | jq .dirty_ratio
    """
    from .scan import dirty_text

    document = meta_document(log_dir(path))
    if as_json:
        emit_json(document)
        return
    writers = ", ".join(f"pid {w['pid']} ({w['command']})" for w in document["writers"]) or "none"
    print_fields(
        [
            ("path", document["path"]),
            ("log id", document["log_id"] or "none (made before log ids)"),
            ("format version", document["format_version"]),
            ("start offset", document["start_offset"]),
            ("end offset", document["end_offset"]),
            ("segments", f"{document['segments']} (active {document['active_segment']})"),
            ("size", human_bytes(document["size_bytes"])),
            ("cleaner point", document["cleaner_point"]),
            ("tombstone horizon", _horizon_text(document)),
            ("dirty ratio", dirty_text(document)),
            ("uncleanable", document["uncleanable"] or "no"),
            ("subscribers", document["subscribers"]),
            ("clean shutdown", "yes" if document["clean_shutdown"] else "no"),
            ("precommit pending", "yes" if document["precommit_pending"] else "no"),
            ("writers", writers),
        ]
    )
    click.echo()
    print_fields(sorted(document["config"].items()), title="config")


@click.group()
def config() -> None:
    """Read or change the log's stored config.

    \b
    Examples:
      compactlog config get ./log
      compactlog config get ./log segment_bytes
      compactlog config set ./log retention_ms=3d min_cleanable_dirty_ratio=0.3
    """


@config.command("get")
@path_argument
@click.argument("names", nargs=-1, metavar="[NAME]...")
@json_option
def config_get(path: str, names: tuple[str, ...], as_json: bool) -> None:
    """Print the stored config, or only the NAMEd settings.

    With one NAME and no --json, prints the bare value (for shell scripts).

    \b
    Examples:
      compactlog config get ./log
      compactlog config get ./log segment_bytes
      compactlog config get ./log cleanup_policy retention_ms --json
    """
    with open_read_only(path) as log:
        values = log.config.to_dict()
    unknown = [n for n in names if n not in values]
    if unknown:
        from compactlog.errors import did_you_mean

        raise UsageProblem(
            f"unknown config name(s) {', '.join(unknown)}; known: {', '.join(sorted(values))}"
            + "".join(did_you_mean(name, values) for name in unknown)
        )
    chosen = {n: values[n] for n in names} if names else values
    if as_json:
        emit_json(chosen)
    elif len(names) == 1:
        click.echo("none" if chosen[names[0]] is None else chosen[names[0]])
    else:
        print_table(("name", "value"), sorted(chosen.items()))


@config.command("set")
@path_argument
@click.argument("assignments", nargs=-1, required=True, metavar="NAME=VALUE...")
@force_option
@json_option
def config_set(path: str, assignments: tuple[str, ...], force: bool, as_json: bool) -> None:
    """Change settings stored in the log (safe changes only).

    The same rules as the library's open(..., update_config=True) and the cleaner
    service's overrides. Changes that could lose or strand data are refused with the reason
    (cleanup_policy; precommit_bytes while a precommit buffer is pending). Retention and
    cleaner settings (retention_ms, retention_bytes, min_cleanable_dirty_ratio,
    *_compaction_lag_ms, delete_retention_ms, cleaner_*) can change while writers run:
    every compaction pass and retention run reads them afresh. Settings writers read once
    when they open the log
    (segment_bytes, segment_ms, index_interval_bytes, max_record_bytes, compression,
    compression_level, sync, sync_interval_ms, precommit_bytes, min_free_bytes) are
    refused while a writer has the log open, naming it and the reason; --force stores
    them anyway (running writers pick them up when they reopen the log).
    key_format/value_format (str, json) are checked against every record the log holds
    (one read of the log): a key or value that would not decode is refused, naming its
    offset; --force does not skip this check.

    \b
    Examples:
      compactlog config set ./log retention_ms=3d
      compactlog config set ./log segment_bytes=128MiB compression=zstd
      compactlog config set ./log retention_bytes=none --json
    """
    from compactlog.config import check_change
    from compactlog.errors import UnsafeChangeError

    directory = log_dir(path)
    changes = parse_assignments(assignments)
    with open_read_only(directory) as log:
        before = log.config.to_dict()
        check_change(log.config, changes, path=directory)  # bad values: usage, before opening
    live = "" if force else busy_description(directory)  # (before this process opens it)
    try:
        with open_beside_writers(directory) as log:
            stored = log.store_config(
                changes, live_writers=live, remedy="stop the writer first or pass --force"
            )
    except UnsafeChangeError as error:
        raise CliError(str(error)) from None
    after = stored.to_dict()
    changed = {n: {"old": before[n], "new": after[n]} for n in changes}
    if as_json:
        emit_json({"path": directory, "changed": changed, "config": after})
        return
    print_table(
        ("name", "old", "new"),
        ((n, c["old"], c["new"]) for n, c in changed.items()),
        title=f"{directory}: config changed",
    )
