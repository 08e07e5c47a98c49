"""``df.write.format("compactlog").mode("append").save(path)``: a DataFrame into a log.

Tasks never touch the log. Each task encodes the Arrow batches Spark hands it into the
log's record batches (``format.encode_columns`` straight from Arrow's offset and data
buffers: no per-record Python object, except for a ``headers`` column) and writes them to a
staging file of the job; the driver, in :meth:`CompactLogWriter.commit`, checks every staged
file (CRC) and appends its batches with ``Log.append_encoded``, which only stamps base
offsets: the encoding, the costly part, runs in parallel on the executors and the driver's
share is nearly a file copy. A failed, retried or aborted task, and an aborted job, leave
nothing in the log (the protocol is on :func:`commit_staged`).

Columns: ``key`` and ``value`` (``binary`` or ``string``, a null value is a tombstone),
optional ``timestamp`` (``timestamp``, or ``bigint`` milliseconds; null means "now") and
optional ``headers`` (``map<string, binary|string>``). Any other column is refused before a
task runs, as is ``mode("overwrite")``: a log is append-only.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import shutil
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from ..errors import CompactLogError, ConfigError, InvalidRecordError, RecordTooLargeError
from ..format import (
    CODECS,
    STAGING_FILE_HEADER,
    EncodedBatch,
    encode_columns,
    encode_header_column,
    read_staged_batches,
)
from ..fsio import DEFAULT_FS
from ..log import wall_clock_ms
from ..state_files import read_meta
from ..writer import encode_within_segment

STAGING_DIR = ".spark-staging"
COMMIT_FILE = "COMMIT"
STAGED_SUFFIX = ".batches"
PARTIAL_SUFFIX = ".partial"
APPEND_RECORDS = 1 << 16  # rows per staged batch (what the old commit gave append_batch)
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


# -- encoding and staging (tasks) -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class LogEncoding:
    """What a task needs of a target log's configuration to encode its batches, read by
    the driver when the job starts (the commit checks the batches again against the
    configuration the log has then: :meth:`compactlog.log.Log.check_encoded`)."""

    codec: int
    level: int
    cleanup_policy: str
    max_record_bytes: int
    segment_bytes: int

    @property
    def compacted(self) -> bool:
        return "compact" in self.cleanup_policy


def log_encoding(path: str) -> LogEncoding:
    """The encoding settings of the log at ``path`` (which must exist)."""
    config = read_meta(path).config
    return LogEncoding(
        CODECS[config.compression],
        config.compression_level,
        config.cleanup_policy,
        config.max_record_bytes,
        config.segment_bytes,
    )


def binary_column(column: pa.ChunkedArray) -> tuple[np.ndarray, list[Any]]:
    """A ``binary`` column as the batch body wants it: ``int32`` lengths (-1 for a null)
    and the parts whose concatenation is the blob, taken from Arrow's offset and data
    buffers (views, no per-record object; the body is their one copy)."""
    lengths: list[np.ndarray] = []
    parts: list[Any] = []
    for chunk in column.chunks:
        chunk_lengths, part = _binary_chunk(chunk)
        lengths.append(chunk_lengths)
        parts.append(part)
    if not lengths:
        return np.empty(0, dtype=np.int32), []
    return (lengths[0] if len(lengths) == 1 else np.concatenate(lengths)), parts


def _binary_chunk(chunk: pa.Array) -> tuple[np.ndarray, Any]:
    n = len(chunk)
    if not n:
        return np.empty(0, dtype=np.int32), b""
    if chunk.null_count:
        # a null slot may still span bytes of the data buffer (Arrow allows it): take the
        # present values' bytes from the array without its nulls
        lengths = np.full(n, -1, dtype=np.int32)
        present, part = _binary_chunk(chunk.drop_null())
        lengths[chunk.is_valid().to_numpy(zero_copy_only=False)] = present
        return lengths, part
    _validity, offsets_buffer, data = chunk.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=np.int32, count=n + 1, offset=4 * chunk.offset)
    first, last = int(offsets[0]), int(offsets[-1])
    part = memoryview(data)[first:last] if data is not None and last > first else b""
    return np.diff(offsets).astype(np.int32, copy=False), part


def encode_table(table: pa.Table, encoding: LogEncoding, now_ms: int) -> EncodedBatch:
    """Rows of a normalized table (``key``, ``value``, optional ``timestamp`` and
    ``headers``) as one batch, by ``format.encode_columns`` (byte for byte what
    ``format.encode_batch`` makes of the same rows as Python objects; tested). A null or
    absent timestamp is ``now_ms``. Headers are the one column encoded per record
    (``format.encode_headers``)."""
    names = table.schema.names
    timestamps: int | np.ndarray = now_ms
    if "timestamp" in names:
        stamps = table.column("timestamp")
        if stamps.null_count:
            stamps = pc.fill_null(stamps, now_ms)
        timestamps = stamps.to_numpy()
    headers = None
    if "headers" in names and table.column("headers").null_count < table.num_rows:
        headers = [
            None if h is None else {k: _bytes(v) for k, v in h}
            for h in table.column("headers").to_pylist()
        ]
    header_lengths, header_parts = encode_header_column(headers)
    return encode_columns(
        *binary_column(table.column("key")),
        *binary_column(table.column("value")),
        timestamps,
        header_lengths=header_lengths,
        header_parts=header_parts,
        codec=encoding.codec,
        level=encoding.level,
    )


def _bytes(value: Any) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else value


def encode_rows(table: pa.Table, encoding: LogEncoding, log: str) -> list[EncodedBatch]:
    """Rows of a normalized table as the batches ``Log.append_batch`` would append for
    them (one, or several cut by ``writer.encode_within_segment`` so segments still roll
    near ``segment_bytes``), refusing in the task what the log would refuse: a null key on
    a compacted log, a negative timestamp, a record over ``max_record_bytes``."""
    keys = table.column("key")
    if keys.null_count and encoding.compacted:
        raise InvalidRecordError(
            f"{keys.null_count} row(s) with a null key: the log is compacted "
            f"(cleanup_policy={encoding.cleanup_policy!r}) and every record needs a key; "
            "filter them out (or write to a log whose cleanup_policy has no 'compact')",
            path=log,
        )
    if "timestamp" in table.schema.names:
        lowest = pc.min(table.column("timestamp")).as_py()
        if lowest is not None and lowest < 0:
            raise InvalidRecordError(
                f"timestamp {lowest} ms is before 1970: timestamps must be non-negative",
                path=log,
            )
    now = wall_clock_ms()

    def encode(lo: int, hi: int) -> EncodedBatch:
        part = table if lo == 0 and hi == table.num_rows else table.slice(lo, hi - lo)
        return encode_table(part, encoding, now)

    def sizes() -> list[int]:
        key_lengths, _ = binary_column(keys)
        value_lengths, _ = binary_column(table.column("value"))
        return (np.maximum(key_lengths, 0) + np.maximum(value_lengths, 0)).tolist()

    batches = encode_within_segment(encode, table.num_rows, sizes, encoding.segment_bytes)
    largest = max(b.largest_record for b in batches)
    if largest > encoding.max_record_bytes:
        raise RecordTooLargeError(
            f"a record of {largest} bytes exceeds max_record_bytes={encoding.max_record_bytes}",
            path=log,
        )
    return batches


@dataclass(frozen=True, slots=True)
class StagedFile(WriterCommitMessage):
    """One task attempt's staged output for log ``log``: ``path`` holds ``records`` rows
    in ``size`` bytes; ``batches`` is, per staged batch, what its bytes do not say and the
    commit checks against the log (``(largest_record, null_keys)``)."""

    path: str
    records: int
    task: int
    log: str  # the log's directory (a partitioned write stages one file per log)
    size: int = 0
    batches: tuple[tuple[int, bool], ...] = ()


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
    """One task attempt's rows for one log, encoded into batches (up to
    :data:`APPEND_RECORDS` rows each, as the log would append them) and written to
    ``<name>.partial`` as they fill; :meth:`finish` closes it and renames it to ``<name>``
    (so a complete name is always a complete file). Layout: ``docs/format.md`` (staging
    file): a file header, then each batch exactly as a segment stores it, at base offset 0
    (the commit stamps the real one)."""

    def __init__(self, job_dir: str, name: str, log: str, encoding: LogEncoding) -> None:
        if not os.path.isdir(job_dir):
            # abort removed the job (or it never existed): write nothing rather than
            # re-create a directory no one will clean
            raise ConfigError(f"staging directory {job_dir} is gone: the write job was aborted")
        self.path = os.path.join(job_dir, name)
        self.log = log
        self.encoding = encoding
        self.file = open(self.path + PARTIAL_SUFFIX, "wb")  # noqa: SIM115 (closed by finish)
        self.file.write(STAGING_FILE_HEADER)
        self.size = len(STAGING_FILE_HEADER)
        self.records = 0
        self.extras: list[tuple[int, bool]] = []
        self.pending: list[pa.RecordBatch] = []
        self.pending_rows = 0

    def write(self, batch: pa.RecordBatch) -> None:
        if not batch.num_rows:
            return
        if self.pending and batch.schema != self.pending[0].schema:
            self._encode_pending()
        self.pending.append(batch)
        self.pending_rows += batch.num_rows
        if self.pending_rows >= APPEND_RECORDS:
            self._encode_pending()

    def _encode_pending(self) -> None:
        table = pa.Table.from_batches(self.pending)
        self.pending, self.pending_rows = [], 0
        for encoded in encode_rows(table, self.encoding, self.log):
            self.file.write(encoded.header(0))
            self.file.write(encoded.body)
            self.size += encoded.size
            self.records += encoded.count
            self.extras.append((encoded.largest_record, encoded.null_keys))

    def finish(self, task: int) -> StagedFile:
        """Encode what is pending, close and rename. No fsync: the driver's commit reads
        the file back (checking every batch's CRC) and the log's flush is what makes the
        records durable; a machine that crashes before the commit fails the job, and a
        staged file is never appended without a commit."""
        if self.pending:
            self._encode_pending()
        self.file.close()
        os.rename(self.path + PARTIAL_SUFFIX, self.path)
        return StagedFile(self.path, self.records, task, self.log, self.size, tuple(self.extras))

    def close(self) -> None:
        """Close without finishing (the task failed: the ``.partial`` file stays for
        ``abort`` to remove with the job directory)."""
        self.file.close()


def stage_task(
    job_dir: str,
    iterator: Iterator[pa.RecordBatch],
    route: Any,
    encodings: Mapping[str, LogEncoding],
) -> list[StagedFile]:
    """A task's rows, normalized, split by ``route(batch) -> [(log, rows)]`` and staged
    into one :class:`StagingFile` per target log; returns their commit messages."""
    partition, attempt = task_identity()
    tag = uuid.uuid4().hex[:12]
    staged: dict[str, StagingFile] = {}
    try:
        for batch in iterator:
            for log, rows in route(normalize(batch)):
                if log not in staged:
                    suffix = "" if len(encodings) == 1 else f"-{os.path.basename(log)}"
                    name = f"task-{partition:05d}-{attempt}-{tag}{suffix}{STAGED_SUFFIX}"
                    staged[log] = StagingFile(job_dir, name, log, encodings[log])
                staged[log].write(rows)
        return [staged[log].finish(partition) for log in sorted(staged)]
    except BaseException:
        for file in staged.values():
            file.close()
        raise


# -- appending (driver) ---------------------------------------------------------------


class StagedFileError(CompactLogError):
    """A staged file that does not hold what its task reported (damaged or truncated):
    the commit refuses the job before appending anything."""


class CheckedStaging:
    """A staged file mapped into memory and checked (size, file header, every batch's
    CRC, the batches and records its task reported), its batches ready to append."""

    def __init__(self, message: StagedFile) -> None:
        self.map: mmap.mmap | None = None
        self.batches: list[EncodedBatch] = []
        try:
            with open(message.path, "rb") as file:
                size = os.fstat(file.fileno()).st_size
                if size != message.size:
                    raise ValueError(f"{size} bytes, its task wrote {message.size}")
                self.map = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
            self.batches = read_staged_batches(self.map, message.batches)
            records = sum(b.count for b in self.batches)
            if records != message.records:
                raise ValueError(f"{records} records, its task wrote {message.records}")
        except (OSError, ValueError) as error:
            self.close()
            raise StagedFileError(
                f"staged file is damaged ({error}): the write job is refused and nothing "
                "of it was appended",
                path=message.path,
            ) from None

    def close(self) -> None:
        for batch in self.batches:
            if isinstance(batch.body, memoryview):
                batch.body.release()  # the map cannot close while a view of it is alive
        self.batches = []
        if self.map is not None:
            self.map.close()
            self.map = None

    def __enter__(self) -> CheckedStaging:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def commit_staged(job_dir: str, files: Mapping[str, Sequence[StagedFile]]) -> dict[str, range]:
    """Append every staged file to its log, in order; returns each log's offsets.

    ``files`` maps a log directory to the commit messages of the staged files of its
    records (in task order).

    Crash protocol (tasks encode and stage, the driver checks and appends; ``<job>`` is
    ``<stagingDir>/<job id>``, created by the driver before any task runs, which also
    reads each target log's configuration for the tasks: :class:`LogEncoding`):

    1. Each task attempt encodes its rows into record batches (``format.encode_columns``
       from the Arrow buffers; zstd if the log compresses; a null key on a compacted log,
       a negative timestamp or a record over ``max_record_bytes`` fails the task), writes
       them at base offset 0 into ``<job>/task-<partition>-<attempt>-<uuid>.batches
       .partial``, closes it and renames it to ``.batches`` (no fsync: only this job's
       commit reads it, and the log's flush in step 4 is what makes records durable); its
       commit message names the file, its size and, per batch, its largest record and
       whether it has null keys. A task that dies or fails leaves a ``.partial`` or a
       ``.batches`` file that no commit message names; a retried task writes a new file
       under a new name. Nothing is in the log. If the job then fails,
       :meth:`CompactLogWriter.abort` removes ``<job>``.
    2. The driver, once every task succeeded, maps every named file and checks it before
       appending anything: its size, its header, each batch's CRC and base offset, the
       batch and record counts its task reported, and each batch against the log's
       configuration now (``Log.check_encoded``). A damaged file fails the commit with
       :class:`StagedFileError` and the log unchanged (Spark then calls ``abort``).
    3. It writes ``<job>/COMMIT`` (JSON: the files named by the commit messages, per log,
       and each log's end offset now), fsynced. Only files named there are ever appended,
       so a failed attempt's output never is.
    4. It appends the files' batches, in order, with ``Log.append_encoded`` (the writer
       stamps each batch's base offset into its 40 checksummed header bytes and writes the
       staged body as it is: nearly a file copy) and flushes each log (durable). If the
       driver dies here a prefix of the job's records, in whole batches and in order, is in
       the log; ``<job>/COMMIT`` stays and names the offset the job started at in each
       log, so an operator can see exactly what was appended (offsets from there) and
       what was not.
    5. The driver removes ``<job>``. Dying before this leaves only the staging directory
       (``COMMIT`` present: the job committed); it is safe to delete.
    """
    from ..log import open_log

    with contextlib.ExitStack() as stack:
        logs = {path: stack.enter_context(open_log(path)) for path in files}
        checked = {  # step 2
            path: [stack.enter_context(CheckedStaging(m)) for m in messages]
            for path, messages in files.items()
        }
        for path, log in logs.items():
            for staging in checked[path]:
                log.check_encoded(staging.batches)
        manifest = {
            "files": {path: [m.path for m in messages] for path, messages in files.items()},
            "start_offsets": {path: log.end_offset for path, log in logs.items()},
            "time_ns": time.time_ns(),
        }
        _write_json(os.path.join(job_dir, COMMIT_FILE), manifest)  # step 3
        appended: dict[str, range] = {}
        for path, log in logs.items():  # step 4
            first = last = log.end_offset
            for number, batch in enumerate(b for c in checked[path] for b in c.batches):
                offsets = log.append_encoded([batch])
                first = offsets.start if number == 0 else first
                last = offsets.stop
            log.flush()
            appended[path] = range(first, last)
    shutil.rmtree(job_dir, ignore_errors=True)  # step 5
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
    """Tasks encode and stage batches; the driver appends them (:func:`commit_staged`)."""

    def __init__(
        self, options: WriteOptions, job_dir: str, encodings: Mapping[str, LogEncoding]
    ) -> None:
        self.options = options
        self.job_dir = job_dir
        self.encodings = dict(encodings)  # per target log, read by the driver

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        log = self.options.path
        files = stage_task(self.job_dir, iterator, lambda b: [(log, b)], self.encodings)
        return files[0] if files else StagedFile("", 0, task_identity()[0], log)

    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        commit_staged(self.job_dir, staged_files(messages))

    def abort(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        """Remove the job's staging directory: every attempt's output, named or not."""
        shutil.rmtree(self.job_dir, ignore_errors=True)


def staged_files(messages: Sequence[WriterCommitMessage | None]) -> dict[str, list[StagedFile]]:
    """Per log, the staged files the successful tasks named, in task order."""
    flat: list[StagedFile] = []
    for message in messages:
        if isinstance(message, StagedFile):
            flat.append(message)
        elif message is not None and hasattr(message, "files"):  # partitioned.StagedFiles
            flat.extend(message.files)
    staged = sorted((m for m in flat if m.path), key=lambda m: (m.log, m.task, m.path))
    files: dict[str, list[StagedFile]] = {}
    for message in staged:
        files.setdefault(message.log, []).append(message)
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

        logs = prepare_partitioned(options.path, options.num_logs)
        encodings = {log: log_encoding(log) for log in logs}
        return PartitionedWriter(options, start_job(options.staging_dir), encodings)
    ensure_log(options.path)
    encodings = {options.path: log_encoding(options.path)}
    return CompactLogWriter(options, start_job(options.staging_dir), encodings)


__all__ = [
    "CompactLogWriter",
    "LogEncoding",
    "StagedFile",
    "StagedFileError",
    "WriteOptions",
    "WriteRefusedByModeError",
    "check_write_schema",
    "commit_staged",
    "encode_rows",
    "encode_table",
    "make_writer",
    "parse_write_options",
]
