"""``df.write.format("compactlog").mode("append").save(path)``: a DataFrame into a log.

Tasks never touch the log. Each task encodes the Arrow batches Spark hands it into the
log's record batches (``batch_encode.encode_columns`` straight from Arrow's offset and data
buffers: no per-record Python object, except for a ``headers`` column) and writes them to a
staging file of the job; the driver, in :meth:`CompactLogWriter.commit`, checks every staged
file (CRC) and appends its batches with ``Log.append_encoded``, which only stamps base
offsets: the encoding, the costly part, runs in parallel on the executors and the driver's
share is nearly a file copy. A failed, retried or aborted task, and an aborted job, leave
nothing in the log (the protocol is on :func:`commit_staged`).

Columns: those :mod:`compactlog.arrow.encode` (the encoder, shared with
``Log.append_arrow``) takes: ``key``, ``value``, optional ``timestamp`` and ``headers``.
Any other column is refused before a task runs, as is ``mode("overwrite")``: a log is
append-only.
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

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage

from ..arrow.encode import (
    APPEND_RECORDS,
    LogEncoding,
    check_write_schema,
    encode_rows,
    normalize,
)
from ..encoding.batch_encode import EncodedBatch, read_staged_batches
from ..encoding.format import STAGING_FILE_HEADER
from ..errors import ConfigError, StagedFileError, WriteRefusedByModeError
from ..log import wall_clock_ms
from ..storage import filenames
from ..storage.fsio import DEFAULT_FS
from .user_errors import ours

STAGING_DIR = ".spark-staging"
COMMIT_FILE = "COMMIT"
STAGED_SUFFIX = ".batches"
PARTIAL_SUFFIX = ".partial"


@dataclass(frozen=True, slots=True)
class WriteOptions:
    path: str
    staging_dir: str  # the root; each job stages under <root>/<job id>/
    num_logs: int | None = None  # partitioned writes: hash keys to N logs (partitioned.py)


def parse_write_options(raw: Mapping[str, str]) -> WriteOptions:
    """The writer's options (the reader's are checked by ``parse_options`` as well)."""
    from ..restore.options import _int

    options = {str(k).lower(): v for k, v in raw.items()}
    path = options.get("path")
    if not path:
        raise ConfigError('no log path: use df.write.format("compactlog").save(PATH)')
    path = os.path.abspath(str(path))
    staging = options.get("stagingdir") or os.path.join(path, STAGING_DIR)
    return WriteOptions(path, os.path.abspath(str(staging)), _int(options, "numLogs", minimum=1))


# -- encoding and staging (tasks) -----------------------------------------------------


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
        for encoded in encode_rows(table, self.encoding, self.log, wall_clock_ms()):
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

    1. Each task attempt encodes its rows into record batches (``batch_encode.encode_columns``
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

    if not os.path.exists(os.path.join(path, filenames.META)):
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

    @ours
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        log = self.options.path
        files = stage_task(self.job_dir, iterator, lambda b: [(log, b)], self.encodings)
        return files[0] if files else StagedFile("", 0, task_identity()[0], log)

    @ours
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


__all__ = [
    "CompactLogWriter",
    "LogEncoding",
    "StagedFile",
    "StagedFileError",
    "WriteOptions",
    "WriteRefusedByModeError",
    "check_write_schema",
    "commit_staged",
    "parse_write_options",
]
