"""From ``batch_decode``'s columnar batches to Arrow record batches, without a row in sight.

A :class:`~compactlog.encoding.batch_decode.RecordBatch` already holds its records as numpy length
columns and byte blobs; Arrow's ``binary`` layout is a validity bitmap, ``int32`` end
offsets and one data buffer. So a chunk of batches becomes Arrow by concatenating the
columns (``batch_decode.concat_columns``: a handful of numpy calls and one ``bytes.join`` per blob;
a large batch is a chunk of its own and is not copied at all) and wrapping the blobs as
Arrow buffers (:func:`binary_array`: a cumulative sum, no copy). The Arrow arrays may so
share a closed segment's mapping (``segment.SegmentReader``): it stays mapped while they
live, and closed segments are never changed in place, only replaced or removed.
Nothing here parses record bytes: headers, the one column stored as per-record blocks,
are decoded by ``format.decode_headers`` (only for records that have headers).

:func:`to_arrow` casts every output column to the exact Arrow type of the schema it is
given: ``Log.read_arrow`` asks for :data:`RECORD_SCHEMA`; the Spark source asks for the
type Spark derives from its read schema (``binary`` not ``large_binary``,
``timestamp[us, tz=UTC]``, field order, nullability), or Spark refuses the batch
(``DATA_SOURCE_RETURN_SCHEMA_MISMATCH``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..encoding.batch_decode import Columns, RecordBatch, concat_columns
from ..encoding.format import decode_headers
from ..errors import ValueDecodeError

METADATA_COLUMNS = ("key", "offset", "timestamp", "headers", "deleted")
RAW_VALUE = "value"
CHUNK_RECORDS = 1 << 16
CHUNK_BYTES = 32 << 20
ALONE_RECORDS = 1 << 12  # a batch this large is a chunk of its own (its blobs not copied)
ALONE_BYTES = 1 << 20
NEWLINE = 10
HEADERS_TYPE = pa.map_(pa.string(), pa.binary())
RECORD_SCHEMA = pa.schema(
    [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
        pa.field("headers", HEADERS_TYPE),
    ]
)


def chunk_columns(batches: Iterable[RecordBatch]) -> Iterator[Columns]:
    """``batches`` as :class:`Columns` of about :data:`CHUNK_RECORDS` records or
    :data:`CHUNK_BYTES` bytes each (the unit converted to one Arrow batch); a batch of
    :data:`ALONE_RECORDS` records or :data:`ALONE_BYTES` bytes is a chunk alone."""
    pending: list[RecordBatch] = []
    records = size = 0
    for batch in batches:
        batch_size = len(batch.keys_blob) + len(batch.values_blob)
        if len(batch) >= ALONE_RECORDS or batch_size >= ALONE_BYTES:
            if pending:
                yield concat_columns(pending)
                pending, records, size = [], 0, 0
            yield concat_columns([batch])
            continue
        pending.append(batch)
        records += len(batch)
        size += batch_size
        if records >= CHUNK_RECORDS or size >= CHUNK_BYTES:
            yield concat_columns(pending)
            pending, records, size = [], 0, 0
    if pending:
        yield concat_columns(pending)


def binary_array(
    blob: bytes | memoryview, lengths: np.ndarray, type_: pa.DataType | None = None
) -> pa.Array:
    """An Arrow ``binary`` (or ``string``) array over ``blob``; length -1 is null. No copy
    of the blob. Equal lengths (fixed-size keys, fixed-layout values) need no running sum:
    the end offsets are a range."""
    n = len(lengths)
    validity = None
    nulls = 0
    width = int(lengths[0]) if n else 0
    if n and width > 0 and int(lengths.min()) == int(lengths.max()):
        ends = np.arange(0, (n + 1) * width, width, dtype=np.int32)
    else:
        ends = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(np.maximum(lengths, 0), out=ends[1:], dtype=np.int32)
        valid = lengths >= 0
        nulls = n - int(np.count_nonzero(valid))
        if nulls:
            validity = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(
        type_ or pa.binary(),
        n,
        [validity, pa.py_buffer(ends), pa.py_buffer(blob)],
        null_count=nulls,
    )


def headers_array(columns: Columns, type_: pa.DataType) -> pa.Array:
    n = len(columns)
    if columns.header_lengths is None or not bool((columns.header_lengths > 0).any()):
        return pa.nulls(n, type=type_)
    blob = bytes(columns.headers_blob or b"")
    ends = np.cumsum(columns.header_lengths, dtype=np.int64).tolist()
    starts = [0, *ends[:-1]]
    items = [
        list(decode_headers(blob[s:e]).items()) if e > s else None
        for s, e in zip(starts, ends, strict=True)
    ]
    return pa.array(items, type=type_)


@dataclass(frozen=True, slots=True)
class Layout:
    """What each output column is: a metadata column, the raw value, or a JSON field.

    ``value_format`` ``json`` makes each non-metadata column a field of the JSON object
    stored as the value (the Spark source's columns); ``json_struct`` makes the ``value``
    column the whole JSON value parsed to its ``struct`` type (``Log.read_arrow``)."""

    schema: pa.Schema
    value_format: str  # binary | string | json | json_struct

    @property
    def json_fields(self) -> list[pa.Field]:
        if self.value_format != "json":
            return []
        return [f for f in self.schema if f.name not in METADATA_COLUMNS]

    def check(self) -> None:
        allowed = set(METADATA_COLUMNS)
        if self.value_format != "json":
            allowed.add(RAW_VALUE)
            unknown = [f.name for f in self.schema if f.name not in allowed]
            if unknown:
                raise ValueDecodeError(
                    f"column(s) {', '.join(unknown)} cannot be produced with "
                    f"valueFormat={self.value_format} (columns: key, value, offset, timestamp, "
                    "headers, deleted; decoded value fields need valueFormat=json)"
                )


def to_arrow(columns: Columns, keep: np.ndarray | None, layout: Layout) -> pa.RecordBatch:
    """The records of ``columns`` where ``keep`` is true, as one Arrow batch of
    ``layout.schema`` exactly."""
    mask = None if keep is None or bool(keep.all()) else pa.array(keep, type=pa.bool_())
    cache: dict[str, pa.Array] = {}

    def filtered(array: pa.Array) -> pa.Array:
        if mask is None:
            return array
        import pyarrow.compute as pc  # here, not at the top: see _parse_json

        return pc.filter(array, mask)

    def raw_values() -> pa.Array:
        if "values" not in cache:
            cache["values"] = filtered(binary_array(columns.values_blob, columns.value_lengths))
        return cache["values"]

    arrays: list[pa.Array] = []
    json_table = None
    for field in layout.schema:
        name, type_ = field.name, field.type
        if name == "key":
            array = filtered(binary_array(columns.keys_blob, columns.key_lengths))
            if pa.types.is_string(type_):
                array = _as_utf8(array, columns, keep, "key")
        elif name == "offset":
            array = filtered(_int64_array(columns.offsets, pa.int64()))
        elif name == "timestamp":
            array = filtered(_int64_array(columns.timestamps, pa.timestamp("ms", tz="UTC")))
        elif name == "headers":
            array = filtered(headers_array(columns, type_))
        elif name == "deleted":
            array = filtered(pa.array(columns.value_lengths < 0, type=pa.bool_()))
        elif layout.value_format == "json_struct":
            array = _json_struct(raw_values(), type_, columns, keep)
        elif layout.value_format != "json":
            array = raw_values()
            if layout.value_format == "string" or pa.types.is_string(type_):
                array = _as_utf8(array, columns, keep)
        else:
            if json_table is None:
                json_table = _parse_json(raw_values(), layout.json_fields, columns, keep)
            array = json_table.column(name)
        arrays.append(_cast(array, type_, name))
    return pa.RecordBatch.from_arrays(arrays, schema=layout.schema)


def _int64_array(values: np.ndarray, type_: pa.DataType) -> pa.Array:
    """``values`` as an Arrow array of a 64-bit type, sharing their memory when they are
    contiguous ``int64`` already (``pa.array`` would copy)."""
    data = np.ascontiguousarray(values, dtype=np.int64)
    return pa.Array.from_buffers(type_, len(data), [None, pa.py_buffer(data)])


def _cast(array: pa.Array, type_: pa.DataType, name: str) -> pa.Array:
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if array.type == type_:
        return array
    try:
        return array.cast(type_)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        raise ValueDecodeError(f"column {name}: cannot produce {type_} ({error})") from None


def _where(columns: Columns, keep: np.ndarray | None) -> str:
    offsets = columns.offsets if keep is None else columns.offsets[keep]
    if not len(offsets):
        return "no records"
    return f"records at offsets {int(offsets[0])}..{int(offsets[-1])}"


def _as_utf8(
    array: pa.Array, columns: Columns, keep: np.ndarray | None, what: str = "value"
) -> pa.Array:
    view = pa.Array.from_buffers(
        pa.string(), len(array), array.buffers(), null_count=array.null_count, offset=array.offset
    )
    try:
        view.validate(full=True)
    except pa.ArrowInvalid:
        raise ValueDecodeError(
            f"{what}Format=string: a {what} is not valid UTF-8 "
            f"({_first_invalid_utf8(array, columns, keep)})"
        ) from None
    return view


def _first_invalid_utf8(array: pa.Array, columns: Columns, keep: np.ndarray | None) -> str:
    """Where the first value of ``array`` that is not UTF-8 is (the error path only)."""
    offsets = columns.offsets if keep is None else columns.offsets[keep]
    for row, item in enumerate(array.to_pylist()):
        if item is None:
            continue
        try:
            item.decode("utf-8")
        except UnicodeDecodeError:
            return f"the record at offset {int(offsets[row])}"
    return _where(columns, keep)


def _json_struct(
    values: pa.Array, type_: pa.DataType, columns: Columns, keep: np.ndarray | None
) -> pa.Array:
    """Each JSON object of ``values`` as a row of the ``struct`` ``type_`` (fields it lacks
    are null; fields it has beyond the type are ignored); a null value is a null row."""
    if not pa.types.is_struct(type_):
        raise ValueDecodeError(f"a JSON value is read as a struct type, not {type_}")
    fields = [type_.field(i) for i in range(type_.num_fields)]
    table = _parse_json(values, fields, columns, keep)
    mask = values.is_null() if values.null_count else None
    arrays = [_cast(table.column(f.name), f.type, f.name) for f in fields]
    return pa.StructArray.from_arrays(arrays, fields=fields, mask=mask)


def _parse_json(
    values: pa.Array, fields: list[pa.Field], columns: Columns, keep: np.ndarray | None
) -> pa.Table:
    """Parse the non-null values as newline-delimited JSON into ``fields``; rows
    whose value is null (tombstones) get null fields. One C++ parse per chunk.

    ``pyarrow.json`` and ``pyarrow.compute`` are imported where they are used: Spark starts
    fresh Python processes for each streaming query (its offset runner and its planner),
    which import this module for the schema check alone, and the two cost more to import
    than the rest of it."""
    import pyarrow.json as pa_json

    n = len(values)
    valid = values.is_valid().to_numpy(zero_copy_only=False)
    present = values.drop_null() if values.null_count else values
    k = len(present)
    schema = pa.schema([pa.field(f.name, f.type, nullable=True) for f in fields])
    if k == 0:
        table = pa.table({f.name: pa.nulls(0, f.type) for f in fields}, schema=schema)
    else:
        ends = np.frombuffer(present.buffers()[1], dtype=np.int32)[
            present.offset : present.offset + k + 1
        ]
        data = np.frombuffer(present.buffers()[2], dtype=np.uint8)[ends[0] : ends[-1]]
        sizes = np.diff(ends)
        if bool((sizes == 0).any()):
            raise ValueDecodeError(
                f"valueFormat=json: an empty value is not JSON ({_where(columns, keep)})"
            )
        multiline = bool((data == NEWLINE).any())
        text = np.insert(data, (ends[1:] - ends[0]).astype(np.int64), NEWLINE)
        try:
            table = pa_json.read_json(
                pa.BufferReader(pa.py_buffer(text)),
                read_options=pa_json.ReadOptions(
                    use_threads=False, block_size=max(len(text) + 1, 1 << 20)
                ),
                parse_options=pa_json.ParseOptions(
                    explicit_schema=schema,
                    unexpected_field_behavior="ignore",
                    newlines_in_values=multiline,
                ),
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
            raise ValueDecodeError(f"valueFormat=json: {error} ({_where(columns, keep)})") from None
        if table.num_rows != k:
            raise ValueDecodeError(
                f"valueFormat=json: {k} values gave {table.num_rows} JSON rows; every value "
                f"must be one JSON object ({_where(columns, keep)})"
            )
    if k == n:
        return table
    index = np.cumsum(valid, dtype=np.int64) - 1
    return table.take(pa.array(index, mask=~valid))


__all__ = [
    "CHUNK_BYTES",
    "CHUNK_RECORDS",
    "HEADERS_TYPE",
    "METADATA_COLUMNS",
    "RECORD_SCHEMA",
    "Layout",
    "ValueDecodeError",
    "binary_array",
    "chunk_columns",
    "to_arrow",
]
