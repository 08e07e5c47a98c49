"""The Arrow restore engine: the table Spark's engine writes, from one process, no JVM.

It reads a snapshot exactly as the Spark source's tasks do (``plan.plan_read``, then each
partition's chunks through ``plan.read_partition`` and ``convert.to_arrow``, with the
source's default schema: ``options.schema_ddl`` through ``ddl.arrow_schema``), so both
engines keep the same rows and give them the same columns and types. It writes one file,
``part-00000.<format>``: Parquet (snappy, as Spark), ORC (zstd, as Spark) or CSV, which
takes the conversion Spark's engine makes for CSV (``restore._csv_ready``): binary columns
as base64, headers as JSON text of base64 values, timestamps as
``yyyy-MM-ddTHH:mm:ss.SSSZ`` in UTC, no header line. pyarrow writes no JSON: that format
needs the Spark engine.
"""

from __future__ import annotations

import base64
import json
import os
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..arrow.convert import Layout, to_arrow
from ..errors import ConfigError
from .ddl import arrow_schema
from .options import ReadOptions, schema_ddl
from .plan import plan_read, read_partition
from .progress import OffsetMeter, RestoreCallback, logger

ARROW_FORMATS = ("parquet", "orc", "csv")
PART_FILE = "part-00000"
_ALPHABET = np.frombuffer(
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", dtype=np.uint8
)
_PAD = ord("=")


def check_arrow_format(format: str) -> None:
    if format not in ARROW_FORMATS:
        raise ConfigError(
            f"the Arrow engine writes {', '.join(ARROW_FORMATS)}, not {format} (pyarrow has no "
            f"{format} writer): use engine='spark' (--engine spark)"
        )


def restore_schema(value_format: str, value_schema: str | None) -> pa.Schema:
    """The Arrow schema of the table Spark's engine writes for these value options."""
    options = ReadOptions(path="-", value_format=value_format, value_schema=value_schema)
    return arrow_schema(schema_ddl(options))


def write_arrow_table(
    read: ReadOptions, directory: str, format: str, progress: RestoreCallback | None = None
) -> int:
    """Write the latest state of the snapshot ``read.path``, read with ``read``, into
    ``directory`` (which it creates); returns the rows written. ``progress`` gets the
    ``"write"`` phase's events (:mod:`compactlog.restore.progress`)."""
    check_arrow_format(format)
    schema = restore_schema(read.value_format, read.value_schema)
    layout = Layout(schema, read.value_format)
    layout.check()
    started = time.monotonic()
    plan = plan_read(read)
    logger.info(
        "restore: planned offsets %d to %d in %d partitions (%d keys in the dirty section), %.1f s",
        plan.start,
        plan.end,
        len(plan.partitions),
        plan.dirty_keys,
        time.monotonic() - started,
    )
    os.makedirs(directory)
    path = os.path.join(directory, f"{PART_FILE}.{format}")
    writer = _open_writer(format, path, csv_schema(schema) if format == "csv" else schema)
    meter = OffsetMeter(progress, "write", sum(p.end - p.start for p in plan.partitions))
    rows = 0
    try:
        for partition in plan.partitions:
            covered = partition.start
            for columns, keep in read_partition(plan, partition):
                batch = to_arrow(columns, keep, layout)
                if format == "csv":
                    writer.write(csv_ready(batch))
                else:  # the ORC writer takes tables only
                    writer.write(pa.Table.from_batches([batch]))
                rows += batch.num_rows
                last = int(columns.offsets[-1]) + 1
                meter.add(last - covered)
                covered = last
            meter.add(partition.end - covered)
        if not rows and format == "orc":  # an ORC file's schema comes with its first write
            writer.write(schema.empty_table())
    finally:
        writer.close()
    meter.finish()
    logger.info("restore: wrote %d rows to %s", rows, path)
    return rows


def _open_writer(format: str, path: str, schema: pa.Schema) -> Any:
    if format == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetWriter(path, schema, compression="snappy")
    if format == "orc":
        import pyarrow.orc as orc

        return orc.ORCWriter(path, compression="zstd")
    import pyarrow.csv as csv

    return csv.CSVWriter(path, schema, write_options=csv.WriteOptions(include_header=False))


def csv_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` as :func:`csv_ready` makes it: binary, map and timestamp columns as text."""
    return pa.schema(
        [
            pa.field(f.name, pa.string())
            if pa.types.is_binary(f.type)
            or pa.types.is_map(f.type)
            or pa.types.is_timestamp(f.type)
            else f
            for f in schema
        ]
    )


def csv_ready(batch: pa.RecordBatch) -> pa.RecordBatch:
    """What ``restore._csv_ready`` does in Spark, column by column, with Arrow."""
    arrays = []
    for field, array in zip(batch.schema, batch.columns, strict=True):
        if pa.types.is_binary(field.type):
            array = base64_array(array)
        elif pa.types.is_map(field.type):
            array = _headers_json(array)
        elif pa.types.is_timestamp(field.type):
            millis = array.cast(pa.timestamp("ms", tz="UTC"))
            array = pc.strftime(millis, format="%Y-%m-%dT%H:%M:%SZ")
        arrays.append(array)
    return pa.RecordBatch.from_arrays(arrays, schema=csv_schema(batch.schema))


def base64_array(array: pa.Array) -> pa.Array:
    """Each value of a ``binary`` array in base64 (RFC 4648, padded), as ``string``; nulls
    stay null. Vectorized: every value is zero-padded to whole 3-byte groups in one
    buffer, each group becomes four alphabet bytes, then the padding becomes ``=``."""
    n = len(array)
    array = array.cast(pa.binary())
    _validity, offsets_buffer, data_buffer = array.buffers()
    ends = np.frombuffer(offsets_buffer, dtype=np.int32, count=n + 1, offset=4 * array.offset)
    lengths = np.diff(ends).astype(np.int64)
    groups = (lengths + 2) // 3
    padded_starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(groups * 3, out=padded_starts[1:])
    padded = np.zeros(int(padded_starts[-1]), dtype=np.uint8)
    total = int(lengths.sum())
    if total:
        data = np.frombuffer(data_buffer, dtype=np.uint8, count=int(ends[-1]))[ends[0] :]
        shift = np.repeat(padded_starts[:-1] - (ends[:-1] - ends[0]), lengths)
        padded[np.arange(total, dtype=np.int64) + shift] = data
    triples = padded.reshape(-1, 3).astype(np.uint32)
    word = (triples[:, 0] << 16) | (triples[:, 1] << 8) | triples[:, 2]
    sextets = np.stack([(word >> s) & 63 for s in (18, 12, 6, 0)], axis=1)
    text = _ALPHABET[sextets].reshape(-1)
    out_ends = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(groups * 4, out=out_ends[1:])
    short = (3 - lengths % 3) % 3  # bytes of padding in each value's last group
    text[out_ends[1:][short >= 1] - 1] = _PAD
    text[out_ends[1:][short == 2] - 2] = _PAD
    nulls = array.null_count
    validity = None
    if nulls:
        valid = array.is_valid().to_numpy(zero_copy_only=False)
        validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
    buffers = [validity, pa.py_buffer(out_ends.astype(np.int32)), pa.py_buffer(text)]
    return pa.Array.from_buffers(pa.string(), n, buffers, null_count=nulls)


def _headers_json(array: pa.Array) -> pa.Array:
    """``map<string, binary>`` as Spark's ``to_json`` of base64 values (nulls stay null)."""
    items = [
        None
        if entries is None
        else json.dumps(
            {k: base64.b64encode(v).decode("ascii") for k, v in entries},
            separators=(",", ":"),
            ensure_ascii=False,
        )
        for entries in array.to_pylist()
    ]
    return pa.array(items, type=pa.string())


__all__ = [
    "ARROW_FORMATS",
    "base64_array",
    "check_arrow_format",
    "csv_ready",
    "restore_schema",
    "write_arrow_table",
]
