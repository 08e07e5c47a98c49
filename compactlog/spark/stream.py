"""``spark.readStream.format("compactlog")``: the changelog as a stream whose offsets are log
offsets.

A Spark offset is ``{"offset": N}``: the next log offset to read. A micro-batch reads the
records with offsets in ``[start, end)`` from the live log (no snapshot: the range is fixed
by its offsets, and the reader follows offsets across the cleaner's swaps and retention's
deletions, ``compactlog/reader.py``). Rows are those of changelog mode.

Admission control. ``maxRecordsPerTrigger=N`` makes :meth:`latestOffset` return the end of
a range holding at most N records (``restore.ranges.records_end``): below the cleaner point
they are counted from the batch headers, so a range compaction emptied costs no trigger of
its own (cut by offsets alone, a stream behind a log appended faster than it read saw only
emptied ranges and never caught up); elsewhere N offsets hold at most N records. Spark
passes ``ReadAllAvailable`` where a trigger demands it; that is honoured.

``Trigger.AvailableNow``. :meth:`prepareForTriggerAvailableNow` records the log's end offset
once; :meth:`latestOffset` never goes past it, so the query stops at the end seen at its
start, in micro-batches that still respect ``maxRecordsPerTrigger``.

Restart and replay. Spark checkpoints each batch's ``[start, end)`` before running it; after
a stop mid-batch it replays the same range with :meth:`partitions` without asking
:meth:`latestOffset`. Offsets never move, so a replay yields the same records, or, if the
cleaner compacted the range meanwhile, a subset from which only records superseded by a
later record of the same key are missing: every key's latest value comes out right, so an
idempotent sink (a file sink, an upsert keyed by ``key`` keeping the highest ``offset``) ends
equal either way.

Retention. A start below the log start (retention deleted what the query had not read)
follows the subscriber rule: the batch reads from the log start; the end offset of that
batch carries ``"skippedFrom"``/``"skippedTo"`` (visible in ``query.lastProgress``), and a
warning is logged. Compaction never fails a batch: a compacted range just yields fewer rows.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from ..errors import CompactLogError, ConfigError
from ..restore.options import ReadOptions, _int
from .input_partition import CompactLogPartition  # a micro-batch task is a batch task
from .user_errors import ours

log = logging.getLogger("compactlog.spark.stream")

STARTING = ("earliest", "latest")


@dataclass(frozen=True, slots=True)
class StreamOptions:
    max_records: int | None
    starting: str | int  # "earliest", "latest" or an offset


def parse_stream_options(raw: Mapping[str, str], options: ReadOptions) -> StreamOptions:
    """The streaming options, and a refusal of what a stream cannot do. A stream is always
    in changelog mode (the default); only an explicit other mode is refused."""
    lowered = {str(k).lower(): v for k, v in raw.items()}
    if options.mode_given and options.mode != "changelog":
        raise ConfigError(
            f"option mode={options.mode} cannot be streamed: a compactlog stream reads every "
            'record (changelog mode, its default; .option("mode", "changelog") adds the '
            "deleted column); for the latest value of each key, upsert the stream with "
            "foreachBatch (docs/spark.md)"
        )
    for name, value in (("asOfOffset", options.as_of), ("keys", options.keys)):
        if value is not None:
            raise ConfigError(f"option {name} is not supported by a stream")
    starting_raw = str(lowered.get("startingoffsets", "earliest")).strip().lower()
    if starting_raw in STARTING:
        starting: str | int = starting_raw
    else:
        try:
            starting = int(starting_raw)
        except ValueError:
            raise ConfigError(
                f"option startingOffsets must be earliest, latest or an offset, not "
                f"{starting_raw!r}"
            ) from None
        if starting < 0:
            raise ConfigError(f"option startingOffsets must be at least 0, not {starting}")
    return StreamOptions(_int(lowered, "maxRecordsPerTrigger", minimum=1), starting)


def log_bounds(path: str) -> tuple[int, int]:
    """``(log start, end offset)`` of the live log now."""
    from ..log import open_log

    with open_log(path, read_only=True, create=False) as opened:
        return opened.start_offset, opened.end_offset


class CompactLogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches over log offsets; see the module docstring for the guarantees."""

    def __init__(self, options: ReadOptions, stream: StreamOptions, schema: StructType) -> None:
        from ..arrow.convert import Layout
        from .arrow import target_schema

        self.options = options
        self.stream = stream
        self.schema = schema
        self.path = os.path.abspath(options.path)
        self.target: int | None = None  # AvailableNow: never read past this end offset
        Layout(target_schema(schema), options.value_format).check()
        log_bounds(self.path)  # the log must exist: fail at start, naming the path

    def initialOffset(self) -> dict:
        start, end = log_bounds(self.path)
        if self.stream.starting == "earliest":
            return {"offset": start}
        if self.stream.starting == "latest":
            return {"offset": end}
        return {"offset": int(self.stream.starting)}

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.stream.max_records is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.stream.max_records)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = log_bounds(self.path)[1]

    def reportLatestOffset(self) -> dict:
        return {"offset": log_bounds(self.path)[1]}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        from ..restore.ranges import records_end

        log_start, end = log_bounds(self.path)
        if self.target is not None:
            end = min(end, self.target)
        position = int(start["offset"])
        begin = max(position, log_start)
        if isinstance(limit, ReadMaxRows):
            end = records_end(self.path, begin, end, int(limit.max_rows))
        end = max(end, position)
        if end == position:
            return {"offset": position}  # nothing new: Spark runs no batch
        offset: dict[str, Any] = {"offset": end}
        if begin > position:
            log.warning(
                "compactlog stream of %s: offset %d is below the log start %d (retention "
                "removed offsets %d..%d before they were read); resuming at the log start",
                self.path,
                position,
                log_start,
                position,
                log_start - 1,
            )
            offset.update(skippedFrom=position, skippedTo=log_start)
        return offset

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        from ..restore.ranges import split_range
        from ..storage.state_files import read_meta

        lo, hi = int(start["offset"]), int(end["offset"])
        lo = max(lo, read_meta(self.path).log_start_offset)
        wanted = self.options.num_partitions or os.cpu_count() or 2
        return [
            CompactLogPartition(p.index, p.start, p.end)
            for p in split_range(self.path, lo, hi, wanted)
        ]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from ..arrow.convert import Layout, chunk_columns, to_arrow
        from ..engine.reader import iter_batches
        from .arrow import target_schema

        assert isinstance(partition, CompactLogPartition)
        layout = Layout(target_schema(self.schema), self.options.value_format)
        for columns in chunk_columns(iter_batches(self.path, partition.start, partition.end)):
            yield to_arrow(columns, None, layout)

    def commit(self, end: dict) -> None:
        """Nothing to release: the stream holds no retention (Spark's checkpoint is the
        position). A durable subscriber is the tool for holding ``consumed`` retention."""

    def stop(self) -> None:
        pass


def make_stream_reader(raw: Mapping[str, str], options: ReadOptions, schema: StructType) -> Any:
    """What ``DataSource.streamReader`` returns: the reader, or a :class:`RefusedStream`
    carrying the reason it cannot be made."""
    from ..storage.logdirs import is_partitioned

    try:
        if is_partitioned(os.path.abspath(options.path)):
            raise ConfigError(
                f"{options.path} is a directory of logs: a stream reads one log, so start one "
                "query per partition-<N> log"
            )
        return CompactLogStreamReader(options, parse_stream_options(raw, options), schema)
    except CompactLogError as error:
        return RefusedStream(error)


class RefusedStream(DataSourceStreamReader):
    """A stream that cannot run, raising its reason at the query's first call.

    PySpark 4's stream runner calls ``reader.stop()`` in a ``finally`` around the reader's
    creation, so an error raised by ``streamReader`` itself reaches the user as
    ``UnboundLocalError``; raised from here it is reported as it is (``user_errors.ours``).
    """

    def __init__(self, error: CompactLogError) -> None:
        self.error = error

    @ours
    def initialOffset(self) -> dict:
        raise self.error

    @ours
    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        raise self.error

    @ours
    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        raise self.error

    @ours
    def read(self, partition: InputPartition) -> Iterator[Any]:
        raise self.error

    def stop(self) -> None:
        pass


# -- the CDC recipe: foreachBatch upserts into a Parquet table ------------------------

TABLE_VERSION_PREFIX = "v-"
UPSERT_COLUMNS = ("key", "value", "offset", "timestamp")


def table_versions(table: str) -> list[tuple[int, str]]:
    """``(batch id, directory)`` of the complete versions of an upserted table, oldest
    first (a version is complete once Spark wrote its ``_SUCCESS``)."""
    if not os.path.isdir(table):
        return []
    found = []
    for name in os.listdir(table):
        if name.startswith(TABLE_VERSION_PREFIX):
            directory = os.path.join(table, name)
            if os.path.exists(os.path.join(directory, "_SUCCESS")):
                found.append((int(name[len(TABLE_VERSION_PREFIX) :]), directory))
    return sorted(found)


def current_table(table: str) -> str | None:
    """The directory of the newest complete version (read it with ``spark.read.parquet``)."""
    versions = table_versions(table)
    return versions[-1][1] if versions else None


def upsert_into_parquet(batch: Any, batch_id: int, table: str, *, keep: int = 2) -> str:
    """``foreachBatch`` body: the table at ``table`` becomes every key's latest value.

    Version ``batch_id`` is the newest version *below* ``batch_id`` with this batch's
    changes applied: each key's last record in the batch (highest ``offset``) replaces the
    key's row, a tombstone removes it. Written under ``v-<batch id>`` with ``_SUCCESS`` last
    (Spark's committer), so readers take the newest complete version. Replaying a batch
    after a restart recomputes the same version from the same base, and a replay with
    records compacted away in between gives the same latest values: the recipe is
    idempotent. Older versions beyond ``keep`` are removed."""
    import shutil

    from pyspark.sql import Window
    from pyspark.sql import functions as F

    spark = batch.sparkSession
    newest_first = Window.partitionBy("key").orderBy(F.col("offset").desc())
    changes = (
        batch.withColumn("_rank", F.row_number().over(newest_first))
        .where("_rank = 1")
        .drop("_rank")
    )
    upserts = changes.where(~F.col("deleted")).select(*UPSERT_COLUMNS)
    base = [d for v, d in table_versions(table) if v < batch_id]
    if base:
        kept = spark.read.parquet(base[-1]).join(changes.select("key"), "key", "left_anti")
        result = kept.select(*UPSERT_COLUMNS).unionByName(upserts)
    else:
        result = upserts
    target = os.path.join(table, f"{TABLE_VERSION_PREFIX}{batch_id:012d}")
    result.write.mode("overwrite").parquet(target)
    for _v, directory in table_versions(table)[:-keep]:
        shutil.rmtree(directory, ignore_errors=True)
    return target


__all__ = [
    "CompactLogStreamReader",
    "StreamOptions",
    "current_table",
    "make_stream_reader",
    "parse_stream_options",
    "table_versions",
    "upsert_into_parquet",
]
