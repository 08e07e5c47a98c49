"""``subscribers list|add|remove|seek`` (jlogctl subscriber), with lag in records and bytes.

These commands run beside live writers: checkpoints are replaced atomically and the log is
opened read-only (no writers' lock, no recovery). ``remove`` and ``seek`` go through a
durable subscriber's own lock, like a consumer: they refuse only while a consumer holds
that name, naming its pid (``--force`` overrides).
"""

from __future__ import annotations

from typing import Any

import click

from .common import (
    json_option,
    log_dir,
    open_read_only,
    path_argument,
)
from .output import (
    CliError,
    UsageProblem,
    emit_json,
    human_bytes,
    human_count,
    parse_timestamp,
    print_table,
)


@click.group()
def subscribers() -> None:
    """List durable subscribers with their lag; add, remove or move them.

    Names starting with "~" are transient (no checkpoint) and never listed.

    \b
    Examples:
      compactlog subscribers list ./log
      compactlog subscribers add ./log billing --at end
      compactlog subscribers seek ./log billing --to-timestamp 2024-05-01T00:00:00Z
      compactlog subscribers remove ./log billing
    """


def subscriber_rows(directory: str) -> dict[str, Any]:
    """Every durable subscriber with its lag: the library's ``lag_report`` (or, where
    there is none, the same figures from segment headers)."""
    with open_read_only(directory) as log:
        start, end = log.start_offset, log.end_offset
        try:
            from compactlog.engine.subscriber import lag_report
        except ImportError:
            rows = _rows_from_headers(directory, log.subscribers(), start)
        else:
            rows = [
                {
                    "name": row.name,
                    "committed": row.committed,
                    "lag_records": row.lag_records,
                    "lag_bytes": row.lag_bytes,
                    "lag_segments": row.lag_segments,
                    "pending_segments": row.pending_segments,
                    "stuck_below_start": row.below_log_start,
                }
                for row in sorted(lag_report(log), key=lambda r: r.name)
            ]
    from compactlog.engine.subscriber import name_holder

    for row in rows:
        row["consumer_pid"] = name_holder(directory, row["name"])
        row["status"] = (
            "stuck below log start"
            if row["stuck_below_start"]
            else ("beyond end" if row["committed"] > end else "ok")
        )
    return {"path": directory, "start_offset": start, "end_offset": end, "subscribers": rows}


def _rows_from_headers(
    directory: str, checkpoints: dict[str, int], start: int
) -> list[dict[str, Any]]:
    from .scan import bytes_from, records_from, summarize_segments

    summaries = summarize_segments(directory) if checkpoints else []
    closed_next = [s.base for s in summaries[1:]]
    rows = []
    for name, committed in sorted(checkpoints.items()):
        position = max(committed, start)
        rows.append(
            {
                "name": name,
                "committed": committed,
                "lag_records": records_from(summaries, position, directory),
                "lag_bytes": bytes_from(directory, summaries, position),
                "lag_segments": sum(
                    1 for s in summaries if s.next_offset is not None and s.next_offset > position
                ),
                "pending_segments": sum(1 for nxt in closed_next if nxt > committed),
                "stuck_below_start": committed < start,
            }
        )
    return rows


@subscribers.command("list")
@path_argument
@json_option
def list_(path: str, as_json: bool) -> int:
    """Durable subscribers: committed offset, lag in records, bytes and segments.

    A subscriber whose checkpoint is below the log start (its segments were removed) is
    flagged "stuck below log start"; the library resumes it at the log start, and
    `compactlog repair` rewrites its checkpoint. Exits 1 when one is stuck. The consumer
    column shows the pid consuming each name now (a durable name has one at a time).

    \b
    Examples:
      compactlog subscribers list ./log
      compactlog subscribers list ./log --json | jq '.subscribers[] | {name, lag_records}'
    """
    document = subscriber_rows(log_dir(path))
    stuck = any(row["stuck_below_start"] for row in document["subscribers"])
    if as_json:
        emit_json(document)
        return 1 if stuck else 0
    if not document["subscribers"]:
        click.echo(f"{document['path']}: no durable subscribers")
        return 0
    print_table(
        (
            "subscriber",
            "committed",
            "lag records",
            "lag bytes",
            "lag segments",
            "pending",
            "consumer",
            "status",
        ),
        (
            (
                row["name"],
                row["committed"],
                human_count(row["lag_records"]),
                human_bytes(row["lag_bytes"]),
                row["lag_segments"],
                row["pending_segments"],
                f"pid {row['consumer_pid']}" if row["consumer_pid"] else "-",
                row["status"],
            )
            for row in document["subscribers"]
        ),
        right=("committed", "lag records", "lag bytes", "lag segments", "pending"),
        title=(f"{document['path']}: offsets {document['start_offset']}..{document['end_offset']}"),
    )
    return 1 if stuck else 0


def _check_name(name: str) -> None:
    if not name:
        raise UsageProblem("a subscriber name must not be empty")
    if len(name.encode("utf-8", errors="surrogatepass")) > 255:
        raise UsageProblem(f"subscriber name {name[:20]!r}... is longer than 255 bytes")
    if name.startswith("~"):
        raise UsageProblem(
            f"{name!r} is a transient subscriber name (starts with '~'): transient "
            "subscribers keep no checkpoint, so there is nothing to add, remove or seek"
        )


def _resolve(log: Any, where: str) -> int:
    """``start``, ``end`` or an offset."""
    if where == "start":
        return log.start_offset
    if where == "end":
        return log.end_offset
    try:
        offset = int(where)
    except ValueError:
        raise UsageProblem(f"expected start, end or an offset, not {where!r}") from None
    if offset < 0 or offset > log.end_offset:
        raise UsageProblem(
            f"offset {offset} is outside the log (offsets {log.start_offset}..{log.end_offset})"
        )
    return offset


def _consumer_force_option(func: Any) -> Any:
    return click.option(
        "--force",
        is_flag=True,
        help="Change the checkpoint even while a consumer holds the name (it overwrites the "
        "checkpoint on its next commit, or recreates a removed one).",
    )(func)


def _in_use(error: Any, name: str, directory: str, action: str) -> CliError:
    """The one-line refusal for a subscriber a consumer holds."""
    who = f"pid {error.pid}" if error.pid else "another process (pid unknown)"
    return CliError(
        f"refusing to {action} subscriber {name!r}: it is in use by {who}, which would "
        "overwrite its checkpoint on its next commit; stop that consumer first or pass --force",
        path=directory,
    )


@subscribers.command("add")
@path_argument
@click.argument("name")
@click.option(
    "--at",
    "at",
    default="start",
    show_default=True,
    metavar="start|end|OFFSET",
    help="Where the new subscriber starts reading.",
)
@click.option("--force", is_flag=True, hidden=True, help="No effect (kept for scripts).")
@json_option
def add(path: str, name: str, at: str, force: bool, as_json: bool) -> None:
    """Add a durable subscriber NAME with a checkpoint at the log start, end or an offset.

    Safe beside live writers: the checkpoint is written atomically.

    \b
    Examples:
      compactlog subscribers add ./log billing
      compactlog subscribers add ./log audit --at end
      compactlog subscribers add ./log replay --at 1000 --json
    """
    from compactlog import SubscriberBusyError

    _check_name(name)
    with open_read_only(path) as log:
        if name in log.subscribers():
            raise CliError(f"subscriber {name!r} already exists", path=log.directory)
        offset = _resolve(log, at)
        try:
            log.subscribe(name, start=offset).close()
        except SubscriberBusyError as error:  # a consumer created it just now
            raise _in_use(error, name, log.directory, "add") from None
        committed = log.subscribers().get(name)
        directory = log.directory
    if as_json:
        emit_json({"path": directory, "subscriber": name, "committed": committed})
    else:
        click.echo(f"{directory}: added subscriber {name!r} at offset {committed}")


@subscribers.command("remove")
@path_argument
@click.argument("name")
@_consumer_force_option
@json_option
def remove(path: str, name: str, force: bool, as_json: bool) -> None:
    """Remove durable subscriber NAME and its checkpoint.

    With cleanup_policy=consumed, its pending segments may then be deleted. Safe beside
    live writers; refuses while a consumer holds NAME, naming its pid, unless --force.

    \b
    Examples:
      compactlog subscribers remove ./log billing
    """
    from compactlog import SubscriberBusyError

    _check_name(name)
    with open_read_only(path) as log:
        checkpoints = log.subscribers()
        if name not in checkpoints:
            raise UsageProblem(f"no durable subscriber named {name!r}", path=log.directory)
        try:
            log.remove_subscriber(name, force=force)
        except SubscriberBusyError as error:
            raise _in_use(error, name, log.directory, "remove") from None
        directory = log.directory
    if as_json:
        emit_json({"path": directory, "subscriber": name, "removed": True})
    else:
        click.echo(f"{directory}: removed subscriber {name!r} (was at offset {checkpoints[name]})")


@subscribers.command("seek")
@path_argument
@click.argument("name")
@click.option(
    "--to", "to", metavar="start|end|OFFSET", help="Move to the log start, end or an offset."
)
@click.option(
    "--to-timestamp",
    "to_timestamp",
    metavar="TIME",
    help="Move to the first record at or after TIME (ms since the epoch or ISO 8601).",
)
@_consumer_force_option
@json_option
def seek(
    path: str, name: str, to: str | None, to_timestamp: str | None, force: bool, as_json: bool
) -> None:
    """Move durable subscriber NAME's committed position.

    Safe beside live writers. Refuses while a consumer holds NAME (it would overwrite the
    checkpoint on its next commit), naming its pid, unless --force.

    \b
    Examples:
      compactlog subscribers seek ./log billing --to start
      compactlog subscribers seek ./log billing --to 120000
      compactlog subscribers seek ./log billing --to-timestamp 2024-05-01T00:00:00Z
    """
    from compactlog import SubscriberBusyError
    from compactlog.engine.subscriber import set_committed

    from .scan import offset_for_timestamp

    _check_name(name)
    if (to is None) == (to_timestamp is None):
        raise click.UsageError("give exactly one of --to and --to-timestamp")
    timestamp = parse_timestamp(to_timestamp) if to_timestamp is not None else None
    with open_read_only(path) as log:
        checkpoints = log.subscribers()
        if name not in checkpoints:
            raise UsageProblem(f"no durable subscriber named {name!r}", path=log.directory)
        if timestamp is not None:
            found = offset_for_timestamp(log.directory, log.start_offset, timestamp)
            offset = log.end_offset if found is None else found
        else:
            offset = _resolve(log, to or "start")
        try:
            set_committed(log, name, offset, force=force)
        except SubscriberBusyError as error:
            raise _in_use(error, name, log.directory, "move") from None
        committed = log.subscribers().get(name)
        directory = log.directory
    if as_json:
        emit_json(
            {
                "path": directory,
                "subscriber": name,
                "previous": checkpoints[name],
                "committed": committed,
            }
        )
    else:
        click.echo(
            f"{directory}: subscriber {name!r} moved from offset {checkpoints[name]} to {committed}"
        )
