"""From Arrow to the log's record batches: encoding straight from Arrow's buffers.

The one encoder of Arrow data, used by ``Log.append_arrow`` and by the Spark writer's
tasks. Columns: ``key`` and ``value`` (``binary`` or ``string``, large or view variants
too; a null value is a tombstone), optional ``timestamp`` (``timestamp`` of any unit, or
integer milliseconds; null means "now") and optional ``headers``
(``map<string, binary|string>``). :func:`check_write_schema` refuses anything else,
naming the column, before a byte is encoded.

Keys and values go from Arrow's offset and data buffers into ``batch_encode.encode_columns``
(no per-record Python object; the batch body is their one copy). Headers are the one
column encoded per record (``format.encode_headers``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..config import LogConfig
from ..encoding.batch_encode import (
    EncodedBatch,
    encode_columns,
    encode_header_column,
    encode_within_segment,
)
from ..encoding.format import CODECS
from ..encoding.serde import decodes, deserializers
from ..errors import ConfigError, InvalidRecordError, RecordTooLargeError
from ..storage.state_files import read_meta

WRITE_COLUMNS = ("key", "value", "timestamp", "headers")
APPEND_RECORDS = 1 << 16  # rows per encoded batch (what append_batch gives a large call)


def _is_bytes_type(type_: pa.DataType) -> bool:
    return (
        pa.types.is_binary(type_)
        or pa.types.is_string(type_)
        or pa.types.is_large_binary(type_)
        or pa.types.is_large_string(type_)
        or pa.types.is_binary_view(type_)
        or pa.types.is_string_view(type_)
        or pa.types.is_null(type_)
    )


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
            raise ConfigError(f"the data has no {required!r} column (binary or string)")
    for field in schema:
        name, type_ = field.name.lower(), field.type
        if name in ("key", "value") and not _is_bytes_type(type_):
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


_PER_MILLISECOND = {"us": 1000, "ns": 1_000_000}


def normalize(batch: pa.RecordBatch | pa.Table) -> Any:
    """``key``/``value`` as binary, ``timestamp`` as int64 ms (sub-millisecond parts cut),
    lower-case column names; a batch stays a batch, a table a table."""
    arrays, names = [], []
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        name = name.lower()
        if name in ("key", "value"):
            column = column.cast(pa.binary())
        elif name == "timestamp":
            unit = column.type.unit if pa.types.is_timestamp(column.type) else "ms"
            column = column.cast(pa.int64())
            if unit == "s":
                column = pc.multiply(column, 1000)
            elif unit in _PER_MILLISECOND:
                column = pc.divide(column, _PER_MILLISECOND[unit])
        arrays.append(column)
        names.append(name)
    return type(batch).from_arrays(arrays, names=names)


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
    key_format: str = "bytes"  # the declared formats (serde.py): what encode_rows checks
    value_format: str = "bytes"

    @property
    def compacted(self) -> bool:
        return "compact" in self.cleanup_policy


def log_encoding(path: str) -> LogEncoding:
    """The encoding settings of the log at ``path`` (which must exist)."""
    return config_encoding(read_meta(path).config)


def config_encoding(config: LogConfig) -> LogEncoding:
    """The encoding settings of a log configuration."""
    return LogEncoding(
        CODECS[config.compression],
        config.compression_level,
        config.cleanup_policy,
        config.max_record_bytes,
        config.segment_bytes,
        config.key_format,
        config.value_format,
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
    ``headers``) as one batch, by ``batch_encode.encode_columns`` (byte for byte what
    ``batch_encode.encode_batch`` makes of the same rows as Python objects; tested). A null or
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


def check_declared(table: pa.Table, encoding: LogEncoding, path: str, first_row: int = 0) -> None:
    """Refuse (:class:`InvalidRecordError` naming the row, counted from ``first_row``) a
    key or value of a normalized ``table`` that the log's declared format would not
    decode: not UTF-8 for ``str``, not one JSON document for ``json``. Every reader of the
    log would otherwise stop at it (``Table``, ``read``, subscribers)."""
    converts = deserializers(encoding.key_format, encoding.value_format)
    for what, convert in zip(("key", "value"), converts, strict=True):
        if convert is None:
            continue
        column = table.column(what)
        if convert is bytes.decode and _utf8(column):
            continue
        items = column.to_pylist()
        if decodes(convert, items):
            continue
        for row, item in enumerate(items):
            try:
                if item is not None:
                    convert(item)
            except ValueError as error:
                declared = getattr(encoding, f"{what}_format")
                raise InvalidRecordError(
                    f"row {first_row + row}: the {what} {item!r:.80} is not {declared} "
                    f"({type(error).__name__}: {error}), and the log declares "
                    f"{what}_format={declared!r}; serialize it first (or declare "
                    f"{what}_format='bytes')",
                    path=path,
                ) from None


def _utf8(column: pa.ChunkedArray) -> bool:
    try:
        column.cast(pa.string())  # (checks UTF-8 in C)
    except pa.ArrowInvalid:
        return False
    return True


def encode_rows(
    table: pa.Table, encoding: LogEncoding, log: str, now_ms: int, *, first_row: int = 0
) -> list[EncodedBatch]:
    """Rows of a normalized table as the batches ``Log.append_batch`` would append for
    them (one, or several cut by ``batch_encode.encode_within_segment`` so segments still roll
    near ``segment_bytes``), refusing in the task what the log would refuse: a null key on
    a compacted log, a negative timestamp, a record over ``max_record_bytes``, a key or
    value its declared format would not decode (:func:`check_declared`; errors count rows
    from ``first_row``)."""
    check_declared(table, encoding, log, first_row)
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

    def encode(lo: int, hi: int) -> EncodedBatch:
        part = table if lo == 0 and hi == table.num_rows else table.slice(lo, hi - lo)
        return encode_table(part, encoding, now_ms)

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


__all__ = [
    "APPEND_RECORDS",
    "WRITE_COLUMNS",
    "LogEncoding",
    "binary_column",
    "check_declared",
    "check_write_schema",
    "config_encoding",
    "encode_rows",
    "encode_table",
    "log_encoding",
    "normalize",
]
