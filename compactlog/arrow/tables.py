"""A log's records as ``pyarrow.Table`` objects, and Arrow data appended to a log.

What :meth:`Log.append_arrow <compactlog.log.Log.append_arrow>`,
:meth:`~compactlog.log.Log.read_arrow` and :meth:`~compactlog.log.Log.latest_arrow` run.
Both directions are columnar end to end: appending encodes Arrow's buffers with
:mod:`~compactlog.arrow.encode` (the Spark writer's encoder), reading wraps the decoded
batches' columns as Arrow arrays with :mod:`~compactlog.arrow.convert` (the Spark
source's conversion). No Python object is made per record, except for headers.

Formats. Reads give the log's declared ``key_format``/``value_format`` their Arrow type
(:func:`record_schema`): ``bytes`` is ``binary``, ``str`` is ``string``, ``json`` is
``string`` (the JSON text) or, given a ``struct`` ``value_type``, each value parsed into
it. Appends refuse, naming the row, a key or value its declared format could not decode
(:func:`~compactlog.arrow.encode.check_declared`): what a reader would otherwise stop at.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from ..encoding.batch_decode import RecordBatch
from ..errors import InvalidRecordError
from .convert import RECORD_SCHEMA, Layout, chunk_columns, to_arrow
from .encode import APPEND_RECORDS, check_write_schema, config_encoding, encode_rows, normalize

if TYPE_CHECKING:
    from ..engine.logview import LogView


def append_arrow(log: LogView, data: pa.RecordBatch | pa.Table) -> range:
    """Append the rows of ``data`` in order, all or nothing; returns their offsets."""
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    elif not isinstance(data, pa.Table):
        raise InvalidRecordError(
            f"append_arrow takes a pyarrow.Table or pyarrow.RecordBatch, not "
            f"{type(data).__name__} (pandas: pyarrow.Table.from_pandas(df); polars: "
            "df.to_arrow())"
        )
    check_write_schema(data.schema)
    table = normalize(data)
    encoding = config_encoding(log.config)
    now = log.clock()
    batches = []
    for start in range(0, table.num_rows, APPEND_RECORDS):
        rows = table.slice(start, APPEND_RECORDS)
        batches.extend(encode_rows(rows, encoding, log.directory, now, first_row=start))
    return log.append_encoded(batches)


def record_schema(
    key_format: str = "bytes", value_format: str = "bytes", value_type: Any = None
) -> pa.Schema:
    """:data:`~compactlog.arrow.convert.RECORD_SCHEMA` with the key and value columns of
    the declared formats: ``binary`` for bytes, ``string`` for str and json, or
    ``value_type`` (a ``struct``, the JSON values parsed) for a json value."""
    types = {"bytes": pa.binary(), "str": pa.string(), "json": pa.string()}
    value = types[value_format]
    if value_type is not None:
        if value_format != "json" or not pa.types.is_struct(value_type):
            raise InvalidRecordError(
                f"value_type is a pyarrow struct type for a log of JSON values "
                f"(value_format='json'), not {value_type} on value_format={value_format!r}"
            )
        value = value_type
    schema = RECORD_SCHEMA.set(0, pa.field("key", types[key_format]))
    return schema.set(1, pa.field("value", value))


def arrow_table(
    batches: Iterable[RecordBatch],
    key_format: str = "bytes",
    value_format: str = "bytes",
    value_type: Any = None,
) -> pa.Table:
    """``batches`` as one table of :func:`record_schema` (``RECORD_SCHEMA`` for bytes)."""
    schema = record_schema(key_format, value_format, value_type)
    layout = Layout(schema, "json_struct" if value_type is not None else "binary")
    chunks = [to_arrow(columns, None, layout) for columns in chunk_columns(batches)]
    return pa.Table.from_batches(chunks, schema=schema)


__all__ = ["append_arrow", "arrow_table", "record_schema"]
