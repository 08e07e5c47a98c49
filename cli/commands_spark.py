"""``snapshot`` (a consistent copy of a live log) and ``restore`` (its table, by Arrow or
Spark)."""

from __future__ import annotations

import click

from .common import json_option, log_dir, path_argument
from .output import emit_json, human_bytes, human_count, print_fields
from .progress import ProgressDisplay, phase_lines, progress_option, resolve_mode


@click.command()
@path_argument
@click.argument("dest", type=click.Path(file_okay=False))
@json_option
def snapshot(path: str, dest: str, as_json: bool) -> int:
    """Take a consistent point-in-time snapshot of the log at PATH into DEST.

    Closed segments are hard-linked (copied across file systems), the active segment is
    copied up to the end offset the writers published. Writers keep appending and the
    cleaner keeps cleaning (a cleaning pass in progress is waited for, briefly). DEST must
    not exist; the snapshot opens read-only as a log and `compactlog verify DEST` checks it
    against its manifest.

    \b
    Examples:
      compactlog snapshot ./demo-data/log ./demo-data/snap
      compactlog snapshot ./log ./backup/snap-1 --json
    """
    import compactlog

    directory = log_dir(path)
    with compactlog.open(directory, read_only=True, create=False) as log:
        snap = log.snapshot(dest)
    document = {
        "path": snap.path,
        "source": snap.source,
        "start_offset": snap.start_offset,
        "end_offset": snap.end_offset,
        "cleaner_point": snap.cleaner_point,
        "files": len(snap.files),
        "linked_files": snap.linked_files,
        "bytes": snap.total_bytes,
        "seconds": round(snap.seconds, 4),
    }
    if as_json:
        emit_json(document)
        return 0
    print_fields(
        [
            ("snapshot", snap.path),
            ("offsets", f"{snap.start_offset:,} .. {snap.end_offset:,} (end exclusive)"),
            ("cleaner point", f"{snap.cleaner_point:,}"),
            ("files", f"{len(snap.files)} ({snap.linked_files} hard-linked)"),
            ("size", human_bytes(snap.total_bytes)),
            ("took", f"{snap.seconds:.3f} s"),
        ],
        title="snapshot taken",
    )
    return 0


@click.command()
@path_argument
@click.option(
    "--to", "output", required=True, type=click.Path(file_okay=False), help="Output directory."
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["parquet", "json", "csv", "orc"]),
    default="parquet",
    show_default=True,
)
@click.option("--as-of", type=click.IntRange(min=0), help="State of the records below offset N.")
@click.option(
    "--allow-inexact", is_flag=True, help="Accept --as-of below the cleaner point (Kafka's rule)."
)
@click.option(
    "--value-format",
    type=click.Choice(["binary", "string", "json"]),
    help="How values are read [default: what the log declares (value_format), else binary].",
)
@click.option("--schema", "value_schema", help="DDL of the JSON value, with --value-format json.")
@click.option(
    "--engine",
    type=click.Choice(["auto", "arrow", "spark"]),
    default="auto",
    show_default=True,
    help="arrow: this process, no JVM (parquet, orc, csv); spark: a SparkSession; auto: "
    "arrow unless the job needs Spark or the snapshot exceeds a quarter of this machine's "
    "memory.",
)
@click.option("--master", help="Spark master URL (default local[*]); implies the Spark engine.")
@click.option(
    "--partitions", type=click.IntRange(min=1), help="Spark read partitions (default: auto)."
)
@progress_option("the Arrow engine's records read of the snapshot, ETA; Spark shows its own")
@json_option
def restore(
    path: str,
    output: str,
    fmt: str,
    as_of: int | None,
    allow_inexact: bool,
    value_format: str | None,
    value_schema: str | None,
    engine: str,
    master: str | None,
    partitions: int | None,
    progress_mode: str,
    as_json: bool,
) -> int:
    """Rebuild the latest value of every key of PATH as a table, with Arrow or Spark.

    PATH is a log directory, or an archive URL (``s3://bucket/prefix``, gs://, az://,
    file://; docs/archive.md): then the state is the archive's newest manifest (with
    --as-of, the newest ending at or before it). The Spark engine (--engine spark, or
    --master spark://... for a cluster) reads the archive itself: the executors fetch the
    objects with the credentials of their own environment (AWS_*), so the workers need no
    disk shared with the log. The Arrow engine restores the manifest into a temporary
    directory beside OUTPUT first. An archive has not moved while that manifest's end
    offset is the one OUTPUT records.

    Takes a snapshot, reads it as the `compactlog` Spark data source does, writes OUTPUT
    atomically (a temporary directory renamed into place) with `_compactlog.json` in it
    (source, snapshot end offset, engine, rows, time taken). Running it again when the log
    has not moved does nothing. Both engines write the same table. The Arrow engine runs
    in this process with no JVM (parquet, orc, csv); the Spark engine needs
    `pip install 'compactlog[spark]'` and Java 17+ and also writes json. `--engine auto`
    takes Spark when --master is given, for --format json or a --schema the Arrow engine
    cannot read, or when the snapshot is larger than a quarter of this machine's memory;
    Arrow otherwise.

    \b
    Examples:
      compactlog restore ./demo-data/log --to ./demo-data/customers.parquet
      compactlog restore ./log --to ./out --value-format json \\
          --schema 'name STRING, balance DOUBLE' --as-of 1000000
      compactlog restore ./log --to ./out --engine spark --master spark://host:7077
      compactlog restore s3://bucket/logs/customers --to ./out --master spark://host:7077
    """
    from compactlog.restore.archive_read import is_archive_url
    from compactlog.restore.options import json_schema_problem
    from compactlog.spark.restore import restore as run_restore

    problem = json_schema_problem(value_format, value_schema)
    if problem == "schema":
        raise click.UsageError("--value-format json needs --schema DDL")
    if problem == "format":
        raise click.UsageError("--schema needs --value-format json")
    mode = resolve_mode(progress_mode, as_json)
    with ProgressDisplay(mode, unit="records") as display, phase_lines(mode, "compactlog.restore"):
        result = run_restore(
            path if is_archive_url(path) else log_dir(path),
            output,
            format=fmt,
            as_of=as_of,
            value_format=value_format,
            value_schema=value_schema,
            master=master,
            partitions=partitions,
            allow_inexact=allow_inexact,
            progress=mode == "bar",
            engine=engine,
            on_progress=None if mode == "none" else display,
        )
    if as_json:
        emit_json(result.to_json())
        return 0
    verb = "already up to date" if result.skipped else "restored"
    print_fields(
        [
            ("output", result.output),
            ("format", result.format),
            ("end offset", f"{result.end_offset:,}"),
            ("rows", human_count(result.rows)),
            ("snapshot", f"{result.snapshot_seconds:.2f} s"),
            ("engine", f"{result.engine} {result.spark_seconds:.2f} s"),
            ("total", f"{result.seconds:.2f} s"),
        ],
        title=verb,
    )
    return 0
