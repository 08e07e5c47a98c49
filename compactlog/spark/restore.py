"""Restore: the latest value of every key of a log, as a table written by an engine.

:func:`restore` is what ``compactlog restore`` runs. It reads the log through a snapshot
taken first (so the table is one consistent state even while writers and the cleaner
work), has an engine write the table to a temporary directory beside the output, puts
``_compactlog.json`` (source, snapshot end offset, engine, rows, time taken) into it and
renames it into place (:func:`_replace_output`). A second restore that would read the same
end offset (and options) finds the record and does nothing. An archive URL
(``s3://bucket/prefix``) is read from one pinned manifest instead of a snapshot
(:func:`_restore_archive`).

Engines: ``spark`` (the ``compactlog`` data source in a SparkSession: local or a cluster,
every format Spark writes) and ``arrow`` (:mod:`compactlog.restore.arrow_restore`: the
same rows and columns from this process, no JVM, Parquet, ORC and CSV). ``auto``
(:func:`choose_engine`) takes Arrow unless the job needs Spark or the snapshot is large for
this machine's memory.

Progress: each phase (the snapshot, the engine chosen, the engine's job, the rename into
place) is a line of the ``compactlog.restore`` logger at INFO, with its time; the Arrow
engine's long read also calls ``on_progress`` (:mod:`compactlog.restore.progress`).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..engine.snapshot import is_snapshot, read_manifest, take_snapshot
from ..errors import ConfigError
from ..restore.options import ReadOptions, declared_value_format, json_schema_problem, read_as
from ..restore.progress import RestoreCallback, logger
from ..storage.fsio import fsync_dir, fsync_file

RESULT_FILE = "_compactlog.json"
FORMATS = ("parquet", "json", "csv", "orc")
ENGINES = ("auto", "arrow", "spark")
RESTORE_SNAPSHOTS = ".snapshots"
ARROW_MEMORY_SHARE = 4  # auto: Arrow while the snapshot is at most 1/4 of physical memory


@dataclass
class RestoreResult:
    source: str
    output: str
    format: str
    end_offset: int
    as_of: int | None
    rows: int
    value_format: str
    value_schema: str | None
    engine: str = "spark"
    snapshot_seconds: float = 0.0
    spark_seconds: float = 0.0  # the engine's time (either engine; the name is historical)
    seconds: float = 0.0
    skipped: bool = False  # the output already held this state
    created_ms: int = 0
    partitions: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        document = asdict(self)
        document.pop("extra")
        document.update(self.extra)
        return document

    def same_state(self, other: dict[str, Any]) -> bool:
        keys = ("source", "format", "end_offset", "as_of", "value_format", "value_schema")
        mine = self.to_json()
        return all(other.get(k) == mine[k] for k in keys)


def read_result(output: str) -> dict[str, Any] | None:
    try:
        with open(os.path.join(output, RESULT_FILE), "rb") as handle:
            document = json.loads(handle.read())
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None
    return document if isinstance(document, dict) else None


def _end_offset_now(path: str) -> int:
    if is_snapshot(path):
        return read_manifest(path).end_offset
    from ..log import open_log

    with open_log(path, read_only=True, create=False) as log:
        return log.end_offset


def restore(
    path: str | os.PathLike[str],
    output: str | os.PathLike[str],
    *,
    format: str = "parquet",
    as_of: int | None = None,
    value_format: str | None = None,
    value_schema: str | None = None,
    master: str | None = None,
    partitions: int | None = None,
    spark: Any = None,
    progress: bool | None = None,
    allow_inexact: bool = False,
    engine: str = "auto",
    on_progress: RestoreCallback | None = None,
) -> RestoreResult:
    """Write the latest state of the log (or snapshot, or archive URL) at ``path`` to
    ``output``.

    ``as_of`` restores the state below that offset (refused below the cleaner point unless
    ``allow_inexact``); ``value_format="json"`` with ``value_schema`` (DDL) turns values into
    columns, and ``None`` takes the format the log declares, as the data source's
    ``valueFormat`` does (``options.declared_value_format``). ``engine``: ``"arrow"``,
    ``"spark"`` or ``"auto"`` (:func:`choose_engine`). ``spark``: a session to use (else a
    local one on ``master``, default ``local[*]``). ``progress``: Spark's stage progress bar
    (default: on a terminal). ``on_progress``: called with the Arrow engine's
    :class:`~compactlog.restore.progress.RestoreStep` events while it reads the snapshot.
    """
    started = time.perf_counter()
    output = os.path.abspath(os.fspath(output))
    _check_request(format, engine, value_schema, master, spark)
    from ..restore.archive_read import is_archive_url

    if is_archive_url(os.fspath(path)):
        job = _Job(
            format,
            as_of,
            value_format,
            value_schema,
            master,
            partitions,
            spark,
            progress,
            on_progress,
        )
        return _restore_archive(os.fspath(path), output, job, engine, started)
    source = os.path.abspath(os.fspath(path))
    if value_format is None:
        value_format = declared_value_format(source, has_schema=value_schema is not None)
    _check_value_format(value_format, value_schema)
    end_now = _end_offset_now(source)
    result = RestoreResult(
        source=source,
        output=output,
        format=format,
        end_offset=end_now if as_of is None else min(as_of, end_now),
        as_of=as_of,
        rows=0,
        value_format=value_format,
        value_schema=value_schema,
        engine=engine,
        created_ms=time.time_ns() // 1_000_000,
        partitions=partitions,
    )
    previous = _previous(output)
    if previous is not None and result.same_state(previous):
        return _up_to_date(result, previous, started)
    snapshot_dir, own_snapshot = _snapshot_for(source)
    try:
        manifest = read_manifest(snapshot_dir)
        result.snapshot_seconds = time.perf_counter() - started
        logger.info(
            "restore: snapshot of %s to offset %d (%d bytes), %.1f s",
            source,
            manifest.end_offset,
            manifest.total_bytes,
            result.snapshot_seconds,
        )
        result.end_offset = (
            manifest.end_offset if as_of is None else min(as_of, manifest.end_offset)
        )
        if previous is not None and result.same_state(previous):
            return _up_to_date(result, previous, started)
        if engine == "auto":
            engine = choose_engine(
                format=format,
                value_schema=value_schema,
                master=master,
                spark=spark,
                snapshot_bytes=manifest.total_bytes,
            )
        result.engine = engine
        engine_started = time.perf_counter()
        read = ReadOptions(
            path=snapshot_dir,
            as_of=as_of,
            allow_inexact=allow_inexact,
            value_format=value_format,
            value_schema=value_schema,
            num_partitions=partitions,
        )
        fill = _engine_fill(engine, read, format, spark, master, progress, on_progress)
        result.rows = _replace_output(output, fill, result, started, engine_started)
    finally:
        if own_snapshot:
            shutil.rmtree(snapshot_dir, ignore_errors=True)
    result.seconds = time.perf_counter() - started
    return result


@dataclass(frozen=True, slots=True)
class _Job:
    """What the user asked of a restore, beside its source, output and engine."""

    format: str
    as_of: int | None
    value_format: str | None
    value_schema: str | None
    master: str | None
    partitions: int | None
    spark: Any
    progress: bool | None
    on_progress: RestoreCallback | None = None


def _restore_archive(
    url: str, output: str, job: _Job, engine: str, started: float
) -> RestoreResult:
    """:func:`restore` of an archive URL (``s3://bucket/prefix``, docs/archive.md).

    The state is a manifest: the newest, or with ``as_of`` the newest ending at or before
    it (an exact state, so ``allow_inexact`` has nothing to allow), pinned while the
    restore runs. The archive *has not moved* when that manifest's end offset is the one
    ``_compactlog.json`` records for this URL: a newer manifest with the same end offset
    (a compaction pushed) holds the same latest value of every key, as a compacted log
    does. ``archive_sequence`` records which manifest was read.

    The Spark engine reads the URL itself, ``archiveSequence`` naming that manifest: its
    executors fetch the objects with the credentials of their own environment (a cluster
    shares no disk with this process). The Arrow engine restores the same manifest into
    a temporary directory beside the output first (``compactlog archive restore``), then
    reads that log; both write the same table.
    """
    from ..archive import open_store
    from ..archive.restore import pinned_manifest
    from ..archive.restore import restore as restore_log
    from ..restore.archive_read import config_value_format

    store = open_store(url)
    with pinned_manifest(store, as_of_offset=job.as_of) as manifest:
        value_format = job.value_format or read_as(
            config_value_format(manifest.meta), has_schema=job.value_schema is not None
        )
        _check_value_format(value_format, job.value_schema)
        result = RestoreResult(
            source=url,
            output=output,
            format=job.format,
            end_offset=manifest.end_offset,
            as_of=job.as_of,
            rows=0,
            value_format=value_format,
            value_schema=job.value_schema,
            engine=engine,
            created_ms=time.time_ns() // 1_000_000,
            partitions=job.partitions,
            extra={"archive_sequence": manifest.sequence},
        )
        result.snapshot_seconds = time.perf_counter() - started
        previous = _previous(output)
        if previous is not None and result.same_state(previous):
            return _up_to_date(result, previous, started)
        if engine == "auto":
            engine = choose_engine(
                format=job.format,
                value_schema=job.value_schema,
                master=job.master,
                spark=job.spark,
                snapshot_bytes=manifest.total_bytes,
            )
        result.engine = engine
        engine_started = time.perf_counter()
        read = ReadOptions(
            path=url,
            archive_sequence=manifest.sequence,
            value_format=value_format,
            value_schema=job.value_schema,
            num_partitions=job.partitions,
        )
        with ExitStack() as stack:
            if engine == "arrow":
                os.makedirs(os.path.dirname(output), exist_ok=True)
                scratch = stack.enter_context(
                    tempfile.TemporaryDirectory(
                        prefix=".compactlog-archive-", dir=os.path.dirname(output)
                    )
                )
                target = os.path.join(scratch, "log")
                restore_log(store, target, sequence=manifest.sequence)
                read = replace(read, path=target, archive_sequence=None)
                result.snapshot_seconds = time.perf_counter() - started
                logger.info(
                    "restore: manifest %d of %s fetched (%d bytes), %.1f s",
                    manifest.sequence,
                    url,
                    manifest.total_bytes,
                    result.snapshot_seconds,
                )
                engine_started = time.perf_counter()
            fill = _engine_fill(
                engine, read, job.format, job.spark, job.master, job.progress, job.on_progress
            )
            result.rows = _replace_output(output, fill, result, started, engine_started)
    result.seconds = time.perf_counter() - started
    return result


def _check_request(
    format: str, engine: str, value_schema: str | None, master: str | None, spark: Any
) -> None:
    """Refuse, before reading anything, a format, an engine or an Arrow job that cannot be."""
    if format not in FORMATS:
        raise ConfigError(f"format must be one of {', '.join(FORMATS)}, not {format!r}")
    if engine not in ENGINES:
        raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
    if engine == "arrow":
        _check_arrow_job(format, value_schema, master, spark)


def _check_value_format(value_format: str, value_schema: str | None) -> None:
    problem = json_schema_problem(value_format, value_schema)
    if problem == "schema":
        raise ConfigError("value_format='json' needs value_schema (a DDL string)")
    if problem == "format":
        raise ConfigError(
            f"value_schema needs value_format='json' (the values are read as {value_format})"
        )


def _previous(output: str) -> dict[str, Any] | None:
    """The record of the restore that wrote ``output``; refuses an output that exists and
    is not a restore's."""
    previous = read_result(output)
    if os.path.exists(output) and previous is None:
        raise ConfigError(
            f"output {output} exists and is not a compactlog restore (no {RESULT_FILE}); "
            "choose another path or remove it"
        )
    return previous


def _engine_fill(
    engine: str,
    read: ReadOptions,
    format: str,
    spark: Any,
    master: str | None,
    progress: bool | None,
    on_progress: RestoreCallback | None = None,
) -> Callable[[str], int]:
    """``fill(directory) -> rows``: the engine writing the table that ``read`` reads."""
    logger.info("restore: the %s engine writes %s", engine, format)
    if engine == "arrow":
        from ..restore.arrow_restore import write_arrow_table

        return lambda directory: write_arrow_table(read, directory, format, on_progress)
    started = time.perf_counter()
    session = spark if spark is not None else _session(master, progress)
    logger.info("restore: Spark session ready, %.1f s", time.perf_counter() - started)
    return lambda directory: _write_with_spark(session, read, directory, format)


def _up_to_date(result: RestoreResult, previous: dict[str, Any], started: float) -> RestoreResult:
    """``result`` of a restore that found ``output`` holding this state already: nothing
    written, and the rows and engine are those of the restore that wrote it."""
    result.rows = int(previous.get("rows", 0))
    result.engine = str(previous.get("engine", result.engine))
    result.skipped = True
    result.seconds = time.perf_counter() - started
    return result


def _snapshot_for(source: str) -> tuple[str, bool]:
    """A snapshot to read: ``source`` itself when it is one, else a fresh one kept beside
    the log's other implicit snapshots (same file system, so hard links)."""
    if is_snapshot(source):
        return source, False
    from ..log import open_log

    root = os.path.join(source, RESTORE_SNAPSHOTS)
    os.makedirs(root, exist_ok=True)
    dest = os.path.join(root, f"restore-{time.time_ns()}-{os.getpid()}")
    with open_log(source, read_only=True, create=False) as log:
        # only this restore reads it, and it is removed when the restore ends: no fsyncs
        take_snapshot(log, dest, durable=False)
    return dest, True


def _session(master: str | None, progress: bool | None) -> Any:
    from .session import local_session

    show = sys.stderr.isatty() if progress is None else progress
    return local_session(
        master or "local[*]",
        app_name="compactlog restore",
        config={
            "spark.ui.showConsoleProgress": "true" if show else "false",
            # CSV and JSON timestamps in UTC, as the Arrow engine writes them
            "spark.sql.session.timeZone": "UTC",
        },
    )


def choose_engine(
    *,
    format: str,
    value_schema: str | None,
    master: str | None,
    spark: Any,
    snapshot_bytes: int,
    memory_bytes: int | None = None,
) -> str:
    """The engine ``engine="auto"`` runs, in this order:

    1. ``spark`` when a Spark master or session is given (the user asked for Spark);
    2. ``spark`` when the Arrow engine cannot do the job: ``format="json"`` (pyarrow writes
       no JSON) or a ``value_schema`` it cannot read (:mod:`.ddl`);
    3. ``spark`` when the snapshot's bytes exceed a quarter (:data:`ARROW_MEMORY_SHARE`)
       of this machine's physical memory (``memory_bytes``; Spark spreads a large job over
       every core) and pyspark is installed;
    4. ``arrow`` otherwise: no JVM to start, so a small log restores in well under a
       second. The Arrow engine streams the snapshot in chunks of 64k records: its memory
       is a chunk plus 24 bytes per key of the dirty head, far below the snapshot.
    """
    from ..restore.arrow_restore import ARROW_FORMATS, restore_schema
    from ..restore.ddl import DdlError

    if master is not None or spark is not None or format not in ARROW_FORMATS:
        return "spark"
    if value_schema is not None:
        try:
            restore_schema("json", value_schema)
        except DdlError:
            return "spark"
    memory = physical_memory() if memory_bytes is None else memory_bytes
    if snapshot_bytes > memory // ARROW_MEMORY_SHARE and _spark_installed():
        return "spark"
    return "arrow"


def physical_memory() -> int:
    """This machine's physical memory in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _spark_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("pyspark") is not None


def _check_arrow_job(format: str, value_schema: str | None, master: str | None, spark: Any) -> None:
    """Refuse, before any snapshot, an Arrow-engine restore that needs Spark."""
    from ..restore.arrow_restore import check_arrow_format, restore_schema

    if master is not None or spark is not None:
        raise ConfigError("a Spark master or session needs engine='spark' (--engine spark)")
    check_arrow_format(format)
    if value_schema is not None:
        restore_schema("json", value_schema)


def _replace_output(
    output: str,
    fill: Callable[[str], int],
    result: RestoreResult,
    started: float,
    engine_started: float,
) -> int:
    """Write the table with ``fill`` and put it in place of ``output``, atomically.

    1. ``fill(<output>.tmp-<pid>)`` creates a temporary directory beside the output,
       writes the table into it and returns its rows. Death here: the old output is
       untouched; a ``.tmp-*`` directory is left to delete.
    2. Every file in it and the directory itself are fsynced, then ``_compactlog.json``
       is written into it, fsynced. Death here: as in step 1.
    3. The old output, if any, is renamed to ``<output>.old-<pid>``. Death here: the old
       table is at ``<output>.old-<pid>`` and there is no ``output`` (never a half-written
       one); the complete new table is in ``.tmp-<pid>``.
    4. The temporary directory is renamed to ``output`` and the parent directory fsynced:
       from here a crash leaves the new table.
    5. The old table is removed.
    """
    temp = f"{output}.tmp-{os.getpid()}"
    shutil.rmtree(temp, ignore_errors=True)
    try:
        rows = fill(temp)  # step 1
        logger.info(
            "restore: %s engine wrote %d rows, %.1f s",
            result.engine,
            rows,
            time.perf_counter() - engine_started,
        )
        for name in os.listdir(temp):  # step 2
            fsync_file(os.path.join(temp, name))
        fsync_dir(temp)
        result.rows = rows
        result.spark_seconds = time.perf_counter() - engine_started
        result.seconds = time.perf_counter() - started
        document = result.to_json()
        document.pop("skipped", None)
        with open(os.path.join(temp, RESULT_FILE), "wb") as handle:
            handle.write(json.dumps(document, indent=1).encode() + b"\n")
            handle.flush()
            os.fsync(handle.fileno())
        old = None
        if os.path.exists(output):  # step 3
            old = f"{output}.old-{os.getpid()}"
            os.rename(output, old)
        os.rename(temp, output)  # step 4
        fsync_dir(os.path.dirname(output))
        logger.info("restore: %s in place", output)
        if old is not None:  # step 5
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return rows


def _write_with_spark(spark: Any, read: ReadOptions, directory: str, format: str) -> int:
    """The Spark engine: the ``compactlog`` source's table, read with ``read``, written by
    Spark into ``directory`` (which it creates); returns its rows."""
    from .session import worker_python_env

    worker_python_env()
    reader = spark.read.format("compactlog").option("valueFormat", read.value_format)
    if read.value_schema:
        reader = reader.option("valueSchema", read.value_schema)
    if read.as_of is not None:
        reader = reader.option("asOfOffset", str(read.as_of))
    if read.archive_sequence is not None:
        reader = reader.option("archiveSequence", str(read.archive_sequence))
    if read.allow_inexact:
        reader = reader.option("allowInexact", "true")
    if read.num_partitions is not None:
        reader = reader.option("numPartitions", str(read.num_partitions))
    df = reader.load(read.path)
    if format == "csv":
        df = _csv_ready(df)
    writer = df.write.format(format).mode("error")
    if format == "csv":
        writer = writer.option("escape", '"')  # RFC 4180 quotes, as the Arrow engine writes
    with _session_conf(spark, PARQUET_TIMESTAMPS):
        writer.save(directory)
    return _count_rows(spark, directory, format, df.schema)


# Parquet timestamps as the Arrow engine (and pyarrow, pandas, polars) writes them: INT64
# microseconds adjusted to UTC, not Spark's default INT96 (deprecated in Parquet; pandas
# reads it as datetime64[ns], the Arrow engine's file as datetime64[us, UTC]). Spark takes
# it from the session only, not as a writer option: set for the write, then put back.
PARQUET_TIMESTAMPS = {"spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS"}


@contextmanager
def _session_conf(spark: Any, settings: dict[str, str]) -> Iterator[None]:
    """``settings`` in ``spark``'s session config while the block runs (a session that
    was given to us gets its own values back after)."""
    before = {name: spark.conf.get(name, None) for name in settings}
    for name, value in settings.items():
        spark.conf.set(name, value)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                spark.conf.unset(name)
            else:
                spark.conf.set(name, value)


def _count_rows(spark: Any, directory: str, format: str, schema: Any) -> int:
    """Rows written: from the Parquet footers (no Spark job), else by Spark reading back."""
    if format == "parquet":
        import pyarrow.parquet as pq

        return sum(
            pq.read_metadata(os.path.join(directory, name)).num_rows
            for name in os.listdir(directory)
            if name.endswith(".parquet") and not name.startswith((".", "_"))
        )
    return int(spark.read.format(format).schema(schema).load(directory).count())


def _csv_ready(df: Any) -> Any:
    """CSV has no binary or map type: binary columns become base64, headers JSON text."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType, MapType

    columns = []
    for field_ in df.schema.fields:
        if isinstance(field_.dataType, BinaryType):
            columns.append(F.base64(F.col(field_.name)).alias(field_.name))
        elif isinstance(field_.dataType, MapType):
            columns.append(
                F.to_json(F.transform_values(field_.name, lambda _k, v: F.base64(v))).alias(
                    field_.name
                )
            )
        else:
            columns.append(F.col(field_.name))
    return df.select(*columns)


__all__ = [
    "ENGINES",
    "FORMATS",
    "RESULT_FILE",
    "RestoreResult",
    "choose_engine",
    "physical_memory",
    "read_result",
    "restore",
]
