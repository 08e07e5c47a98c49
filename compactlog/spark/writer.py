"""``df.write.format("compactlog").mode("append").save(path)``: a DataFrame into a log.

Tasks never touch the log. Each task writes the Arrow batches Spark hands it into a staging
file of the job; the driver appends the staged batches in :meth:`CompactLogWriter.commit`,
so a failed, retried or aborted task, and an aborted job, leave nothing in the log (the
protocol is on :func:`commit_staged`). The rows travel as Arrow from Spark to the staging
file and back; the only per-record Python is building the ``(key, value)`` list that
``Log.append_batch`` takes (the public API: the log encodes and appends it as one batch).

Columns: ``key`` and ``value`` (``binary`` or ``string``, a null value is a tombstone),
optional ``timestamp`` (``timestamp``, or ``bigint`` milliseconds; null means "now") and
optional ``headers`` (``map<string, binary|string>``). Any other column is refused before a
task runs, as is ``mode("overwrite")``: a log is append-only.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from ..errors import ConfigError
from ..fsio import DEFAULT_FS

STAGING_DIR = ".spark-staging"
COMMIT_FILE = "COMMIT"
STAGED_SUFFIX = ".arrow"
PARTIAL_SUFFIX = ".partial"
APPEND_RECORDS = 1 << 16  # staged rows appended per append_batch call (one log batch each)
WRITE_COLUMNS = ("key", "value", "timestamp", "headers")


class WriteRefusedByModeError(ConfigError):
    """``mode("overwrite")`` on a log: a log is append-only."""


@dataclass(frozen=True, slots=True)
class WriteOptions:
    path: str
    staging_dir: str  # the root; each job stages under <root>/<job id>/
    num_logs: int | None = None  # partitioned writes: hash keys to N logs (partitioned.py)


def parse_write_options(raw: Mapping[str, str]) -> WriteOptions:
    """The writer's options (the reader's are checked by ``parse_options`` as well)."""
    from .options import _int

    options = {str(k).lower(): v for k, v in raw.items()}
    path = options.get("path")
    if not path:
        raise ConfigError('no log path: use df.write.format("compactlog").save(PATH)')
    path = os.path.abspath(str(path))
    staging = options.get("stagingdir") or os.path.join(path, STAGING_DIR)
    return WriteOptions(path, os.path.abspath(str(staging)), _int(options, "numLogs", minimum=1))


def check_write_schema(schema: pa.Schema) -> None:
    """Refuse, naming the column, what the writer cannot store."""
    names = schema.names
    unknown = [n for n in names if n.lower() not in WRITE_COLUMNS]
    if unknown:
        raise ConfigError(
            f"column(s) {', '.join(unknown)} cannot be written to a log (columns: key, value, "
            "optional timestamp and headers): select or rename them first"
        )
    lowered = [n.lower() for n in names]
    for required in ("key", "value"):
        if required not in lowered:
            raise ConfigError(f"the DataFrame has no {required!r} column (binary or string)")
    for field in schema:
        name, type_ = field.name.lower(), field.type
        if name in ("key", "value") and not (
            pa.types.is_binary(type_) or pa.types.is_string(type_) or pa.types.is_null(type_)
        ):
            raise ConfigError(f"column {field.name} must be binary or string, not {type_}")
        if name == "timestamp" and not (pa.types.is_timestamp(type_) or pa.types.is_integer(type_)):
            raise ConfigError(
                f"column timestamp must be a timestamp or bigint milliseconds, not {type_}"
            )
        if name == "headers" and not (
            pa.types.is_map(type_)
            and pa.types.is_string(type_.key_type)
            and (pa.types.is_binary(type_.item_type) or pa.types.is_string(type_.item_type))
        ):
            raise ConfigError(f"column headers must be map<string, binary|string>, not {type_}")


def normalize(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``key``/``value`` as binary, ``timestamp`` as int64 ms, lower-case column names."""
    arrays, names = [], []
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        name = name.lower()
        if name in ("key", "value"):
            column = column.cast(pa.binary())
        elif name == "timestamp":
            if pa.types.is_timestamp(column.type):
                column = pc.divide(column.cast(pa.timestamp("us")).cast(pa.int64()), 1000)
            column = column.cast(pa.int64())
        arrays.append(column)
        names.append(name)
    return pa.RecordBatch.from_arrays(arrays, names=names)


# -- staging (tasks) ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StagedFile(WriterCommitMessage):
    """One task attempt's staged output: ``path`` holds ``records`` rows for log ``log``."""

    path: str
    records: int
    task: int
    log: str  # the log's directory (a partitioned write stages one file per log)


def task_identity() -> tuple[int, int]:
    """(partition id, attempt number) of the running Spark task, (0, 0) outside Spark."""
    try:
        from pyspark import TaskContext

        context = TaskContext.get()
    except Exception:
        context = None
    if context is None:
        return 0, 0
    return context.partitionId(), context.attemptNumber()


class StagingFile:
    """An Arrow IPC stream being written as ``<name>.partial``; :meth:`finish` closes it and
    renames it to ``<name>`` (so a complete name is always a complete file)."""

    def __init__(self, job_dir: str, name: str, schema: pa.Schema) -> None:
        if not os.path.isdir(job_dir):
            # abort removed the job (or it never existed): write nothing rather than
            # re-create a directory no one will clean
            raise ConfigError(f"staging directory {job_dir} is gone: the write job was aborted")
        self.path = os.path.join(job_dir, name)
        self.sink = pa.OSFile(self.path + PARTIAL_SUFFIX, "wb")
        self.writer = pa.ipc.new_stream(self.sink, schema)
        self.records = 0

    def write(self, batch: pa.RecordBatch) -> None:
        self.writer.write_batch(batch)
        self.records += batch.num_rows

    def finish(self) -> str:
        """Close and rename. No fsync: the driver's commit reads the file back and the
        log's flush is what makes the records durable; a machine that crashes before the
        commit fails the job, and a staged file is never appended without a commit."""
        self.writer.close()
        self.sink.close()
        os.rename(self.path + PARTIAL_SUFFIX, self.path)
        return self.path


def read_staged(path: str) -> Iterator[pa.RecordBatch]:
    with pa.OSFile(path, "rb") as source:
        yield from pa.ipc.open_stream(source)


# -- appending (driver) ---------------------------------------------------------------


def append_arrow(log: Any, batch: pa.RecordBatch) -> range:
    """Append one normalized Arrow batch with ``Log.append_batch`` (one log batch)."""
    names = batch.schema.names
    keys = batch.column(names.index("key")).to_pylist()
    values = batch.column(names.index("value")).to_pylist()
    kwargs: dict[str, Any] = {}
    if "timestamp" in names:
        stamps = batch.column(names.index("timestamp"))
        if stamps.null_count:
            stamps = pc.fill_null(stamps, log.clock())
        kwargs["timestamps_ms"] = stamps.to_pylist()
    if "headers" in names:
        column = batch.column(names.index("headers"))
        if column.null_count < len(column):
            kwargs["headers"] = [
                None if h is None else {k: _bytes(v) for k, v in h} for h in column.to_pylist()
            ]
    return log.append_batch(list(zip(keys, values, strict=True)), **kwargs)


def _bytes(value: Any) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else value


def _coalesced(paths: Sequence[str]) -> Iterator[pa.RecordBatch]:
    """The staged batches of ``paths`` in order, merged up to :data:`APPEND_RECORDS` rows."""
    pending: list[pa.RecordBatch] = []
    rows = 0
    for path in paths:
        for batch in read_staged(path):
            if pending and batch.schema != pending[0].schema:
                yield from _merge(pending)
                pending, rows = [], 0
            pending.append(batch)
            rows += batch.num_rows
            if rows >= APPEND_RECORDS:
                yield from _merge(pending)
                pending, rows = [], 0
    if pending:
        yield from _merge(pending)


def _merge(batches: list[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    if len(batches) == 1:
        yield batches[0]
        return
    yield from pa.Table.from_batches(batches).combine_chunks().to_batches()


def commit_staged(job_dir: str, files: dict[str, list[str]]) -> dict[str, range]:
    """Append every staged file to its log, in order; returns each log's offsets.

    ``files`` maps a log directory to the staged files of its records (in task order).

    Crash protocol (tasks stage, the driver commits; ``<job>`` is
    ``<stagingDir>/<job id>``, created by the driver before any task runs):

    1. Each task attempt writes ``<job>/task-<partition>-<attempt>-<uuid>.arrow.partial``,
       closes it and renames it to ``.arrow`` (no fsync: only this job's commit reads it,
       and the log's flush in step 3 is what makes records durable); it returns the name
       in its commit message.
       A task that dies or fails leaves a ``.partial`` or an ``.arrow`` file that no commit
       message names; a retried task writes a new file under a new name. Nothing is in the
       log. If the job then fails, :meth:`CompactLogWriter.abort` removes ``<job>``.
    2. The driver, once every task succeeded, writes ``<job>/COMMIT`` (JSON: the files
       named by the commit messages, per log, and each log's end offset now), fsynced.
       Only files named there are ever appended, so a failed attempt's output never is.
    3. The driver appends the files' batches, in order, with ``Log.append_batch`` (whole
       batches) and flushes each log (durable). If the driver dies here a prefix of the
       job's records, in whole batches and in order, is in the log; ``<job>/COMMIT`` stays
       and names the offset the job started at in each log, so an operator can see exactly
       what was appended (offsets from there) and what was not.
    4. The driver removes ``<job>``. Dying before this leaves only the staging directory
       (``COMMIT`` present: the job committed); it is safe to delete.
    """
    from ..log import open_log

    logs = {path: open_log(path) for path in files}
    try:
        manifest = {
            "files": files,
            "start_offsets": {path: log.end_offset for path, log in logs.items()},
            "time_ns": time.time_ns(),
        }
        _write_json(os.path.join(job_dir, COMMIT_FILE), manifest)  # step 2
        appended: dict[str, range] = {}
        collecting = gc.isenabled()
        gc.disable()  # the (key, value) tuples would wake the collector (~30% of the time)
        try:
            for path, log in logs.items():  # step 3
                first = last = None
                for batch in _coalesced(files[path]):
                    if not batch.num_rows:
                        continue
                    offsets = append_arrow(log, batch)
                    first = offsets.start if first is None else first
                    last = offsets.stop
                log.flush()
                end = log.end_offset
                appended[path] = range(end, end) if first is None else range(first, last or first)
        finally:
            if collecting:
                gc.enable()
    finally:
        for log in logs.values():
            log.close()
    shutil.rmtree(job_dir, ignore_errors=True)  # step 4
    return appended


def _write_json(path: str, data: Any) -> None:
    DEFAULT_FS.write_atomic(
        os.path.dirname(path), os.path.basename(path), json.dumps(data).encode()
    )


def ensure_log(path: str) -> None:
    """Create the log at ``path`` if it does not exist yet (a write to a new path)."""
    from ..log import open_log

    if not os.path.exists(os.path.join(path, "meta")):
        open_log(path).close()


def start_job(staging_dir: str) -> str:
    """Create a new job's staging directory under ``staging_dir``; returns it."""
    job_dir = os.path.join(staging_dir, f"job-{time.time_ns()}-{uuid.uuid4().hex[:12]}")
    os.makedirs(job_dir)
    return job_dir


class CompactLogWriter(DataSourceArrowWriter):
    """Tasks stage Arrow batches; the driver appends them (:func:`commit_staged`)."""

    def __init__(self, options: WriteOptions, job_dir: str) -> None:
        self.options = options
        self.job_dir = job_dir

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        partition, attempt = task_identity()
        staged: StagingFile | None = None
        name = f"task-{partition:05d}-{attempt}-{uuid.uuid4().hex[:12]}{STAGED_SUFFIX}"
        for batch in iterator:
            batch = normalize(batch)
            if staged is None:
                staged = StagingFile(self.job_dir, name, batch.schema)
            staged.write(batch)
        if staged is None:
            return StagedFile("", 0, partition, self.options.path)
        return StagedFile(staged.finish(), staged.records, partition, self.options.path)

    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        commit_staged(self.job_dir, staged_files(messages))

    def abort(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        """Remove the job's staging directory: every attempt's output, named or not."""
        shutil.rmtree(self.job_dir, ignore_errors=True)


def staged_files(messages: Sequence[WriterCommitMessage | None]) -> dict[str, list[str]]:
    """Per log, the staged files the successful tasks named, in task order."""
    flat: list[StagedFile] = []
    for message in messages:
        if isinstance(message, StagedFile):
            flat.append(message)
        elif message is not None and hasattr(message, "files"):  # partitioned.StagedFiles
            flat.extend(message.files)
    staged = sorted((m for m in flat if m.path), key=lambda m: (m.log, m.task, m.path))
    files: dict[str, list[str]] = {}
    for message in staged:
        files.setdefault(message.log, []).append(message.path)
    return files


def make_writer(raw_options: Mapping[str, str], schema: Any, overwrite: bool) -> Any:
    """What ``DataSource.writer`` returns: checks mode and columns, starts the job."""
    from .arrow import target_schema

    options = parse_write_options(raw_options)
    if overwrite:
        raise WriteRefusedByModeError(
            f"mode('overwrite') is refused for {options.path}: a log is append-only. Use "
            "mode('append'); to replace every key's value append new records (a compacted "
            "log keeps the latest), or write to a new path"
        )
    check_write_schema(target_schema(schema))
    if options.num_logs is not None:
        from .partitioned import PartitionedWriter, prepare_partitioned

        prepare_partitioned(options.path, options.num_logs)
        return PartitionedWriter(options, start_job(options.staging_dir))
    ensure_log(options.path)
    return CompactLogWriter(options, start_job(options.staging_dir))


__all__ = [
    "CompactLogWriter",
    "StagedFile",
    "WriteOptions",
    "WriteRefusedByModeError",
    "append_arrow",
    "check_write_schema",
    "commit_staged",
    "make_writer",
    "parse_write_options",
]
