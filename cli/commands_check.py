"""``verify`` (every batch, index and state file) and ``repair`` (jlogctl repair)."""

from __future__ import annotations

import click

from .common import force_option, json_option, log_dir, path_argument, refuse_if_busy
from .output import emit_json, human_bytes, human_count


@click.command()
@path_argument
@json_option
def verify(path: str, as_json: bool) -> int:
    """Check the whole log; exit 1 on any problem, with a precise report.

    Checks every batch's CRC and layout (file header, decodable columns, offsets increasing
    within and across batches and segments), every index entry against the batch it points
    at, the meta file, subscriber checkpoints (readable, named right, not stuck below the log
    start, not past the end), the cleaner checkpoint and, after a clean close, the head in
    .lock (within the newest segment): the invariants of compactlog.engine.invariants, which
    Log.check() asserts. Read-only: safe beside live writers
    (bytes past what the writers have published are a write in progress, not a problem).
    On a snapshot it also checks every file against the manifest (size and CRC).

    \b
    Examples:
      compactlog verify ./demo-data/log
      compactlog verify ./demo-data/log --json | jq '.problems[]'
      compactlog verify ./demo-data/snap      # a snapshot: also its manifest
    """
    from compactlog.engine.snapshot import MANIFEST, is_snapshot, verify_manifest
    from compactlog.errors import CompactLogError
    from compactlog.storage.state_files import REPLICA_ADVICE, replica_of, replica_quiet

    from .common import writer_holders
    from .scan import verify_log

    directory = log_dir(path, meta_optional=True)
    replica = replica_of(directory)
    if replica is None:
        report = verify_log(directory, writers_active=bool(writer_holders(directory)))
    else:
        with replica_quiet(directory):  # (never a half-applied manifest)
            report = verify_log(directory, replica=True)
        report.notes.append(
            f"a replica of {replica.get('url')} (manifest {replica.get('sequence')}): "
            "indexes are optional"
        )
    if is_snapshot(directory):
        report.notes.append(f"a snapshot: files checked against {MANIFEST}")
        try:
            mismatches = verify_manifest(directory)
        except CompactLogError as error:
            mismatches = [str(error)]
        for problem in mismatches:
            report.problem("snapshot", MANIFEST, None, problem)
    if as_json:
        emit_json(report.to_json())
        return 0 if report.ok else 1
    summary = (
        f"{report.path}: {report.segments} segments, {human_count(report.batches)} batches, "
        f"{human_count(report.records)} records, {human_bytes(report.bytes)}"
    )
    click.echo(summary)
    for note in report.notes:
        click.echo(f"  note: {note}")
    for problem in report.problems:
        click.echo(f"  PROBLEM [{problem.kind}] {problem.line()}")
    if report.ok:
        click.echo("OK")
        return 0
    extra = (
        f", {human_bytes(report.unreadable_bytes)} unreadable" if report.unreadable_bytes else ""
    )
    if replica is not None:
        click.echo(f"FAILED: {len(report.problems)} problem(s){extra}; {REPLICA_ADVICE}")
        return 1
    flag = " --rebuild-meta" if any(p.kind == "meta" for p in report.problems) else ""
    click.echo(
        f"FAILED: {len(report.problems)} problem(s){extra}; `compactlog repair {report.path}"
        f"{flag}` fixes what can be fixed without losing a valid batch"
    )
    return 1


@click.command()
@path_argument
@click.option(
    "--dry-run", is_flag=True, help="Only report what would be fixed (exit 1 if anything)."
)
@click.option(
    "--rebuild-meta",
    is_flag=True,
    help="Rebuild a missing or unreadable meta from what the damaged file and the segments "
    "still hold, naming every setting it could not recover (defaults are used for those).",
)
@click.option(
    "--meta-from",
    type=click.Path(exists=True, file_okay=False),
    default=None,
    help="With --rebuild-meta: a snapshot or backup of this log whose meta supplies the "
    "settings the damaged one no longer shows.",
)
@force_option
@json_option
def repair(
    path: str,
    dry_run: bool,
    rebuild_meta: bool,
    meta_from: str | None,
    force: bool,
    as_json: bool,
) -> int:
    """Fix what can be fixed without deleting a valid batch (jlogctl repair).

    Removes unfinished rewrites, fixes a stale log start and subscriber checkpoints below it,
    rebuilds wrong indexes and damaged segment file headers, clears an uncleanable mark,
    relinks the segment chain over a segment that is gone (accepting the loss), moves
    unreadable bytes into `<segment>.<position>.quarantine` files instead of discarding
    them, and moves an unreadable subscriber checkpoint (the subscriber restarts at the log
    start) or cleaner checkpoint (the cleaner starts over) aside as `<name>.0.quarantine`.
    A missing or unreadable meta is rebuilt only with --rebuild-meta. Stop writers first:
    it refuses while one has the log open unless --force. The dry run changes nothing but
    briefly takes the writers' lock.

    \b
    Examples:
      compactlog repair ./log --dry-run
      compactlog repair ./log
      compactlog repair ./log --json
      compactlog repair ./log --rebuild-meta
      compactlog repair ./log --rebuild-meta --meta-from ./log-snapshot
    """
    import compactlog

    rebuild_meta = rebuild_meta or meta_from is not None
    directory = log_dir(path, meta_optional=rebuild_meta)
    if not dry_run:
        refuse_if_busy(
            directory,
            force=force,
            why="repair truncates segments, removes files and rewrites the log start and "
            "checkpoints under a writer that keeps appending from its own view of them",
        )
    report = compactlog.repair(
        directory, dry_run=dry_run, rebuild_meta=rebuild_meta, meta_from=meta_from
    )
    fixes = list(report.fixes)
    if as_json:
        emit_json({"path": directory, "dry_run": dry_run, "clean": not fixes, "fixes": fixes})
    elif not fixes:
        click.echo(f"{directory}: nothing to repair")
    else:
        verb = "would fix" if dry_run else "fixed"
        click.echo(f"{directory}: {verb} {len(fixes)} problem(s)")
        for fix in fixes:
            click.echo(f"  {fix}")
    return 1 if dry_run and fixes else 0
