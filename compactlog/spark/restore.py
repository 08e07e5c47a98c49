"""Restore: the latest value of every key of a log, as a table written by Spark.

:func:`restore` is what ``compactlog restore`` runs. It reads the log through a snapshot
taken first (so the table is one consistent state even while writers and the cleaner
work), writes the table to a temporary directory beside the output, puts
``_compactlog.json`` (source, snapshot end offset, rows, time taken) into it and renames it
into place. A second restore that would read the same end offset (and options) finds the
record and does nothing.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import ConfigError
from ..snapshot import is_snapshot, read_manifest, take_snapshot

RESULT_FILE = "_compactlog.json"
FORMATS = ("parquet", "json", "csv", "orc")
RESTORE_SNAPSHOTS = ".snapshots"


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
    snapshot_seconds: float = 0.0
    spark_seconds: float = 0.0
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
    value_format: str = "binary",
    value_schema: str | None = None,
    master: str | None = None,
    partitions: int | None = None,
    spark: Any = None,
    progress: bool | None = None,
    allow_inexact: bool = False,
) -> RestoreResult:
    """Write the latest state of the log (or snapshot) at ``path`` to ``output``.

    ``as_of`` restores the state below that offset (refused below the cleaner point unless
    ``allow_inexact``); ``value_format="json"`` with ``value_schema`` (DDL) turns values into
    columns. ``spark``: a session to use (else a local one on ``master``, default
    ``local[*]``). ``progress``: Spark's stage progress bar (default: on a terminal).
    """
    started = time.perf_counter()
    source = os.path.abspath(os.fspath(path))
    output = os.path.abspath(os.fspath(output))
    if format not in FORMATS:
        raise ConfigError(f"format must be one of {', '.join(FORMATS)}, not {format!r}")
    if value_format == "json" and not value_schema:
        raise ConfigError("value_format='json' needs value_schema (a DDL string)")
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
        created_ms=time.time_ns() // 1_000_000,
        partitions=partitions,
    )
    previous = read_result(output)
    if previous is not None and result.same_state(previous):
        result.rows = int(previous.get("rows", 0))
        result.skipped = True
        result.seconds = time.perf_counter() - started
        return result
    if os.path.exists(output) and previous is None:
        raise ConfigError(
            f"output {output} exists and is not a compactlog restore (no {RESULT_FILE}); "
            "choose another path or remove it"
        )
    snapshot_dir, own_snapshot = _snapshot_for(source)
    try:
        manifest = read_manifest(snapshot_dir)
        result.snapshot_seconds = time.perf_counter() - started
        result.end_offset = (
            manifest.end_offset if as_of is None else min(as_of, manifest.end_offset)
        )
        if previous is not None and result.same_state(previous):
            result.rows = int(previous.get("rows", 0))
            result.skipped = True
            result.seconds = time.perf_counter() - started
            return result
        spark_started = time.perf_counter()
        session = spark if spark is not None else _session(master, progress)
        result.rows = _write_table(
            session,
            snapshot_dir,
            output,
            format=format,
            as_of=as_of,
            value_format=value_format,
            value_schema=value_schema,
            partitions=partitions,
            allow_inexact=allow_inexact,
            result=result,
            started=started,
            spark_started=spark_started,
        )
    finally:
        if own_snapshot:
            shutil.rmtree(snapshot_dir, ignore_errors=True)
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
        config={"spark.ui.showConsoleProgress": "true" if show else "false"},
    )


def _write_table(
    spark: Any,
    snapshot_dir: str,
    output: str,
    *,
    format: str,
    as_of: int | None,
    value_format: str,
    value_schema: str | None,
    partitions: int | None,
    allow_inexact: bool,
    result: RestoreResult,
    started: float,
    spark_started: float,
) -> int:
    """Steps of the atomic write: temp dir, table, result file, rename aside, rename in.

    A death before the first rename leaves the old output untouched (and a ``.tmp-*``
    directory to delete); a death between the renames leaves the old table at
    ``<output>.old-<pid>`` and no ``output`` (never a half-written one).
    """
    from .session import worker_python_env

    worker_python_env()
    reader = spark.read.format("compactlog").option("valueFormat", value_format)
    if value_schema:
        reader = reader.option("valueSchema", value_schema)
    if as_of is not None:
        reader = reader.option("asOfOffset", str(as_of))
    if allow_inexact:
        reader = reader.option("allowInexact", "true")
    if partitions is not None:
        reader = reader.option("numPartitions", str(partitions))
    df = reader.load(snapshot_dir)
    if format == "csv":
        df = _csv_ready(df)
    temp = f"{output}.tmp-{os.getpid()}"
    shutil.rmtree(temp, ignore_errors=True)
    try:
        df.write.format(format).mode("error").save(temp)
        rows = _count_rows(spark, temp, format, df.schema)
        result.rows = rows
        result.spark_seconds = time.perf_counter() - spark_started
        result.seconds = time.perf_counter() - started
        document = result.to_json()
        document.pop("skipped", None)
        with open(os.path.join(temp, RESULT_FILE), "wb") as handle:
            handle.write(json.dumps(document, indent=1).encode() + b"\n")
            handle.flush()
            os.fsync(handle.fileno())
        old = None
        if os.path.exists(output):
            old = f"{output}.old-{os.getpid()}"
            os.rename(output, old)
        os.rename(temp, output)
        _fsync_dir(os.path.dirname(output))
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return rows


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


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["FORMATS", "RESULT_FILE", "RestoreResult", "read_result", "restore"]
