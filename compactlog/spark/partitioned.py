"""Many logs as one table: a directory of ``partition-<N>`` logs, as a Kafka topic has
partitions.

Layout: ``<table>/partition-0``, ``<table>/partition-1``, ... each an ordinary log (the
cleaner service compacts each on its own). ``<table>`` itself is not a log. Reading it with
``spark.read.format("compactlog").load(table)`` gives the union of its logs with an extra
``partition int`` column, one or more Spark partitions per log; every option applies to each
log (latest mode is per log, which is the whole truth when each key lives in one log, as
the writer guarantees).

Writing with ``.option("numLogs", N)`` hashes each key to one of ``N`` logs
(:func:`compactlog.routing.key_partitions`: 64-bit FNV-1a of the key bytes, modulo ``N``;
stable across versions and machines, so a key always lands in the same log and compaction
keeps working; applications route by the same module without Spark). A null key goes to
partition 0. ``N`` is fixed once the directory exists: writing with a
different ``N`` is refused (it would send keys to other logs).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition, WriterCommitMessage

from ..arrow.encode import log_encoding
from ..errors import ConfigError, WriteRefusedByModeError
from ..restore.options import ReadOptions
from ..routing import fnv1a64, key_partitions
from ..storage import filenames
from ..storage.logdirs import PARTITION_COLUMN, is_partitioned, list_partitions, partition_dir
from .user_errors import ours
from .writer import (
    CompactLogWriter,
    StagedFile,
    check_write_schema,
    ensure_log,
    parse_write_options,
    stage_task,
    start_job,
)


def prepare_partitioned(table: str, count: int) -> list[str]:
    """Make ``table`` a directory of ``count`` logs (creating missing ones); refuse a log
    or a directory with another number of logs."""
    from ..log import open_log

    if os.path.exists(os.path.join(table, filenames.META)):
        raise ConfigError(
            f"{table} is a single log: numLogs writes a directory of logs (use another path, "
            "or drop numLogs to append to this log)"
        )
    existing = list_partitions(table)
    if existing and [n for n, _d in existing] != list(range(count)):
        raise ConfigError(
            f"{table} holds {len(existing)} logs (partitions "
            f"{', '.join(str(n) for n, _d in existing)}), not numLogs={count}: changing the "
            "number of logs would send keys to other logs"
        )
    directories = [partition_dir(table, i) for i in range(count)]
    for directory in directories:
        if not os.path.exists(os.path.join(directory, filenames.META)):
            open_log(directory).close()
    return directories


# -- writing --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StagedFiles(WriterCommitMessage):
    """A partitioned task's staged files, one per log it wrote to."""

    files: tuple[StagedFile, ...]


class PartitionedWriter(CompactLogWriter):
    """Stages each task's rows per target log; the driver appends each log's files
    (the protocol of :func:`compactlog.spark.writer.commit_staged`, per log)."""

    @ours
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        count = self.options.num_logs or 1
        table = self.options.path

        def route(batch: pa.RecordBatch) -> Iterator[tuple[str, pa.RecordBatch]]:
            targets = key_partitions(batch.column(batch.schema.names.index("key")), count)
            for log_index in np.unique(targets).tolist():
                yield partition_dir(table, log_index), batch.filter(pa.array(targets == log_index))

        return StagedFiles(tuple(stage_task(self.job_dir, iterator, route, self.encodings)))


# -- reading --------------------------------------------------------------------------


class PartitionedInputPartition(InputPartition):
    """Offsets ``[start, end)`` of log ``log`` (the ``plan``-th plan of the reader)."""

    def __init__(self, index: int, plan: int, log: int, start: int, end: int) -> None:
        super().__init__(index)
        self.index, self.plan, self.log, self.start, self.end = index, plan, log, start, end

    def __repr__(self) -> str:
        return f"PartitionedInputPartition(log {self.log}, offsets {self.start}..{self.end})"


def log_schema(schema: Any) -> Any:
    """The read schema without the ``partition`` column (what each log produces)."""
    from pyspark.sql.types import StructType

    return StructType([f for f in schema.fields if f.name != PARTITION_COLUMN])


class PartitionedReader(DataSourceReader):
    """Plans every log of the directory (each through its own implicit snapshot)."""

    def __init__(self, options: ReadOptions, schema: Any) -> None:
        from ..arrow.convert import Layout
        from ..restore.plan import plan_read
        from .arrow import target_schema

        self.options = options
        self.schema = schema
        Layout(target_schema(log_schema(schema)), options.value_format).check()
        self.logs = list_partitions(os.path.abspath(options.path))
        self.plans = [plan_read(replace(options, path=directory)) for _n, directory in self.logs]

    def partitions(self) -> Sequence[InputPartition]:
        parts: list[InputPartition] = []
        for plan_index, ((number, _directory), plan) in enumerate(
            zip(self.logs, self.plans, strict=True)
        ):
            for p in plan.partitions:
                if p.end > p.start:
                    parts.append(
                        PartitionedInputPartition(len(parts), plan_index, number, p.start, p.end)
                    )
        return parts or [PartitionedInputPartition(0, -1, 0, 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from ..arrow.convert import Layout, to_arrow
        from ..restore.plan import Partition, read_partition
        from .arrow import target_schema

        assert isinstance(partition, PartitionedInputPartition)
        if partition.plan < 0:
            return
        full = target_schema(self.schema)
        layout = Layout(target_schema(log_schema(self.schema)), self.options.value_format)
        plan = self.plans[partition.plan]
        part = Partition(partition.index, partition.start, partition.end)
        for columns, keep in read_partition(plan, part):
            batch = to_arrow(columns, keep, layout)
            number = pa.array(np.full(batch.num_rows, partition.log, dtype=np.int32))
            arrays = {name: batch.column(name) for name in batch.schema.names}
            arrays[PARTITION_COLUMN] = number
            yield pa.RecordBatch.from_arrays([arrays[f.name] for f in full], schema=full)


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
        logs = prepare_partitioned(options.path, options.num_logs)
        encodings = {log: log_encoding(log) for log in logs}
        return PartitionedWriter(options, start_job(options.staging_dir), encodings)
    ensure_log(options.path)
    encodings = {options.path: log_encoding(options.path)}
    return CompactLogWriter(options, start_job(options.staging_dir), encodings)


__all__ = [
    "PARTITION_COLUMN",
    "PartitionedReader",
    "PartitionedWriter",
    "StagedFiles",
    "fnv1a64",
    "is_partitioned",
    "key_partitions",
    "list_partitions",
    "make_writer",
    "prepare_partitioned",
]
