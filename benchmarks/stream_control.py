"""The control for the stream benchmark: Spark's own ceiling for a Python streaming source.

``compactlog_control`` is a minimal ``DataSourceStreamReader`` with compactlog's changelog
schema and offsets (``{"offset": N}``, ``maxRecordsPerTrigger`` and ``Trigger.AvailableNow``
honoured the same way) that reads no log at all: each task yields the same pre-built Arrow
batch of :data:`CHUNK_RECORDS` rows (16-byte keys, 100-byte values, exactly the Arrow types
Spark expects) until its offsets are covered. Run under the same trigger and sink as the real
stream, its throughput is what Spark's micro-batch machinery, its Python worker round trip
and its Arrow-to-row conversion allow on this machine; compactlog's figure over it is the
part of the gap that is ours.

Spark pickles a registered data source class with cloudpickle. This module is not
importable on the workers (``benchmarks`` is not installed), so :func:`register_control`
asks cloudpickle to pickle it by value.
"""

from __future__ import annotations

import itertools
import os
import sys
import types
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

CONTROL_NAME = "compactlog_control"
CACHE_MODULE = "_compactlog_control_cache"
CHUNK_RECORDS = 1 << 16  # the batch size compactlog's reader yields (spark/arrow.py)
KEY_BYTES = 16
VALUE_BYTES = 100


class ControlPartition(InputPartition):
    def __init__(self, index: int, start: int, end: int) -> None:
        super().__init__(index)
        self.start = start
        self.end = end


def prebuilt_batch(schema: pa.Schema, rows: int = CHUNK_RECORDS) -> pa.RecordBatch:
    """One batch of ``rows`` changelog rows of the benchmark's shape, in ``schema``'s types."""
    rng = np.random.default_rng(5)
    keys = rng.integers(0, 256, rows * KEY_BYTES, dtype=np.uint8).tobytes()
    values = rng.integers(0, 256, rows * VALUE_BYTES, dtype=np.uint8).tobytes()

    def binary(blob: bytes, width: int) -> pa.Array:
        ends = np.arange(0, (rows + 1) * width, width, dtype=np.int32)
        return pa.Array.from_buffers(
            pa.binary(), rows, [None, pa.py_buffer(ends), pa.py_buffer(blob)]
        )

    columns = {
        "key": binary(keys, KEY_BYTES),
        "value": binary(values, VALUE_BYTES),
        "offset": pa.array(np.arange(rows, dtype=np.int64)),
        "timestamp": pa.array(np.full(rows, 1_700_000_000_000_000, dtype=np.int64)),
        "deleted": pa.array(np.zeros(rows, dtype=bool)),
    }
    arrays = [
        columns[f.name].cast(f.type) if f.name in columns else pa.nulls(rows, f.type)
        for f in schema
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def worker_cache() -> dict[str, Any]:
    """A dict that lives as long as the Python worker process. Spark reuses a worker across
    tasks and micro-batches, so the batch is built once per worker, as a real source's
    set-up would be. It cannot be a global of this module: the module is pickled by value,
    and each task's unpickling gives its functions fresh globals (and a fresh class)."""
    holder = sys.modules.get(CACHE_MODULE)
    if holder is None:
        holder = sys.modules[CACHE_MODULE] = types.ModuleType(CACHE_MODULE)
        holder.cache = {}  # type: ignore[attr-defined]
    return holder.cache  # type: ignore[attr-defined,no-any-return]


class ControlStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets ``0..records`` with admission control, read as slices of one batch."""

    def __init__(
        self, records: int, max_records: int | None, partitions: int, schema: StructType
    ) -> None:
        self.records = records
        self.max_records = max_records
        self.count = partitions
        self.schema = schema
        self.target = records

    def initialOffset(self) -> dict:
        return {"offset": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadAllAvailable() if self.max_records is None else ReadMaxRows(self.max_records)

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self.records

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        end = self.target
        if isinstance(limit, ReadMaxRows):
            end = min(end, int(start["offset"]) + int(limit.max_rows))
        return {"offset": max(end, int(start["offset"]))}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        lo, hi = int(start["offset"]), int(end["offset"])
        bounds = np.linspace(lo, hi, self.count + 1).astype(int).tolist()
        pairs = [(a, b) for a, b in itertools.pairwise(bounds) if b > a]
        return [ControlPartition(i, a, b) for i, (a, b) in enumerate(pairs)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from pyspark.sql.pandas.types import to_arrow_schema

        assert isinstance(partition, ControlPartition)
        cache = worker_cache()
        if "batch" not in cache:
            cache["batch"] = prebuilt_batch(to_arrow_schema(self.schema, timezone="UTC"))
        batch = cache["batch"]
        for at in range(partition.start, partition.end, CHUNK_RECORDS):
            yield batch.slice(0, min(CHUNK_RECORDS, partition.end - at))

    def commit(self, end: dict) -> None:
        pass


class ControlDataSource(DataSource):
    """``spark.readStream.format("compactlog_control").option("records", N)`` (and
    ``maxRecordsPerTrigger``, ``numPartitions`` as compactlog's stream takes them)."""

    @classmethod
    def name(cls) -> str:
        return CONTROL_NAME

    def schema(self) -> str:
        from compactlog.restore.options import parse_options, schema_ddl

        return schema_ddl(parse_options({"path": "-", "mode": "changelog"}))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        lowered = {k.lower(): v for k, v in self.options.items()}
        limit = lowered.get("maxrecordspertrigger")
        partitions = int(lowered.get("numpartitions") or os.cpu_count() or 2)
        return ControlStreamReader(
            int(lowered["records"]), int(limit) if limit else None, partitions, schema
        )


def register_control(spark: Any) -> None:
    """Register ``compactlog_control`` (pickled by value: workers cannot import this)."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(ControlDataSource)


__all__ = ["CONTROL_NAME", "ControlDataSource", "prebuilt_batch", "register_control"]
